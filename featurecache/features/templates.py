"""Template features: the hits a record stores (precompute) and the ones a sample uses (loader).

Hits are given per chain with query indices in chain residue positions (see
`io.alignments.AlignmentIndex`). For each protein chain, hits are examined in file order (best
first; at most `max_template_hits`) and kept, as in AlphaFold 3 (SI 2.4), when:

- the template was released at least `template_release_gap_days` (60) before the target; a
  target without a release date is not filtered by date, and its record says so in a warning;
- the hit covers at least `min_template_align_ratio` of the chain and has at least
  `min_template_hit_length` template residues;
- the hit is not a near-copy of the query: a template sequence that is a substring of the chain
  sequence and longer than `max_template_subsequence_ratio` of it is dropped;
- its structure is in the template folder (``<pdb id>.cif`` or ``.cif.gz``, any case), its
  residues agree with the hit (the HHR hit sequence is located in the template chain when the
  numbering differs) and at least one aligned residue is resolved; hits without a structure
  are listed in the metadata;
- with `deduplicate_templates`, it places residues on the query that no earlier kept hit placed
  (homomer copies in one entry are one template, not several).

Up to `max_templates_stored` (20) hits per chain are stored. Layout (as AF-Multimer and AF3
stack per-chain templates): row t of the template axis holds the t-th kept hit of every chain in
that chain's token columns, GAP / 0 elsewhere; ``template_count`` gives, per token, how many rows
hold hits of its chain (rows 0..count-1). The loader's `sample_templates` then draws, per chain,
up to `SampleConfig.max_templates` (4) of them at random (training) or takes the first ones
(inference).
"""

from __future__ import annotations

import datetime
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from featurecache.config import FeatureConfig
from featurecache import schema
from featurecache.io.alignments import map_query_to_chain
from featurecache.io.common import ParseError
from featurecache.io.hits import TemplateHit
from featurecache.io.mmcif import Chain, Structure, read_mmcif

if TYPE_CHECKING:
    from featurecache.features.tokenize import Tokens

_BACKBONE = ("N", "CA", "C")


@dataclass
class TemplateReport:
    """What happened to the hits; goes into the record's metadata."""

    used: list[str] = field(default_factory=list)  # "<chain>:<hit name>"
    release_dates: list[str | None] = field(default_factory=list)  # each used template's (ISO), as `used`
    without_coordinates: list[str] = field(default_factory=list)  # hit names
    rejected: dict[str, int] = field(default_factory=dict)  # reason -> count
    warnings: list[str] = field(default_factory=list)  # for the record's warnings


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

    def path(self, pdb_id: str) -> Path | None:
        """The file of a template structure, or None when the folder has none."""
        return self._files.get(pdb_id.lower())

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


def _released_in_time(template_date: str | None, target_date: str | None, gap_days: int) -> bool:
    """AF3's rule: a template released more recently than the target's date minus the gap is
    dropped. Without both dates there is nothing to compare (the caller warns about the target)."""
    if template_date is None or target_date is None:
        return True
    cutoff = datetime.date.fromisoformat(target_date) - datetime.timedelta(days=gap_days)
    return datetime.date.fromisoformat(template_date) <= cutoff


