"""Small real search databases built from the sample data, for tests and demonstrations.

``build_test_databases(out_dir, data_dir)`` makes, from ``../shared/data`` and the Debian
example packages:

- a protein FASTA of real UniProt/UniRef sequences (the sample A3M rows with gaps removed, plus
  the first sequences of ``mmseqs2-examples``' UniProt DB.fasta.gz) and its MMseqs2 database,
- an HH-suite database (``ffindex_build`` + ``cstranslate``) whose entries are the sample A3M
  files, each cut to its first rows,
- a nucleotide FASTA (HMMER's tutorial MADE1 transposon family and human DNA fragment, and the
  sample RNA alignment's sequences),
- a template mmCIF folder (``templates/mmcif`` plus the PDB entries of ``structures``), its seqres
  FASTA (pdb_seqres style), MMseqs2 database and single-sequence HH-suite database (PDB70 style).

``write_pipeline_config`` then writes a pipeline TOML that points at them, so
``featurecache precompute --config`` can be run on ``../shared/data/structures`` end to end:

    python -m featurecache.testing.testdb OUT_DIR [--data ../shared/data]
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path


from featurecache.io.mmcif import read_mmcif
from featurecache.precompute.tools import ToolNotFoundError, resolve_binary

UNIPROT_EXAMPLE = Path("/usr/share/doc/mmseqs2/example-data/DB.fasta.gz")
HMMER_TUTORIAL = Path("/usr/share/doc/hmmer/examples/tutorial")
HHSUITE_DATA_DIRS = (Path("/usr/share/hhsuite/data"), Path("/usr/lib/hhsuite/data"))
# Debian ships cstranslate as per-CPU builds under libexec (its bin wrapper only works from /usr/bin).
OUTPUT_FOLDERS = ("protein_mmseqs", "hhsuite_msa", "template_mmcif", "template_mmseqs", "template_hhsuite")
CSTRANSLATE_BUILDS = ("avx2", "avx", "sse4.1", "ssse3", "sse3", "plain")


@dataclass(frozen=True)
class TestDatabases:
    protein_fasta: Path  # jackhmmer / hmmsearch target
    protein_mmseqs: Path  # mmseqs createdb prefix of protein_fasta
    hhsuite_msa: Path  # HH-suite prefix (…_a3m / …_cs219) built from sample A3M files
    nucleotide_fasta: Path  # nhmmer target
    template_seqres: Path  # pdb_seqres-style FASTA of the template mmCIF chains
    template_mmseqs: Path  # mmseqs createdb prefix of template_seqres
    template_hhsuite: Path  # HH-suite prefix, one single-sequence entry per template chain
    template_mmcif_dir: Path


def build_test_databases(
    out_dir: str | os.PathLike,
    data_dir: str | os.PathLike,
    uniprot_sequences: int = 2000,
    rows_per_a3m: int = 200,
) -> TestDatabases:
    """Build every test database under ``out_dir`` (created) from the sample data in ``data_dir``."""
    out = Path(out_dir)
    data = Path(data_dir)
    for required in (data / "alignments", data / "templates" / "mmcif", data / "structures"):
        if not required.is_dir():
            raise FileNotFoundError(f"sample data folder {required} not found")
    out.mkdir(parents=True, exist_ok=True)
    # Rebuilding replaces an earlier build (ffindex_build and mmseqs refuse to overwrite).
    for folder in OUTPUT_FOLDERS:
        shutil.rmtree(out / folder, ignore_errors=True)
    a3m_files = sorted((data / "alignments").rglob("*.a3m")) + sorted((data / "alignments").rglob("*.a3m.gz"))

    protein_fasta = out / "protein.fasta"
    _write_protein_fasta(protein_fasta, a3m_files, rows_per_a3m, uniprot_sequences)
    protein_mmseqs = _mmseqs_createdb(protein_fasta, out / "protein_mmseqs" / "db")

    hhsuite_msa = out / "hhsuite_msa" / "db"
    entries = {
        f"{index:03d}_{_stem(path)}": _cut_a3m(_read_text(path), rows_per_a3m, path)
        for index, path in enumerate(a3m_files)
    }
    _build_hhsuite(hhsuite_msa, {name: text for name, text in entries.items() if text})

    nucleotide_fasta = out / "nucleotide.fasta"
    _write_nucleotide_fasta(nucleotide_fasta, data)

    template_dir = _collect_template_mmcifs(data, out / "template_mmcif")
    template_seqres = out / "pdb_seqres.fasta"
    chains = _template_chains(template_dir)
    with open(template_seqres, "w") as handle:
        for name, sequence in chains:
            handle.write(f">{name} mol:protein length:{len(sequence)}\n{sequence}\n")
    template_mmseqs = _mmseqs_createdb(template_seqres, out / "template_mmseqs" / "db")
    template_hhsuite = out / "template_hhsuite" / "db"
    _build_hhsuite(template_hhsuite, {name: f"#{name}\n>{name}\n{sequence}\n" for name, sequence in chains})

    return TestDatabases(
        protein_fasta=protein_fasta,
        protein_mmseqs=protein_mmseqs,
        hhsuite_msa=hhsuite_msa,
        nucleotide_fasta=nucleotide_fasta,
        template_seqres=template_seqres,
        template_mmseqs=template_mmseqs,
        template_hhsuite=template_hhsuite,
        template_mmcif_dir=template_dir,
    )


def write_pipeline_config(
    databases: TestDatabases,
    path: str | os.PathLike,
    threads: int = 1,
    timeout_s: float = 600.0,
    template_tool: str = "hhsearch",
) -> Path:
    """A pipeline TOML searching the test databases: jackhmmer + hhblits for proteins, nhmmer for
    RNA and DNA, and ``template_tool`` ("hhsearch", "hmmsearch" or "mmseqs") for templates."""
    template_paths = {
        "hmmsearch": databases.template_seqres,
        "hhsearch": databases.template_hhsuite,
        "mmseqs": databases.template_mmseqs,
    }
    if template_tool not in template_paths:
        raise ValueError(f"template_tool must be one of {sorted(template_paths)}, got {template_tool!r}")
    databases_searched = [
        ("uniprot_sample", "jackhmmer", "msa", databases.protein_fasta, 5000, None),
        ("sample_a3m", "hhblits", "msa", databases.hhsuite_msa, 5000, None),
        ("nucleotide_sample", "nhmmer", "msa", databases.nucleotide_fasta, 5000, ["rna", "dna"]),
        ("pdb_seqres_sample", template_tool, "template", template_paths[template_tool], 20, None),
    ]
    lines = [
        "# Test databases built by featurecache.testing.testdb from ../shared/data.",
        "[search]",
        f"threads = {threads}",
        f"timeout_s = {timeout_s}",
        "",
    ]
    for name, tool, role, database_path, max_hits, molecule_types in databases_searched:
        lines += [
            "[[databases]]",
            f'name = "{name}"',
            f'tool = "{tool}"',
            f'role = "{role}"',
            f"path = {_toml(database_path)}",
            f"max_hits = {max_hits}",
        ]
        if molecule_types is not None:
            lines.append(f"molecule_types = {json.dumps(molecule_types)}")
        lines.append("")
    lines += ["[templates]", f"mmcif_dir = {_toml(databases.template_mmcif_dir)}", 'msa_database = "uniprot_sample"']
    text = "\n".join(lines) + "\n"
    path = Path(path)
    path.write_text(text)
    return path


def _toml(path: Path) -> str:
    # A JSON string is a valid TOML basic string, escapes included.
    return json.dumps(str(path))


# --- builders ----------------------------------------------------------------------------------


def _read_text(path: Path) -> str:
    if path.suffix == ".gz":
        with gzip.open(path, "rt") as handle:
            return handle.read()
    return path.read_text()


def _stem(path: Path) -> str:
    name = path.name.removesuffix(".gz").removesuffix(".a3m")
    return f"{path.parent.name}_{name}" if path.parent.name not in ("pdb", "openfold") else name


def _records(text: str) -> list[tuple[str, str]]:
    records: list[tuple[str, list[str]]] = []
    for line in text.replace("\x00", "").splitlines():
        if line.startswith(">"):
            records.append((line[1:].strip(), []))
        elif line.strip() and not line.startswith("#") and records:
            records[-1][1].append(line.strip())
    return [(name, "".join(parts)) for name, parts in records]


def _cut_a3m(text: str, max_rows: int, path: Path) -> str:
    """The first ``max_rows`` rows whose match columns agree with the query's, as an HH-suite entry."""
    records = _records(text)
    if not records:
        return ""
    width = sum(1 for char in records[0][1] if char.isupper() or char == "-")
    kept = [
        (name, sequence)
        for name, sequence in records
        if sum(1 for char in sequence if char.isupper() or char == "-") == width
    ][:max_rows]
    body = "".join(f">{name}\n{sequence}\n" for name, sequence in kept)
    return f"#{path.name}\n{body}"


