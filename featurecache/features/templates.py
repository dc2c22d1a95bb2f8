"""Template features from template hits and a folder of template mmCIF files.

Hits are given per chain with query indices in chain residue positions (see
`io.alignments.AlignmentIndex`). For each protein chain, hits are taken in file order (at most
`max_template_hits` considered) and kept when, as in AlphaFold:

- the template was released before the target (minus `template_max_release_gap_days`);
- the hit covers at least `min_template_align_ratio` of the chain;
- the hit is not a near-copy of the query: a template sequence that is a substring of the chain
  sequence and longer than `max_template_subsequence_ratio` of it is dropped;
- its structure is in the template folder (``<pdb id>.cif`` or ``.cif.gz``, any case) and its
  residues agree with the hit (the HHR hit sequence is located in the template chain when the
  numbering differs); hits without a structure are listed in the metadata.

Up to `max_templates` per chain are featurized. Templates are per chain, as in AF-Multimer: row
t holds the t-th template of every chain in that chain's columns; everything else is GAP / 0.
"""

from __future__ import annotations

import datetime
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from featurecache.config import FeatureConfig
from featurecache import schema
from featurecache.features.tokenize import Tokens, residue_class
from featurecache.io.alignments import map_query_to_chain
from featurecache.io.common import ParseError
from featurecache.io.hits import TemplateHit
from featurecache.io.mmcif import Chain, Structure, read_mmcif

_BACKBONE = ("N", "CA", "C")


@dataclass
class TemplateReport:
    """What happened to the hits; goes into the record's metadata."""

    used: list[str] = field(default_factory=list)  # "<chain>:<hit name>"
    without_coordinates: list[str] = field(default_factory=list)  # hit names
    rejected: dict[str, int] = field(default_factory=dict)  # reason -> count


@dataclass(frozen=True)
class _Selected:
    hit: TemplateHit
    chain: Chain  # the template chain
    hit_positions: np.ndarray  # template residue index per aligned pair
    query_positions: np.ndarray  # target chain residue index per aligned pair


class TemplateStore:
    """Template structures from a folder, parsed once each."""

    def __init__(self, folder: str | os.PathLike | None):
        self.folder = Path(folder) if folder is not None else None
        self._cache: dict[str, Structure | None] = {}
        self._files: dict[str, Path] = {}
        if self.folder is not None:
            if not self.folder.is_dir():
                raise ValueError(f"template folder {self.folder} does not exist or is not a folder")
            for path in self.folder.iterdir():
                name = path.name.lower()
                for suffix in (".cif.gz", ".cif"):
                    if name.endswith(suffix):
                        self._files.setdefault(name[: -len(suffix)], path)

    def get(self, pdb_id: str) -> Structure | None:
        pdb_id = pdb_id.lower()
        if pdb_id not in self._cache:
            path = self._files.get(pdb_id)
            self._cache[pdb_id] = read_mmcif(path) if path is not None else None
        return self._cache[pdb_id]


def _find_chain(structure: Structure, chain_id: str) -> Chain | None:
    for chain in structure.chains:
        if chain.is_polymer and chain.auth_chain_id == chain_id:
            return chain
    for chain in structure.chains:
        if chain.is_polymer and chain.chain_id == chain_id:
            return chain
    return None


def _released_before(template_date: str | None, target_date: str | None, gap_days: int) -> bool:
    if template_date is None or target_date is None:
        return True
    cutoff = datetime.date.fromisoformat(target_date) - datetime.timedelta(days=gap_days)
    return datetime.date.fromisoformat(template_date) < cutoff


def select_templates(
    chain: Chain,
    hits: list[TemplateHit],
    store: TemplateStore,
    config: FeatureConfig,
    target_release_date: str | None,
    report: TemplateReport,
) -> list[_Selected]:
    """Filter and align one chain's hits; at most `config.max_templates` survive."""
    sequence = chain.sequence
    selected: list[_Selected] = []
    seen: set[str] = set()

    def reject(reason: str) -> None:
        report.rejected[reason] = report.rejected.get(reason, 0) + 1

    for hit in hits[: config.max_template_hits]:
        if len(selected) >= config.max_templates:
            break
        if hit.name in seen:
            reject("duplicate hit")
            continue
        seen.add(hit.name)
        if hit.aligned_cols / max(len(sequence), 1) < config.min_template_align_ratio:
            reject("align ratio below minimum")
            continue
        try:
            template = store.get(hit.pdb_id)
        except (ParseError, OSError) as error:
            reject(f"unreadable template structure: {error}")
            continue
        if template is None:
            report.without_coordinates.append(hit.name)
            continue
        if not _released_before(template.release_date, target_release_date, config.template_max_release_gap_days):
            reject("released after the target")
            continue
        template_chain = _find_chain(template, hit.chain_id)
        if template_chain is None:
            reject("chain not in template structure")
            continue
        hit_positions = _template_positions(hit, template_chain)
        if hit_positions is None:
            reject("template sequence does not match the hit")
            continue
        template_sequence = hit.hit_sequence or template_chain.sequence[hit.hit_start - 1 : hit.hit_end]
        if template_sequence and template_sequence in sequence and (
            len(template_sequence) / max(len(sequence), 1) > config.max_template_subsequence_ratio
        ):
            reject("near-identical subsequence of the query")
            continue
        in_range = (hit.query_indices >= 0) & (hit.query_indices < len(chain.residues))
        selected.append(_Selected(hit, template_chain, hit_positions[in_range], hit.query_indices[in_range]))
        report.used.append(f"{chain.chain_id}:{hit.name}")
    return selected


