"""Assemble a target's MSA from per-chain MSAs (AF-Multimer / AF3 style).

Row order: the query row, then rows paired across chains by species, then each entity's unpaired
rows. Columns are tokens.

- Per chain, the MSA's query is aligned onto the chain sequence (`map_query_to_chain`), so an
  MSA computed for a slightly different construct still lands on the right residues; chain
  residues the MSA does not cover are gaps. A chain without an MSA gets its query row only and a
  warning.
- Chains with the same sequence (homomer copies) share one MSA: an entity's unpaired rows fill
  the columns of every copy, so depth does not grow with the copy number.
- Pairing (AF-Multimer's, which AF3 SI 2.3 reuses): when two or more protein entities have MSAs
  whose rows carry species, each species present in at least two entities contributes paired
  rows: each entity's rows of that species sorted by similarity to its query (identity over the
  columns, then rank), the k-th rows of every entity paired, for k up to the fewest rows any of
  those entities has of the species; entities without the species are gaps in those rows. Paired
  rows are ordered by the number of entities they cover, then by the product of their rows'
  ranks (AF-Multimer's order), so the best-ranked pairs of every species come first. Species ids are
  resolved over all the target's MSAs at once (`io.species.SpeciesResolver`), so one organism
  has one id whichever header layout each chain's MSA uses, where a real mapping links them.
- Unpaired rows identical to a row already kept (for that entity's columns) are dropped.
- Rows are capped: paired rows (query included) by `max_paired_rows`, all rows by
  `msa_rows_stored`; the unpaired budget is shared evenly between entities (water-filling).
- Ligand tokens are gaps in every row but the query. Per-atom tokens of a modified residue
  repeat their residue's column.
- `msa_profile` and `deletion_mean` are computed over all kept rows.

Storage (schema.MSA_STORAGE): the record holds each entity's shown rows once, in its residue
columns, and per assembled row which stored row each entity shows; `expand_msa` builds the dense
[rows, token] arrays of the rows a sample draws, for the tokens it keeps. A homodimer's 15k-row
MSA is stored once instead of twice, and a sample of 1,024 rows reads ~1/4 of it.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

from featurecache.config import FeatureConfig
from featurecache import schema
from featurecache.io.alignments import map_query_to_chain
from featurecache.io.msa import Msa
from featurecache.io.species import SpeciesResolver, SpeciesTag

if TYPE_CHECKING:  # annotations only: the loader imports this module, not the parsers' chemistry
    from featurecache.features.tokenize import Tokens
    from featurecache.io.mmcif import Structure

_MAX_DELETIONS = np.iinfo(np.uint16).max  # working precision; the record stores uint8


def _letter_table(molecule_type: str) -> np.ndarray:
    """uint8 ASCII -> RESTYPES class for one molecule type; '-' -> GAP, anything else unknown."""
    if molecule_type == "protein":
        table = np.full(256, schema.UNK_PROTEIN, dtype=np.int8)
        for index, letter in enumerate(schema.PROTEIN_LETTERS):
            table[ord(letter)] = index
    elif molecule_type == "dna":
        table = np.full(256, schema.UNK_DNA, dtype=np.int8)
        for letter in "AGCT":
            table[ord(letter)] = schema.RESTYPE_INDEX["D" + letter]
    else:
        table = np.full(256, schema.UNK_RNA, dtype=np.int8)
        for letter in "AGCU":
            table[ord(letter)] = schema.RESTYPE_INDEX[letter]
    table[ord("-")] = schema.GAP
    return table


_LETTER_TABLES = {kind: _letter_table(kind) for kind in ("protein", "dna", "rna")}


class _EntityMsa:
    """One entity's MSA on its chain residues: classes [R, L], deletions [R, L], species [R]."""

    def __init__(self, classes: np.ndarray, deletions: np.ndarray, species_tags: tuple[SpeciesTag, ...]):
        self.classes = classes
        self.deletions = deletions
        self.species_tags = species_tags
        self.species: list[str] = []  # ids, set once every entity's MSA is known (target-wide)