def _write_protein_fasta(path: Path, a3m_files: list[Path], rows_per_a3m: int, uniprot_sequences: int) -> None:
    seen: set[str] = set()
    with open(path, "w") as handle:
        for a3m in a3m_files:
            for index, (name, aligned) in enumerate(_records(_read_text(a3m))[:rows_per_a3m]):
                sequence = "".join(char for char in aligned.upper() if char.isalpha())
                if len(sequence) < 10 or sequence in seen:
                    continue
                seen.add(sequence)
                accession = name.split()[0] if name.split() else f"row{index}"
                handle.write(f">{_stem(a3m)}|{index}|{accession}\n{sequence}\n")
        if uniprot_sequences and UNIPROT_EXAMPLE.is_file():
            for count, (name, sequence) in enumerate(_records(_read_text(UNIPROT_EXAMPLE))):
                if count >= uniprot_sequences:
                    break
                if sequence not in seen:
                    seen.add(sequence)
                    handle.write(f">{name}\n{sequence}\n")


def _write_nucleotide_fasta(path: Path, data: Path) -> None:
    with open(path, "w") as handle:
        made1 = HMMER_TUTORIAL / "MADE1.sto"
        if made1.is_file():
            rows: dict[str, str] = {}
            for line in made1.read_text().splitlines():
                parts = line.split()
                if len(parts) == 2 and not line.startswith("#"):
                    rows[parts[0]] = rows.get(parts[0], "") + parts[1]
            for name, aligned in rows.items():
                handle.write(f">{name}\n{''.join(c for c in aligned.upper() if c.isalpha())}\n")
        target = HMMER_TUTORIAL / "dna_target.fa"
        if target.is_file():
            handle.write(target.read_text())
        for a2m in sorted((data / "alignments").rglob("*.a2m")):
            for index, (_name, aligned) in enumerate(_records(_read_text(a2m))):
                sequence = "".join(char for char in aligned.upper() if char.isalpha())
                handle.write(f">{a2m.stem}|{index}\n{sequence}\n")


