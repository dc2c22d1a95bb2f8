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
"""

from __future__ import annotations

import math

import numpy as np

from featurecache.config import FeatureConfig
from featurecache import schema
from featurecache.features.tokenize import Tokens
from featurecache.io.alignments import map_query_to_chain
from featurecache.io.mmcif import Structure
from featurecache.io.msa import Msa
from featurecache.io.species import SpeciesResolver, SpeciesTag

_PROFILE_CHUNK_ROWS = 1024
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


def _entity_msa(msa: Msa, sequence: str, molecule_type: str, query_classes: np.ndarray, chain_id: str, warnings: list[str]):
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
    """msa, deletion_matrix, msa_species, msa_is_paired, msa_profile, deletion_mean."""
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
        msa = next((chain_msas.get(chains[c].chain_id) for c in members if chain_msas.get(chains[c].chain_id) is not None), None)
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

    def place(entity: int, rows: np.ndarray, out_classes: np.ndarray, out_deletions: np.ndarray, out_rows) -> None:
        """Copy `rows` of an entity's MSA into the token columns of every copy of the entity."""
        source = entity_msas[entity]
        classes, deletions = source.classes[rows], source.deletions[rows]
        for chain_index in entity_chains[entity]:
            columns, span = chain_columns[chain_index], chain_span[chain_index]
            out_classes[out_rows, span] = classes if columns is None else classes[:, columns]
            out_deletions[out_rows, span] = deletions if columns is None else deletions[:, columns]

    species_ids: dict[str, int] = {}

    def species_id(name: str) -> int:
        return species_ids.setdefault(name, len(species_ids) + 1) if name else 0

    paired_rows = _paired_rows(entity_chains, entity_msas, chains, config.max_paired_rows - 1)
    budget = max(0, config.msa_rows_stored - 1 - len(paired_rows))

    # Blocks of rows: the query row, the paired rows, then each entity's unpaired rows.
    class_blocks = [restype[None, :].astype(np.int8)]
    deletion_blocks = [np.zeros((1, size), dtype=np.uint16)]
    row_species, row_paired = [0], [True]
    used_rows: dict[int, list[int]] = {entity: [0] for entity in entity_chains}  # rows already shown

    if paired_rows:
        classes = np.full((len(paired_rows), size), schema.GAP, dtype=np.int8)
        deletions = np.zeros((len(paired_rows), size), dtype=np.uint16)
        by_entity: dict[int, tuple[list[int], list[int]]] = {}
        for index, (species, picks) in enumerate(paired_rows):
            for entity, row in picks.items():
                out_rows, rows = by_entity.setdefault(entity, ([], []))
                out_rows.append(index)
                rows.append(row)
            row_species.append(species_id(species))
            row_paired.append(True)
        for entity, (out_rows, rows) in by_entity.items():
            place(entity, np.asarray(rows), classes, deletions, np.asarray(out_rows))
            used_rows[entity].extend(rows)
        class_blocks.append(classes)
        deletion_blocks.append(deletions)

    unpaired = {
        entity: _new_unique_rows(source.classes, used_rows[entity])
        for entity, source in entity_msas.items()
        if source is not None
    }
    quotas = _water_fill({entity: rows.size for entity, rows in unpaired.items()}, budget)
    for entity, rows in unpaired.items():
        chosen = rows[: quotas[entity]]
        if not chosen.size:
            continue
        classes = np.full((chosen.size, size), schema.GAP, dtype=np.int8)
        deletions = np.zeros((chosen.size, size), dtype=np.uint16)
        place(entity, chosen, classes, deletions, slice(None))
        class_blocks.append(classes)
        deletion_blocks.append(deletions)
        species = entity_msas[entity].species
        row_species.extend(species_id(species[row]) for row in chosen.tolist())
        row_paired.extend([False] * chosen.size)

    msa = np.concatenate(class_blocks)
    deletions = np.concatenate(deletion_blocks)
    # uint8 halves the bytes the loader decompresses; counts past 255 are clipped (AF3's
    # 2/pi * arctan(d / 3) transform is within 0.008 of 1 there). The mean uses exact counts.
    deletion_matrix = np.minimum(deletions, np.iinfo(np.uint8).max).astype(np.uint8)
    return {
        "msa": msa,
        "deletion_matrix": deletion_matrix,
        "msa_species": np.asarray(row_species, dtype=np.int32),
        "msa_is_paired": np.asarray(row_paired, dtype=bool),
        "msa_profile": msa_profile(msa),
        "deletion_mean": deletions.mean(axis=0, dtype=np.float64).astype(np.float32),
    }


def _new_unique_rows(classes: np.ndarray, used: list[int]) -> np.ndarray:
    """Rows (in rank order) whose content is new: first copies only, none equal to a used row."""
    rows_as_bytes = np.ascontiguousarray(classes).view(np.dtype((np.void, classes.shape[1])))[:, 0]
    _, first = np.unique(rows_as_bytes, return_index=True)
    first = np.sort(first)
    return first[~np.isin(rows_as_bytes[first], rows_as_bytes[np.asarray(used)])]


def msa_profile(msa: np.ndarray) -> np.ndarray:
    """[M, N] classes -> [N, NUM_RESTYPES] class frequencies, in row chunks to bound memory."""
    rows, width = msa.shape
    counts = np.zeros(width * schema.NUM_RESTYPES, dtype=np.int64)
    base = np.arange(width, dtype=np.int64) * schema.NUM_RESTYPES
    for start in range(0, rows, _PROFILE_CHUNK_ROWS):
        chunk = msa[start : start + _PROFILE_CHUNK_ROWS].astype(np.int64) + base
        counts += np.bincount(chunk.ravel(), minlength=counts.size)
    return (counts.reshape(width, schema.NUM_RESTYPES) / max(rows, 1)).astype(np.float32)


def _paired_rows(entity_chains, entity_msas, chains, max_rows: int) -> list[tuple[str, dict[int, int]]]:
    """(species, {entity: row}) per paired row, best first (see the module docstring)."""
    candidates = {
        entity: source
        for entity, source in entity_msas.items()
        if source is not None and chains[entity_chains[entity][0]].molecule_type == "protein"
    }
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