def _entity_msa(
    msa: Msa, sequence: str, molecule_type: str, query_classes: np.ndarray, chain_id: str, warnings: list[str]
):
    """Rows of `msa` moved onto the chain's residues; None (with a warning) if they do not match."""
    query = msa.query.replace("-", "")
    mapping = map_query_to_chain(query, sequence)
    if mapping is None:
        warnings.append(
            f"chain {chain_id}: MSA {msa.source} query {query} does not match the chain sequence {sequence}; query-only MSA"
        )
        return None
    query_columns = np.flatnonzero(msa.aligned[0] != ord("-"))  # MSA columns that hold query residues
    positions = mapping.chain_positions
    mapped = positions >= 0
    source_columns = query_columns[mapped]
    target_columns = positions[mapped]
    rows = msa.depth
    classes = np.full((rows, len(sequence)), schema.GAP, dtype=np.int8)
    deletions = np.zeros((rows, len(sequence)), dtype=np.uint16)
    classes[:, target_columns] = _LETTER_TABLES[molecule_type][msa.aligned[:, source_columns]]
    deletions[:, target_columns] = np.minimum(msa.deletion_matrix[:, source_columns], _MAX_DELETIONS)
    classes[0] = query_classes  # the query row is the chain itself, whatever the MSA's query says
    deletions[0] = 0
    return _EntityMsa(classes, deletions, msa.species_tags)


def build_msa_features(
    structure: Structure,
    tokens: Tokens,
    chain_msas: dict[str, Msa | None],
    config: FeatureConfig,
    warnings: list[str],
) -> dict[str, np.ndarray]:
    """The record's MSA arrays (schema.MSA_STORAGE, msa_species, msa_is_paired, msa_profile,
    deletion_mean); `expand_msa` makes the dense msa / deletion_matrix of any rows from them."""
    chains = structure.chains
    token_chain, token_residue = tokens.token_chain, tokens.token_residue
    restype = tokens.arrays["restype"]

    # Residue classes of each polymer chain (query rows), from the first token of each residue.
    entity_chains: dict[int, list[int]] = {}
    chain_query: dict[int, np.ndarray] = {}
    for chain_index, chain in enumerate(chains):
        if not chain.is_polymer:
            continue
        entity_chains.setdefault(tokens.chain_entity[chain_index], []).append(chain_index)
        in_chain = np.flatnonzero(token_chain == chain_index)
        classes = np.empty(len(chain.residues), dtype=np.int8)
        # Later tokens of a per-atom residue overwrite with the same class.
        classes[token_residue[in_chain]] = restype[in_chain]
        chain_query[chain_index] = classes

    # One MSA per entity: the first copy with an MSA provides it.
    entity_msas: dict[int, _EntityMsa | None] = {}
    for entity, members in entity_chains.items():
        first = chains[members[0]]
        msa = next(
            (chain_msas.get(chains[c].chain_id) for c in members if chain_msas.get(chains[c].chain_id) is not None),
            None,
        )
        if msa is None:
            warnings.append(f"chain {', '.join(chains[c].chain_id for c in members)}: no alignment, query-only MSA")
            entity_msas[entity] = None
            continue
        entity_msas[entity] = _entity_msa(
            msa, first.sequence, first.molecule_type, chain_query[members[0]], first.chain_id, warnings
        )
    present = [source for source in entity_msas.values() if source is not None]
    resolver = SpeciesResolver(source.species_tags for source in present)
    for source in present:
        source.species = resolver.keys(source.species_tags)

    # Token columns of each polymer chain and the residue each of them shows (per-atom tokens of
    # a modified residue repeat its column; ligand tokens are in no chain's columns: gaps).
    # A chain's tokens are contiguous (tokenize emits chains in order): a column slice each.
    chain_span = {}
    chain_columns = {}
    for chain_index in chain_query:
        in_chain = np.flatnonzero(token_chain == chain_index)
        assert in_chain[-1] - in_chain[0] + 1 == in_chain.size, "tokens of a chain must be contiguous"
        chain_span[chain_index] = slice(int(in_chain[0]), int(in_chain[-1]) + 1)
        columns = token_residue[in_chain]
        identity = columns.size == len(chain_query[chain_index]) and (columns == np.arange(columns.size)).all()
        chain_columns[chain_index] = None if identity else columns
    size = tokens.num_tokens

    species_ids: dict[str, int] = {}

    def species_id(name: str) -> int:
        return species_ids.setdefault(name, len(species_ids) + 1) if name else 0

    paired_rows = _paired_rows(entity_chains, entity_msas, chains, config.max_paired_rows - 1)
    budget = max(0, config.msa_rows_stored - 1 - len(paired_rows))

    # Assembled rows: the query, the paired rows, then each entity's unpaired rows; per row, the
    # entity row shown in each entity's columns.
    row_picks: list[dict[int, int]] = [{}]
    row_species, row_paired = [0], [True]
    used_rows: dict[int, list[int]] = {entity: [0] for entity in entity_chains}  # rows already shown
    for species, picks in paired_rows:
        row_picks.append(picks)
        row_species.append(species_id(species))
        row_paired.append(True)
        for entity, row in picks.items():
            used_rows[entity].append(row)
    unpaired = {
        entity: _new_unique_rows(source.classes, used_rows[entity])
        for entity, source in entity_msas.items()
        if source is not None
    }
    quotas = _water_fill({entity: rows.size for entity, rows in unpaired.items()}, budget)
    for entity, rows in unpaired.items():
        species = entity_msas[entity].species
        for row in rows[: quotas[entity]].tolist():
            row_picks.append({entity: row})
            row_species.append(species_id(species[row]))
            row_paired.append(False)

    arrays = _stored_msa(row_picks, entity_msas, entity_chains, chain_span, chain_columns, size)
    arrays["msa_species"] = np.asarray(row_species, dtype=np.int32)
    arrays["msa_is_paired"] = np.asarray(row_paired, dtype=bool)
    arrays["msa_profile"], arrays["deletion_mean"] = _profile(arrays, restype)
    return arrays