def select_templates(
    chain: Chain,
    hits: list[TemplateHit],
    store: TemplateStore,
    config: FeatureConfig,
    target_release_date: str | None,
    report: TemplateReport,
) -> list[_Selected]:
    """Filter and align one chain's hits; at most `config.max_templates_stored` survive."""
    sequence = chain.sequence
    selected: list[_Selected] = []
    seen: set[str] = set()
    placed: set[tuple] = set()  # residues each kept hit puts on the query, for deduplication

    def reject(reason: str) -> None:
        report.rejected[reason] = report.rejected.get(reason, 0) + 1

    for hit in hits[: config.max_template_hits]:
        if len(selected) >= config.max_templates_stored:
            break
        if hit.name in seen:
            reject("duplicate hit")
            continue
        seen.add(hit.name)
        if hit.aligned_cols / max(len(sequence), 1) < config.min_template_align_ratio:
            reject("align ratio below minimum")
            continue
        if hit.hit_end - hit.hit_start + 1 < config.min_template_hit_length:
            reject("hit shorter than min_template_hit_length")
            continue
        try:
            template = store.get(hit.pdb_id)
        except (ParseError, OSError) as error:
            reject(f"unreadable template structure: {error}")
            continue
        if template is None:
            report.without_coordinates.append(hit.name)
            continue
        if not _released_in_time(template.release_date, target_release_date, config.template_release_gap_days):
            reject("released less than template_release_gap_days before the target")
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
        if (
            template_sequence
            and template_sequence in sequence
            and (len(template_sequence) / max(len(sequence), 1) > config.max_template_subsequence_ratio)
        ):
            reject("near-identical subsequence of the query")
            continue
        in_range = (hit.query_indices >= 0) & (hit.query_indices < len(chain.residues))
        choice = _Selected(hit, template_chain, hit_positions[in_range], hit.query_indices[in_range])
        if not any((template_chain.residues[h].occupancies > 0).any() for h in choice.hit_positions):
            reject("no aligned template residue resolved")
            continue
        if config.deduplicate_templates:
            residues = tuple(
                (int(q), template_chain.residues[h].parent)
                for q, h in zip(choice.query_positions, choice.hit_positions)
            )
            if residues in placed:
                reject("same residues on the query as an earlier hit")
                continue
            placed.add(residues)
        selected.append(choice)
        report.used.append(f"{chain.chain_id}:{hit.name}")
        report.release_dates.append(template.release_date)
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
    given_templates: dict | None = None,
) -> dict[str, np.ndarray]:
    """The record's template arrays: up to `max_templates_stored` kept hits per protein chain.

    given_templates: chain id -> the input's own templates (io.af3_json.GivenTemplate: hit and
    template chain), used as given, instead of that chain's hits (AF3 filters none of them)."""
    store = TemplateStore(template_dir) if template_dir is not None else None
    per_chain: dict[int, list[_Selected]] = {}
    for chain_index, chain in enumerate(structure.chains):
        if chain.chain_id in (given_templates or {}):
            given = given_templates[chain.chain_id][: config.max_templates_stored]
            per_chain[chain_index] = [
                _Selected(item.hit, item.chain, item.hit.hit_indices, item.hit.query_indices) for item in given
            ]
            report.used.extend(f"{chain.chain_id}:{item.hit.name}" for item in given)
            report.release_dates.extend(item.release_date for item in given)
            continue
        hits = chain_template_hits.get(chain.chain_id) or []
        if chain.molecule_type != "protein" or not hits:
            continue
        if store is None:
            report.without_coordinates.extend(hit.name for hit in hits[: config.max_template_hits])
            continue
        per_chain[chain_index] = select_templates(chain, hits, store, config, structure.release_date, report)
    # Homomer copies share their hits: name each missing structure once.
    report.without_coordinates[:] = list(dict.fromkeys(report.without_coordinates))
    filtered = set(per_chain) - {
        index for index, chain in enumerate(structure.chains) if chain.chain_id in (given_templates or {})
    }
    if filtered and structure.release_date is None and config.template_release_gap_days > 0:
        report.warnings.append(
            f"no release date: template hits are not filtered by release date "
            f"(template_release_gap_days={config.template_release_gap_days} needs the target's date)"
        )

    count = max((len(selected) for selected in per_chain.values()), default=0)
    size = tokens.num_tokens
    template_count = np.zeros(size, dtype=np.int16)
    restype = np.full((count, size), schema.GAP, dtype=np.int8)
    backbone_pos = np.zeros((count, size, 3, 3), dtype=np.float32)
    backbone_mask = np.zeros((count, size, 3), dtype=bool)
    pseudo_beta_pos = np.zeros((count, size, 3), dtype=np.float32)
    pseudo_beta_mask = np.zeros((count, size), dtype=bool)
    for chain_index, selected in per_chain.items():
        chain_tokens = np.flatnonzero(tokens.token_chain == chain_index)
        token_residues = tokens.token_residue[chain_tokens]
        template_count[chain_tokens] = len(selected)
        for row, template in enumerate(selected):
            residue_features = _template_residues(template, len(structure.chains[chain_index].residues))
            classes, bb_pos, bb_mask, cb_pos, cb_mask = residue_features
            restype[row, chain_tokens] = classes[token_residues]
            backbone_pos[row, chain_tokens] = bb_pos[token_residues]
            backbone_mask[row, chain_tokens] = bb_mask[token_residues]
            pseudo_beta_pos[row, chain_tokens] = cb_pos[token_residues]
            pseudo_beta_mask[row, chain_tokens] = cb_mask[token_residues]
    return {
        "template_count": template_count,
        "template_restype": restype,
        "template_backbone_pos": backbone_pos,
        "template_backbone_mask": backbone_mask,
        "template_pseudo_beta_pos": pseudo_beta_pos,
        "template_pseudo_beta_mask": pseudo_beta_mask,
    }