def _template_chains(mmcif_dir: Path) -> list[tuple[str, str]]:
    """(pdbid_chain, sequence) of every protein chain, named as in PDB's pdb_seqres.txt."""
    chains: dict[str, str] = {}
    for path in sorted(mmcif_dir.glob("*.cif")):
        for chain in read_mmcif(path).chains:
            if chain.molecule_type == "protein":
                chains.setdefault(f"{path.stem.lower()}_{chain.auth_chain_id}", chain.sequence)
    if not chains:
        raise ValueError(f"no protein chains found in the mmCIF files of {mmcif_dir}")
    return list(chains.items())


def _collect_template_mmcifs(data: Path, folder: Path) -> Path:
    """The sample templates plus the sample PDB structures, as <pdb_id>.cif (the template folder layout).

    With the structures among the templates, their homologs (the AlphaFold DB H-Ras model and
    721P) get template features; a structure's own entry is dropped by the release-date filter.
    """
    folder.mkdir(parents=True, exist_ok=True)
    for path in sorted((data / "templates" / "mmcif").glob("*.cif")):
        shutil.copy(path, folder / path.name.lower())
    for path in sorted((data / "structures").glob("*.cif")):
        pdb_id = path.stem.split("-")[0].lower()
        if re.fullmatch(r"\d[a-z0-9]{3}", pdb_id):
            shutil.copy(path, folder / f"{pdb_id}.cif")
    return folder