def _stored_msa(row_picks, entity_msas, entity_chains, chain_span, chain_columns, size) -> dict:
    """MSA_STORAGE arrays: each entity's rows that some assembled row shows, once, in rank order."""
    entities = [entity for entity in entity_chains if entity_msas[entity] is not None]
    shown = {entity: sorted({picks[entity] for picks in row_picks if entity in picks}) for entity in entities}
    width = max((entity_msas[entity].classes.shape[1] for entity in entities), default=0)
    stored_row: dict[int, dict[int, int]] = {}  # entity -> entity row -> row of msa_block
    blocks, deletions = [], []
    for entity in entities:
        rows = np.asarray(shown[entity], dtype=np.int64)
        first = sum(block.shape[0] for block in blocks)
        stored_row[entity] = {row: first + index for index, row in enumerate(shown[entity])}
        source = entity_msas[entity]
        block = np.full((rows.size, width), schema.GAP, dtype=np.int8)
        block[:, : source.classes.shape[1]] = source.classes[rows]
        counts = np.zeros((rows.size, width), dtype=np.uint16)
        counts[:, : source.classes.shape[1]] = source.deletions[rows]
        blocks.append(block)
        deletions.append(counts)
    block = np.concatenate(blocks) if blocks else np.zeros((0, width), dtype=np.int8)
    exact_deletions = np.concatenate(deletions) if deletions else np.zeros((0, width), dtype=np.uint16)
    # uint8 halves what the loader reads; counts past 255 are clipped (AF3's 2/pi * arctan(d / 3)
    # transform is within 0.008 of 1 there). deletion_mean uses the exact counts.
    nonzero_rows, nonzero_columns = np.nonzero(exact_deletions)
    source_rows = np.full((len(row_picks), len(entities)), -1, dtype=np.int32)
    for index, picks in enumerate(row_picks):
        for slot, entity in enumerate(entities):
            if entity in picks:
                source_rows[index, slot] = stored_row[entity][picks[entity]]
    token_entity = np.full(size, -1, dtype=np.int32)
    token_column = np.zeros(size, dtype=np.int32)
    for slot, entity in enumerate(entities):
        for chain_index in entity_chains[entity]:
            span, columns = chain_span[chain_index], chain_columns[chain_index]
            token_entity[span] = slot
            token_column[span] = np.arange(span.stop - span.start) if columns is None else columns
    return {
        "msa_block": block,
        "msa_block_deletion_count": np.bincount(nonzero_rows, minlength=block.shape[0]).astype(np.int32),
        "msa_block_deletion_column": nonzero_columns.astype(np.int32),
        "msa_block_deletion_value": np.minimum(exact_deletions[nonzero_rows, nonzero_columns], 255).astype(np.uint8),
        "msa_row_source": source_rows,
        "msa_token_entity": token_entity,
        "msa_token_column": token_column,
        "_exact_deletions": exact_deletions,
    }