def sample_templates(
    arrays: dict[str, np.ndarray], max_templates: int | None, rng: np.random.Generator | None
) -> dict[str, np.ndarray]:
    """The templates one sample uses, chosen per chain from those its record stores.

    With `rng` (training), each chain with n stored templates gets k = min(Uniform{0..n},
    `max_templates`) of them, drawn without replacement, as AF3 SI 2.4 (and OpenFold3) do;
    without (inference, or SampleConfig.random_templates=False) its first `max_templates`, best
    hit first. `max_templates` None means no cap. Chosen templates keep the record's layout: row t
    holds each chain's t-th choice, and ``template_count`` is updated to what each chain got.
    """
    if "template_count" not in arrays:
        raise KeyError(
            "record has no template_count (written before templates were stored per chain): recompute the cache"
        )
    counts = arrays["template_count"]
    if rng is None and (max_templates is None or max_templates >= arrays["template_restype"].shape[0]):
        return arrays  # every stored template, as stored
    asym_id = arrays["asym_id"]
    chosen: list[tuple[np.ndarray, np.ndarray]] = []  # (chain tokens, stored rows)
    for chain in np.unique(asym_id[counts > 0]):
        chain_tokens = np.flatnonzero(asym_id == chain)
        stored = int(counts[chain_tokens[0]])
        cap = stored if max_templates is None else min(stored, max_templates)
        if rng is None:
            rows = np.arange(cap)
        else:
            rows = np.sort(rng.choice(stored, size=min(int(rng.integers(0, stored + 1)), cap), replace=False))
        chosen.append((chain_tokens, rows))
    size = max((rows.size for _, rows in chosen), default=0)
    sampled = dict(arrays)
    new_counts = np.zeros_like(counts)
    for name, value in arrays.items():
        spec = schema.FEATURES_BY_NAME.get(name)
        if spec is None or "template" not in spec.axes:
            continue
        if spec.axes[:2] != ("template", "token"):  # a new template array must say how to sample it
            raise ValueError(f"sample_templates: {name} has axes {spec.axes}, expected (template, token, ...)")
        fill = schema.GAP if name == "template_restype" else 0
        out = np.full((size,) + value.shape[1:], fill, dtype=value.dtype)
        for chain_tokens, rows in chosen:
            out[: rows.size, chain_tokens] = value[rows[:, None], chain_tokens[None, :]]
        sampled[name] = out
    for chain_tokens, rows in chosen:
        new_counts[chain_tokens] = rows.size
    sampled["template_count"] = new_counts
    return sampled


def _template_residues(template: _Selected, chain_length: int):
    """Per target-residue template features of one template ([chain_length, ...] arrays)."""
    # here, not at the top: the loader imports this module (sample_templates), not the chemistry
    from featurecache.features.tokenize import residue_class

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