def _template_positions(hit: TemplateHit, template_chain: Chain) -> np.ndarray | None:
    """Template residue index of every aligned pair, checked against the hit sequence if any."""
    length = len(template_chain.residues)
    positions = hit.hit_indices.astype(np.int64)
    if not hit.hit_sequence:
        return positions if positions.size and positions.max() < length else None
    sequence = template_chain.sequence
    start = hit.hit_start - 1
    if sequence[start : start + len(hit.hit_sequence)] == hit.hit_sequence and positions.max() < length:
        return positions
    # Numbering differs (e.g. database sequence vs. SEQRES): place the hit sequence in the chain.
    mapping = map_query_to_chain(hit.hit_sequence, sequence)
    if mapping is None:
        return None
    shifted = mapping.chain_positions[positions - start]
    return shifted if (shifted >= 0).all() else None


def build_template_features(
    structure: Structure,
    tokens: Tokens,
    chain_template_hits: dict[str, list[TemplateHit]],
    config: FeatureConfig,
    template_dir: str | os.PathLike | None,
    report: TemplateReport,
) -> dict[str, np.ndarray]:
    store = TemplateStore(template_dir) if template_dir is not None else None
    per_chain: dict[int, list[_Selected]] = {}
    for chain_index, chain in enumerate(structure.chains):
        hits = chain_template_hits.get(chain.chain_id) or []
        if chain.molecule_type != "protein" or not hits:
            continue
        if store is None:
            report.without_coordinates.extend(hit.name for hit in hits[: config.max_template_hits])
            continue
        per_chain[chain_index] = select_templates(chain, hits, store, config, structure.release_date, report)
    # Homomer copies share their hits: name each missing structure once.
    report.without_coordinates[:] = list(dict.fromkeys(report.without_coordinates))

    count = max((len(selected) for selected in per_chain.values()), default=0)
    size = tokens.num_tokens
    restype = np.full((count, size), schema.GAP, dtype=np.int8)
    backbone_pos = np.zeros((count, size, 3, 3), dtype=np.float32)
    backbone_mask = np.zeros((count, size, 3), dtype=bool)
    pseudo_beta_pos = np.zeros((count, size, 3), dtype=np.float32)
    pseudo_beta_mask = np.zeros((count, size), dtype=bool)
    for chain_index, selected in per_chain.items():
        chain_tokens = np.flatnonzero(tokens.token_chain == chain_index)
        token_residues = tokens.token_residue[chain_tokens]
        for row, template in enumerate(selected):
            residue_features = _template_residues(template, len(structure.chains[chain_index].residues))
            classes, bb_pos, bb_mask, cb_pos, cb_mask = residue_features
            restype[row, chain_tokens] = classes[token_residues]
            backbone_pos[row, chain_tokens] = bb_pos[token_residues]
            backbone_mask[row, chain_tokens] = bb_mask[token_residues]
            pseudo_beta_pos[row, chain_tokens] = cb_pos[token_residues]
            pseudo_beta_mask[row, chain_tokens] = cb_mask[token_residues]
    return {
        "template_restype": restype,
        "template_backbone_pos": backbone_pos,
        "template_backbone_mask": backbone_mask,
        "template_pseudo_beta_pos": pseudo_beta_pos,
        "template_pseudo_beta_mask": pseudo_beta_mask,
    }


def _template_residues(template: _Selected, chain_length: int):
    """Per target-residue template features of one template ([chain_length, ...] arrays)."""
    classes = np.full(chain_length, schema.GAP, dtype=np.int8)
    backbone_pos = np.zeros((chain_length, 3, 3), dtype=np.float32)
    backbone_mask = np.zeros((chain_length, 3), dtype=bool)
    cb_pos = np.zeros((chain_length, 3), dtype=np.float32)
    cb_mask = np.zeros(chain_length, dtype=bool)
    residues = template.chain.residues
    for query_position, hit_position in zip(template.query_positions, template.hit_positions):
        residue = residues[hit_position]
        classes[query_position] = residue_class(residue.parent, "protein")
        atoms = {name: index for index, name in enumerate(residue.atom_names)}
        for slot, name in enumerate(_BACKBONE):
            index = atoms.get(name)
            if index is not None and residue.occupancies[index] > 0:
                backbone_pos[query_position, slot] = residue.positions[index]
                backbone_mask[query_position, slot] = True
        beta = "CA" if residue.parent == "GLY" else "CB"
        index = atoms.get(beta)
        if index is not None and residue.occupancies[index] > 0:
            cb_pos[query_position] = residue.positions[index]
            cb_mask[query_position] = True
    return classes, backbone_pos, backbone_mask, cb_pos, cb_mask
