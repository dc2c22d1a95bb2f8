"""A predicted sample's confidences in AlphaFold 3's output format (its docs/output.md):

- `<name>_summary_confidences.json`: ptm, iptm, ranking_score, fraction_disordered, has_clash,
  chain_ptm, chain_iptm, chain_pair_iptm, chain_pair_pae_min, chain_ids;
- `<name>_confidences.json`: atom_plddts and atom_chain_ids (in the mmCIF's atom order), pae
  [N_tok x N_tok], contact_probs [N_tok x N_tok], token_chain_ids, token_res_ids.

Numbers are rounded to 2 decimals and NaN (ipTM of one chain) written as null, as AlphaFold 3
writes them. Chain ids are the mmCIF's label_asym_id of each record chain.
"""

from __future__ import annotations

import json
import math
import pathlib
from dataclasses import dataclass

import gemmi
import numpy as np
import torch

from featurecache.model.objectives.confidence_metrics import confidence_summary, contact_probabilities, plddt
from featurecache.prediction.mmcif import ResidueInstance, asym_ids, written_order
from featurecache.prediction.ranking import fraction_disordered, has_clash, ranking_score
from featurecache.store.files import write_text_atomic


@dataclass(frozen=True)
class SampleConfidence:
    atom_plddt: np.ndarray  # [A] 0-100, in the sample's atom order (the mmCIF's B-factors)
    ranking_score: float
    summary: dict
    full: dict


@dataclass(frozen=True)
class StructureLabels:
    """Per-atom labels of a sample in the mmCIF's atom order (`order`), for the JSON files and
    the clash and disorder checks."""

    order: np.ndarray
    chain: list[str]
    residue: np.ndarray  # residue number within its chain
    instance: np.ndarray  # residue instance number (unique per residue of the sample)
    residue_name: list[str]
    atom_name: list[str]
    element: list[str]
    polymer: np.ndarray
    protein: np.ndarray


def structure_labels(
    arrays: dict[str, np.ndarray], instances: list[ResidueInstance], chain_ids: list[str], atom_names: list[str]
) -> StructureLabels:
    """chain_ids: the record's chains (meta["chain_ids"])."""
    labels = asym_ids(chain_ids)[0]
    instances = written_order(instances, chain_ids)
    order = np.concatenate([instance.atoms for instance in instances]).astype(np.int64)
    counts = [len(instance.atoms) for instance in instances]

    def per_atom(values):
        return [value for value, count in zip(values, counts) for _ in range(count)]

    polymer = np.array(per_atom([instance.is_polymer for instance in instances]), dtype=bool)
    return StructureLabels(
        order=order,
        chain=per_atom([labels[instance.chain] for instance in instances]),
        residue=np.array(per_atom([instance.seq_id for instance in instances])),
        instance=np.array(per_atom(range(len(instances)))),
        residue_name=per_atom([instance.name for instance in instances]),
        atom_name=[atom_names[index] for index in order],
        element=[gemmi.Element(int(arrays["ref_element"][index])).name for index in order],
        polymer=polymer,
        protein=polymer & arrays["is_protein"][arrays["atom_to_token"][order]].astype(bool),
    )


def sample_confidence(
    outputs: dict,
    sample: int,
    positions: np.ndarray,
    arrays: dict[str, np.ndarray],
    structure: StructureLabels,
    labels: list[str],
    distogram_range: tuple[float, float],
) -> SampleConfidence:
    """Confidences of structure `sample` of model.sample's outputs (batch row 0, unpadded)."""
    num_tokens, num_atoms = len(arrays["restype"]), len(arrays["atom_to_token"])
    asym_id = torch.as_tensor(arrays["asym_id"]).long()
    frame_mask = torch.as_tensor((arrays["frame_atom_index"] >= 0).all(-1))
    summary = confidence_summary(
        outputs["pae_logits"][0, sample, :num_tokens, :num_tokens].float(), asym_id, frame_mask
    )
    atom_plddt = plddt(outputs["plddt_logits"][0, sample, :num_atoms].float()).numpy()
    contacts = contact_probabilities(
        outputs["distogram_logits"][0, :num_tokens, :num_tokens].float(), *distogram_range
    ).numpy()
    placed = positions[structure.order]
    chain_numbers = np.unique(structure.chain, return_inverse=True)[1]
    clash = has_clash(placed, chain_numbers, structure.residue, structure.polymer)
    disorder = fraction_disordered(
        placed,
        structure.atom_name,
        structure.element,
        chain_numbers,
        structure.instance,
        structure.residue_name,
        structure.protein,
    )
    score = ranking_score(summary["ptm"], summary["iptm"], disorder, clash)
    chain_ids = [labels[int(value) - 1] for value in torch.unique(asym_id)]
    token_chain_ids = [labels[int(value) - 1] for value in asym_id]
    return SampleConfidence(
        atom_plddt=atom_plddt,
        ranking_score=score,
        summary={
            "chain_ids": chain_ids,
            "chain_iptm": summary["chain_iptm"].tolist(),
            "chain_pair_iptm": summary["chain_pair_iptm"].tolist(),
            "chain_pair_pae_min": summary["chain_pair_pae_min"].tolist(),
            "chain_ptm": summary["chain_ptm"].tolist(),
            "fraction_disordered": disorder,
            "has_clash": float(clash),
            "iptm": summary["iptm"],
            "ptm": summary["ptm"],
            "ranking_score": score,
        },
        full={
            "atom_chain_ids": structure.chain,
            "atom_plddts": np.asarray(atom_plddt[structure.order]),
            "contact_probs": np.asarray(contacts),
            "pae": np.asarray(summary["pae"]),
            "token_chain_ids": token_chain_ids,
            "token_res_ids": [int(value) for value in arrays["residue_index"]],
        },
    )


def _rounded(value):
    """Floats to 2 decimals and NaN to None, through lists, dicts and numpy arrays (the token-pair
    matrices: rounded as arrays, a million values a second faster than one by one)."""
    if isinstance(value, np.ndarray):
        if not np.issubdtype(value.dtype, np.floating):
            return value.tolist()
        rounded = np.round(value.astype(np.float64), 2)
        missing = np.isnan(rounded)
        if missing.any():
            rounded = rounded.astype(object)
            rounded[missing] = None
        return rounded.tolist()
    if isinstance(value, dict):
        return {key: _rounded(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_rounded(item) for item in value]
    if isinstance(value, float):
        return None if math.isnan(value) else round(value, 2)
    return value


def write_json(path: pathlib.Path, content: dict, indent: int | None = None) -> None:
    """Write content as AlphaFold 3 does (sorted keys, 2 decimals, null for NaN), atomically."""
    text = json.dumps(
        _rounded(content), sort_keys=True, indent=indent, separators=(",", ": ") if indent else (",", ":")
    )
    write_text_atomic(path, text)
