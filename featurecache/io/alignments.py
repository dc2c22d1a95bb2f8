"""Find the alignment files of a target's chains in an ``--alignments DIR``.

Layouts are not trusted to follow one convention (the sample folder mixes four), so every MSA
file is indexed by its query sequence (first row, gaps and lower case removed) and chains are
matched by sequence:

1. exact match, or the chain is a contiguous part of the query (or the query of the chain);
2. otherwise a similar sequence (difflib matching blocks, X / N wildcards, same-length
   substitutions) with at least `MIN_IDENTITY` identity over the shorter sequence: a point
   mutant (721p, Q61L) or a sequence with an extra capping residue still finds its MSA.

Per chain only the best-matching query group is used (exact beats contained beats similar), so
similar paralogs in one target (7a4d's nanobodies) keep their own MSAs. Several files with the
same query (uniref90 + mgnify + bfd ...) are concatenated; byte-identical files are read once.

Template hit files carry no query sequence. They are tied to MSAs by location: an ``.hhr`` in the
same directory as the MSA files (OpenFold layout ``<chain>/pdb70_hits.hhr``), an ``.m8`` whose
name starts with an MSA's stem (``7a4d-assembly1A_protein_pdball_230102_db.m8`` belongs to
``7a4d-assembly1A_protein.a3m``). Returned hits are remapped to chain residue positions.

A file whose name claims a chain of this target (``<entry>-assembly1<chain>_...`` or a folder
``<entry>_<chain>``) but whose query matches neither that chain's label nor author chain is
reported in the warnings with the file and both sequences.

Files cut short (io.common.cut_short): an A3M's or HHR's partial last record or hit is dropped
and the target's warnings name the file; a file that cannot be read at all (a Stockholm without
its '//') is left out, and the targets its name claims say so in their warnings.
"""

from __future__ import annotations

import difflib
import hashlib
import os
import re
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from featurecache.io.common import ParseError, decode_text, read_bytes
from featurecache.io.hits import TemplateHit, parse_hhr, parse_m8
from featurecache.io.mmcif import Structure
from featurecache.io.msa import Msa, parse_a3m, parse_stockholm

MIN_IDENTITY = 0.95
MSA_SUFFIXES = (".a3m", ".a2m", ".sto", ".stockholm")
HIT_SUFFIXES = (".hhr", ".m8")
# Database order when several MSAs of one query are concatenated (AlphaFold's order first).
DATABASE_ORDER = ("uniref90", "bfd", "uniclust", "uniref30", "mgnify", "uniprot", "colabfold", "env")
_WILDCARDS = {"X", "N"}
_ASSEMBLY_NAME = re.compile(r"^(?P<entry>[0-9A-Za-z]{4})-assembly\d+(?P<chain>[A-Za-z0-9]+?)_(?:protein|dna|rna)")
_CHAIN_FOLDER = re.compile(r"^(?P<entry>[0-9A-Za-z]{4})_(?P<chain>[A-Za-z0-9]+)$")


@dataclass(frozen=True)
class SequenceMapping:
    """Where each query residue lands in a chain: `chain_positions[i]` or -1 (not aligned)."""

    chain_positions: np.ndarray  # [len(query)] int64
    kind: str  # "exact" | "contained" | "similar"
    identity: float  # identical residues / len(shorter sequence)

    @property
    def rank(self) -> tuple:
        return ({"exact": 2, "contained": 1, "similar": 0}[self.kind], self.identity)