def _run(command: list[str], cwd: Path | None = None) -> None:
    completed = subprocess.run(command, cwd=cwd, capture_output=True, text=True)
    if completed.returncode != 0:
        raise RuntimeError(
            f"{' '.join(command)} failed with status {completed.returncode}:\n{completed.stderr[-2000:]}"
        )


def _mmseqs_createdb(fasta: Path, prefix: Path) -> Path:
    prefix.parent.mkdir(parents=True, exist_ok=True)
    _run([resolve_binary("mmseqs"), "createdb", str(fasta), str(prefix), "-v", "1"])
    return prefix


def cstranslate_binary() -> str:
    """cstranslate from PATH, else the best Debian per-CPU build this machine can run."""
    try:
        return resolve_binary("cstranslate")
    except ToolNotFoundError:
        pass
    flags = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    for build in CSTRANSLATE_BUILDS:
        candidate = Path(f"/usr/libexec/hhsuite/cstranslate-{build}")
        if candidate.is_file() and (build == "plain" or build in flags):
            return str(candidate)
    raise ToolNotFoundError("cstranslate", message="cstranslate not found on PATH or in /usr/libexec/hhsuite")


def _build_hhsuite(prefix: Path, entries: dict[str, str]) -> Path:
    """HH-suite database ``prefix``_a3m.ff{data,index} + ``prefix``_cs219.ff{data,index} from A3M texts."""
    if not entries:
        raise ValueError(f"no A3M entries to build the HH-suite database {prefix}")
    prefix.parent.mkdir(parents=True, exist_ok=True)
    staging = prefix.parent / (prefix.name + "_a3m_files")
    staging.mkdir(exist_ok=True)
    for name, text in entries.items():
        (staging / name).write_text(text)
    a3m = f"{prefix}_a3m"
    _run([resolve_binary("ffindex_build"), "-s", f"{a3m}.ffdata", f"{a3m}.ffindex", str(staging)])
    shutil.rmtree(staging)
    data_dir = next((d for d in HHSUITE_DATA_DIRS if (d / "cs219.lib").is_file()), None)
    if data_dir is None:
        raise FileNotFoundError(f"HH-suite context library cs219.lib not found in {HHSUITE_DATA_DIRS}")
    _run(
        [
            cstranslate_binary(),
            "-f",
            "-x",
            "0.3",
            "-c",
            "4",
            "-I",
            "a3m",
            "-b",
            "-i",
            a3m,
            "-o",
            f"{prefix}_cs219",
            "-A",
            str(data_dir / "cs219.lib"),
            "-D",
            str(data_dir / "context_data.lib"),
        ]
    )
    return prefix


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out_dir", help="folder to build the databases and pipeline.toml in")
    parser.add_argument(
        "--data",
        default=str(Path(__file__).resolve().parents[3] / "shared" / "data"),
        help="the sample data folder (default: ../shared/data next to the repository)",
    )
    parser.add_argument("--threads", type=int, default=1, help="CPU threads per tool run")
    parser.add_argument(
        "--template-tool",
        default="hhsearch",
        choices=["hhsearch", "hmmsearch", "mmseqs"],
        help="template search tool written into pipeline.toml (default: hhsearch, as AlphaFold2)",
    )
    args = parser.parse_args()
    databases = build_test_databases(args.out_dir, args.data)
    config = write_pipeline_config(
        databases, Path(args.out_dir) / "pipeline.toml", threads=args.threads, template_tool=args.template_tool
    )
    print(config)


if __name__ == "__main__":
    main()