def _profile(arrays: dict, restype: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """msa_profile and deletion_mean over all assembled rows, from how often each stored row is shown
    (the dense [msa, token] MSA is never built)."""
    exact_deletions = arrays.pop("_exact_deletions")
    block, source_rows = arrays["msa_block"], arrays["msa_row_source"]
    token_entity, token_column = arrays["msa_token_entity"], arrays["msa_token_column"]
    depth, size, width = source_rows.shape[0], restype.shape[0], block.shape[1]
    counts = np.zeros((size, schema.NUM_RESTYPES), dtype=np.float64)
    deletion_sums = np.zeros(size, dtype=np.float64)
    counts[np.arange(size), restype] += 1  # the query row
    counts[token_entity < 0, schema.GAP] += depth - 1
    for slot in range(source_rows.shape[1]):
        shown = source_rows[1:, slot]
        times = np.bincount(shown[shown >= 0], minlength=block.shape[0]).astype(np.float64)  # [block rows]
        rows = np.flatnonzero(times)
        cells = (np.arange(width) * schema.NUM_RESTYPES + block[rows].astype(np.int64)).ravel()
        column_counts = np.bincount(cells, weights=np.repeat(times[rows], width), minlength=width * schema.NUM_RESTYPES)
        column_counts = column_counts.reshape(width, schema.NUM_RESTYPES)
        column_counts[:, schema.GAP] += np.count_nonzero(shown < 0)
        tokens = np.flatnonzero(token_entity == slot)
        counts[tokens] += column_counts[token_column[tokens]]
        deletion_sums[tokens] = (times[rows] @ exact_deletions[rows].astype(np.float64))[token_column[tokens]]
    profile = (counts / max(depth, 1)).astype(np.float32)
    return profile, (deletion_sums / max(depth, 1)).astype(np.float32)


def expand_msa(arrays: dict, rows: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The dense msa [rows, token] and deletion_matrix of assembled `rows` (all when None), for the
    tokens `arrays` holds (a record, or a crop of one: the token arrays cropped alike). Only the
    stored rows these show are read from msa_block (a store.codec.RowFrames decodes only those)."""
    source_rows = arrays["msa_row_source"]
    rows = np.arange(source_rows.shape[0]) if rows is None else np.asarray(rows, dtype=np.int64)
    token_entity, token_column = arrays["msa_token_entity"], arrays["msa_token_column"]
    sources = source_rows[rows]  # [S, E]
    needed = np.unique(sources[sources >= 0])
    width = arrays["msa_block"].shape[1]
    entities = sources.shape[1]
    # The needed stored rows plus one row of gaps (index K) for the rows an entity does not show.
    classes = np.full((needed.size + 1, width), schema.GAP, dtype=np.int8)
    deletions = np.zeros((needed.size + 1, width), dtype=np.uint8)
    if needed.size:
        classes[:-1] = arrays["msa_block"][needed]
        deletions[:-1] = _dense_deletions(arrays, needed, width)
    # Each assembled row as every entity's row side by side plus a gap column ([S, E * width + 1]),
    # then one column take per array: ~3x faster than assigning each entity's token columns.
    shown = np.where(sources >= 0, np.searchsorted(needed, sources), needed.size)  # [S, E]
    column = np.where(token_entity >= 0, token_entity * width + token_column, entities * width)
    msa = _side_by_side(classes, shown).take(column, axis=1)
    deletion_matrix = _side_by_side(deletions, shown).take(column, axis=1)
    query = rows == 0
    msa[query] = arrays["restype"]
    deletion_matrix[query] = 0
    return msa, deletion_matrix


def _side_by_side(stored: np.ndarray, shown: np.ndarray) -> np.ndarray:
    """[S, E * width + 1]: row shown[r, e] of `stored` for each entity e, then a gap / 0 column."""
    gap = np.full((shown.shape[0], 1), schema.GAP if stored.dtype == np.int8 else 0, dtype=stored.dtype)
    return np.concatenate([stored.take(shown[:, entity], axis=0) for entity in range(shown.shape[1])] + [gap], axis=1)


def _dense_deletions(arrays: dict, stored_rows: np.ndarray, width: int) -> np.ndarray:
    """[len(stored_rows), width] deletion counts of those stored rows, from the sparse arrays."""
    counts = arrays["msa_block_deletion_count"]
    ends = np.cumsum(counts, dtype=np.int64)
    starts = ends[stored_rows] - counts[stored_rows]
    lengths = counts[stored_rows].astype(np.int64)
    out = np.zeros((stored_rows.size, width), dtype=np.uint8)
    total = int(lengths.sum())
    if total:
        owner = np.repeat(np.arange(stored_rows.size), lengths)
        offsets = np.arange(total) - np.repeat(np.cumsum(lengths) - lengths, lengths)
        entries = np.repeat(starts, lengths) + offsets
        out[owner, arrays["msa_block_deletion_column"][entries]] = arrays["msa_block_deletion_value"][entries]
    return out


def _new_unique_rows(classes: np.ndarray, used: list[int]) -> np.ndarray:
    """Rows (in rank order) whose content is new: first copies only, none equal to a used row."""
    rows_as_bytes = np.ascontiguousarray(classes).view(np.dtype((np.void, classes.shape[1])))[:, 0]
    _, first = np.unique(rows_as_bytes, return_index=True)
    first = np.sort(first)
    return first[~np.isin(rows_as_bytes[first], rows_as_bytes[np.asarray(used)])]


def query_identity(msa: Msa, molecule_type: str) -> np.ndarray:
    """[rows] each row's identity to the query over its columns, in residue classes: the order in
    which pairing takes a species' rows (most similar first)."""
    classes = _LETTER_TABLES[molecule_type][msa.aligned]
    return (classes == classes[0]).mean(axis=1)


def pair_msas(msas: list[Msa], max_rows: int) -> list[tuple[str, dict[int, int]]]:
    """The rows build_msa_features pairs across the protein MSAs `msas` (each one's query being
    its chain, no two of the same sequence): (species, {index in msas: row}) per paired row, best
    first, at most `max_rows` (FeatureConfig.max_paired_rows - 1: the query is not counted).
    Species are resolved over all of them at once, as for a target."""
    sources = {
        index: _EntityMsa(_LETTER_TABLES["protein"][msa.aligned], msa.deletion_matrix, msa.species_tags)
        for index, msa in enumerate(msas)
    }
    resolver = SpeciesResolver(source.species_tags for source in sources.values())
    for source in sources.values():
        source.species = resolver.keys(source.species_tags)
    return _species_pairs(sources, max_rows)


def _paired_rows(entity_chains, entity_msas, chains, max_rows: int) -> list[tuple[str, dict[int, int]]]:
    """(species, {entity: row}) per paired row, best first (see the module docstring)."""
    candidates = {
        entity: source
        for entity, source in entity_msas.items()
        if source is not None and chains[entity_chains[entity][0]].molecule_type == "protein"
    }
    return _species_pairs(candidates, max_rows)


def _species_pairs(candidates: dict[int, _EntityMsa], max_rows: int) -> list[tuple[str, dict[int, int]]]:
    if len(candidates) < 2 or max_rows <= 0:
        return []
    species_rows: dict[str, dict[int, list[int]]] = {}  # species -> entity -> rows, most similar first
    for entity, source in candidates.items():
        similarity = (source.classes == source.classes[0]).mean(axis=1)
        rows_of: dict[str, list[int]] = {}
        for row, species in enumerate(source.species):
            if row > 0 and species:
                rows_of.setdefault(species, []).append(row)
        for species, rows in rows_of.items():
            rows.sort(key=lambda row: (-similarity[row], row))
            species_rows.setdefault(species, {})[entity] = rows
    paired = []
    for species, by_entity in species_rows.items():
        if len(by_entity) < 2:
            continue
        for k in range(min(len(rows) for rows in by_entity.values())):
            paired.append((species, {entity: rows[k] for entity, rows in by_entity.items()}))
    paired.sort(key=lambda item: (-len(item[1]), math.prod(item[1].values()), item[0]))
    return paired[:max_rows]


def _water_fill(sizes: dict[int, int], budget: int) -> dict[int, int]:
    """Split `budget` rows between entities: small MSAs keep everything, big ones share the rest."""
    quotas = {entity: 0 for entity in sizes}
    remaining = budget
    pending = sorted(sizes, key=lambda entity: sizes[entity])
    while pending and remaining > 0:
        share = remaining // len(pending)
        entity = pending[0]
        if sizes[entity] <= share:
            quotas[entity] = sizes[entity]
            remaining -= sizes[entity]
            pending.pop(0)
        else:
            for index, entity in enumerate(pending):
                quotas[entity] = share + (1 if index < remaining - share * len(pending) else 0)
            remaining = 0
    return quotas