def map_query_to_chain(query: str, chain: str, min_identity: float = MIN_IDENTITY) -> SequenceMapping | None:
    """Align a query sequence onto a chain sequence; None when they are not the same molecule."""
    if not query or not chain:
        return None
    if query == chain:
        return SequenceMapping(np.arange(len(query)), "exact", 1.0)
    offset = chain.find(query)
    if offset >= 0:
        return SequenceMapping(np.arange(offset, offset + len(query)), "contained", 1.0)
    offset = query.find(chain)
    if offset >= 0:
        positions = np.full(len(query), -1, dtype=np.int64)
        positions[offset : offset + len(chain)] = np.arange(len(chain))
        return SequenceMapping(positions, "contained", 1.0)
    shorter = min(len(query), len(chain))
    if shorter < min_identity * max(len(query), len(chain)) * 0.5 or not _share_kmers(query, chain, min_identity):
        return None  # cheap rejection before the quadratic matcher
    positions = np.full(len(query), -1, dtype=np.int64)
    identical = strictly_identical = 0
    matcher = difflib.SequenceMatcher(None, query, chain, autojunk=False)
    for tag, q0, q1, c0, c1 in matcher.get_opcodes():
        if tag == "equal":
            positions[q0:q1] = np.arange(c0, c1)
            identical += q1 - q0
            strictly_identical += sum(a not in _WILDCARDS for a in query[q0:q1])
        elif tag == "replace" and q1 - q0 == c1 - c0:
            positions[q0:q1] = np.arange(c0, c1)
            identical += sum(a == b or a in _WILDCARDS or b in _WILDCARDS for a, b in zip(query[q0:q1], chain[c0:c1]))
    identity = identical / shorter
    # Wildcards count as matches, but a sequence of mostly X / N must not match everything.
    if identity < min_identity or strictly_identical < 0.5 * shorter:
        return None
    return SequenceMapping(positions, "similar", identity)


def _share_kmers(query: str, chain: str, min_identity: float, k: int = 4) -> bool:
    """At identity p, at least a fraction ~ 1 - k(1 - p) of k-mers survive; demand half of that."""
    if min(len(query), len(chain)) < 50 or _WILDCARDS & (set(query) | set(chain)):
        return True  # short or wildcard-bearing sequences: k-mers say little, the matcher is cheap
    query_kmers = {query[i : i + k] for i in range(len(query) - k + 1)}
    chain_kmers = {chain[i : i + k] for i in range(len(chain) - k + 1)}
    expected = max(0.0, 1.0 - k * (1.0 - min_identity))
    return len(query_kmers & chain_kmers) >= 0.5 * expected * min(len(query_kmers), len(chain_kmers))


@dataclass(frozen=True)
class AlignmentFile:
    path: str
    kind: str  # "msa" | "hits"
    query: str  # ungapped upper-case query ("" for hit files until tied to an MSA)
    sha256: str
    claim: tuple[str, str] | None  # (entry, chain) from the file or folder name


@dataclass(frozen=True)
class ChainAlignments:
    chain_id: str
    msa: Msa | None
    hits: tuple[TemplateHit, ...]  # query indices in chain residue positions
    msa_files: tuple[str, ...]
    hit_files: tuple[str, ...]
    mapping: SequenceMapping | None


class AlignmentIndex:
    """Index of every MSA and template-hit file under a folder, keyed by query sequence."""

    def __init__(self, root: str | os.PathLike):
        self.root = Path(root)
        if not self.root.is_dir():
            raise ValueError(f"alignments folder {self.root} does not exist or is not a folder")
        self.msa_files: list[AlignmentFile] = []
        self.hit_files: list[AlignmentFile] = []
        self.errors: list[str] = []  # unreadable files, reported rather than fatal
        # (entry, chain) named by an unreadable file, with its error: the targets it names warn
        self._unreadable_claims: list[tuple[tuple[str, str], str]] = []
        for path in sorted(self.root.rglob("*")):
            if not path.is_file():
                continue
            name = path.name.lower().removesuffix(".gz")
            if name.endswith(MSA_SUFFIXES):
                try:
                    data = read_bytes(path)
                    query = _msa_query(data, str(path))
                except ParseError as error:
                    self.errors.append(str(error))
                    if _claim(path) is not None:
                        self._unreadable_claims.append((_claim(path), str(error)))
                    continue
                self.msa_files.append(AlignmentFile(str(path), "msa", query, _sha(data), _claim(path)))
            elif name.endswith(HIT_SUFFIXES):
                data = read_bytes(path)
                self.hit_files.append(AlignmentFile(str(path), "hits", "", _sha(data), _claim(path)))

    def queries(self) -> set[str]:
        return {entry.query for entry in self.msa_files}

    def for_structure(self, structure: Structure) -> tuple[dict[str, ChainAlignments], list[str]]:
        """Alignments of every polymer chain of `structure`, and warnings (mismatches, misses)."""
        warnings: list[str] = []
        by_sha: dict[str, Msa] = {}
        merged: dict[str, tuple[Msa | None, list[str]]] = {}
        result: dict[str, ChainAlignments] = {}
        entry = structure.id[:4].lower()
        query_set = self.queries()
        queries = sorted(query_set)
        for chain in structure.chains:
            if not chain.is_polymer:
                continue
            sequence = chain.sequence
            best: tuple | None = None
            if sequence in query_set:  # exact match: nothing can rank higher, skip the scan
                best = (sequence, map_query_to_chain(sequence, sequence))
            else:
                for query in queries:
                    mapping = map_query_to_chain(query, sequence)
                    if mapping is not None and (best is None or mapping.rank > best[1].rank):
                        best = (query, mapping)
            if best is None:
                result[chain.chain_id] = ChainAlignments(chain.chain_id, None, (), (), (), None)
                continue
            query, mapping = best
            files = _ordered([entry_ for entry_ in self.msa_files if entry_.query == query])
            if query not in merged:
                msas, used = [], []
                seen_sha: set[str] = set()
                for file in files:
                    if file.sha256 in seen_sha:
                        continue
                    seen_sha.add(file.sha256)
                    if file.sha256 not in by_sha:
                        by_sha[file.sha256] = _parse_msa(read_bytes(file.path), file.path, warnings)
                    msas.append(by_sha[file.sha256])
                    used.append(file.path)
                # Homomer copies get the very same Msa object.
                merged[query] = (concatenate_msas(msas), used)
            msa, used = merged[query]
            hits, hit_paths = self._hits_for(files, mapping, warnings)
            if mapping.kind == "similar":
                warnings.append(
                    f"chain {chain.chain_id}: alignments matched by similarity ({mapping.identity:.3f} identity) "
                    f"from {used[0]}"
                )
            result[chain.chain_id] = ChainAlignments(
                chain.chain_id, msa, tuple(hits), tuple(used), tuple(hit_paths), mapping
            )
        warnings.extend(self._claim_mismatches(structure, entry))
        # A file named for this target that could not be read (its query unknown, so it matched
        # no chain): the target is built without it, and says so.
        warnings.extend(
            f"unreadable alignment file: {message}" for claim, message in self._unreadable_claims if claim[0] == entry
        )
        # a file used by several chains (homomers, hit files of one folder) warns once
        return result, list(dict.fromkeys(warnings))

    def _hits_for(self, msa_files: list[AlignmentFile], mapping: SequenceMapping, warnings: list[str]):
        folders = {str(Path(file.path).parent) for file in msa_files}
        stems = {_stem(file.path) for file in msa_files}
        hits: list[TemplateHit] = []
        paths: list[str] = []
        seen_sha: set[str] = set()
        for file in self.hit_files:
            path = Path(file.path)
            is_hhr = path.name.lower().removesuffix(".gz").endswith(".hhr")
            tied = (is_hhr and str(path.parent) in folders) or any(
                path.name.startswith(stem + "_") or _stem(file.path) == stem for stem in stems
            )
            if not tied or file.sha256 in seen_sha:
                continue
            seen_sha.add(file.sha256)
            data = read_bytes(file.path)
            file_hits = parse_hhr(data, file.path, warnings) if is_hhr else parse_m8(data, file.path, warnings)
            paths.append(file.path)
            for hit in file_hits:
                remapped = _remap_hit(hit, mapping)
                if remapped is not None:
                    hits.append(remapped)
        return hits, paths

    def _claim_mismatches(self, structure: Structure, entry: str) -> list[str]:
        messages = []
        for file in self.msa_files:
            if file.claim is None or file.claim[0].lower() != entry:
                continue
            claimed = [
                chain
                for chain in structure.chains
                if chain.is_polymer and file.claim[1] in (chain.chain_id, chain.auth_chain_id)
            ]
            if claimed and not any(map_query_to_chain(file.query, chain.sequence) for chain in claimed):
                chain = claimed[0]
                messages.append(
                    f"{file.path}: named for chain {file.claim[1]} but its query {file.query} does not match "
                    f"chain {chain.chain_id} sequence {chain.sequence}"
                )
        return messages


def concatenate_msas(msas: list[Msa]) -> Msa | None:
    """One MSA from several of the same query: the first query row, then every file's other rows."""
    if not msas:
        return None
    if len(msas) == 1:
        return msas[0]
    first = msas[0]
    for msa in msas[1:]:
        if msa.query != first.query:
            raise ValueError(
                f"cannot concatenate {msa.source} (query {msa.query}) with {first.source} (query {first.query})"
            )
    return Msa(
        np.concatenate([first.aligned] + [msa.aligned[1:] for msa in msas[1:]]),
        np.concatenate([first.deletion_matrix] + [msa.deletion_matrix[1:] for msa in msas[1:]]),
        first.descriptions + sum((msa.descriptions[1:] for msa in msas[1:]), ()),
        "+".join(msa.source for msa in msas),
    )


def _remap_hit(hit: TemplateHit, mapping: SequenceMapping) -> TemplateHit | None:
    """The hit with its query indices moved from query to chain positions (unmapped pairs dropped)."""
    if mapping.kind == "exact":
        return hit
    valid = hit.query_indices < len(mapping.chain_positions)
    chain_positions = np.full(hit.query_indices.shape, -1, dtype=np.int64)
    chain_positions[valid] = mapping.chain_positions[hit.query_indices[valid]]
    keep = chain_positions >= 0
    if not keep.any():
        return None
    return replace(
        hit,
        query_indices=chain_positions[keep].astype(np.int32),
        hit_indices=hit.hit_indices[keep],
    )


def _parse_msa(data: bytes, path: str, warnings: list[str]) -> Msa:
    name = os.path.basename(path).lower().removesuffix(".gz")
    if name.endswith((".sto", ".stockholm")):
        return parse_stockholm(data, path)
    return parse_a3m(data, path, warnings)  # a cut last record is dropped, with a warning


def _msa_query(data: bytes, path: str) -> str:
    """The ungapped query of an MSA file without parsing every row."""
    name = os.path.basename(path).lower().removesuffix(".gz")
    if name.endswith((".sto", ".stockholm")):
        return parse_stockholm(data, path).query.replace("-", "")
    # First record only: cut the text at the second header.
    text = decode_text(data, path)
    start = text.find(">")
    second = text.find("\n>", start + 1) if start >= 0 else -1
    head = text if second < 0 else text[: second + 1]
    return parse_a3m(head, path).query.replace("-", "")


def _ordered(files: list[AlignmentFile]) -> list[AlignmentFile]:
    def rank(file: AlignmentFile) -> tuple:
        name = os.path.basename(file.path).lower()
        for position, database in enumerate(DATABASE_ORDER):
            if database in name:
                return (position, file.path)
        return (len(DATABASE_ORDER), file.path)

    return sorted(files, key=rank)


def _stem(path: str) -> str:
    name = os.path.basename(path)
    for suffix in (".gz",) + MSA_SUFFIXES + HIT_SUFFIXES:
        if name.lower().endswith(suffix):
            name = name[: -len(suffix)]
    return name


def _claim(path: Path) -> tuple[str, str] | None:
    match = _ASSEMBLY_NAME.match(path.name)
    if match:
        return match.group("entry").lower(), match.group("chain")
    match = _CHAIN_FOLDER.match(path.parent.name)
    if match:
        return match.group("entry").lower(), match.group("chain")
    return None


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()
