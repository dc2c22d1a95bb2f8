"""Does it generalise? Train on >= 100 real PDB entries and validate on >= 10 held out by sequence
cluster (issue 33), through the commands a user runs.

The entries are real PDB structures (PDB data is CC0) found in the test-data folders of public
structure-biology repositories; benchmarks/generalisation/entries.csv names each one's repository,
path, commit and sha256 (of the file's bytes, after gunzip where it is gzipped), and its split
with the reason. The structures themselves are never
committed: `gather` copies them out of the repositories' snapshots into an ignored folder.

    # 1. here (CPU), once per machine: the snapshots (the `fetch` tool puts each repository's git
    #    directory at MIRRORS/<owner>+<name>/repo) -> .devdata/general/inputs -> the cache
    python3 benchmarks/generalisation.py prepare --mirrors /work/.mirror
    # 2. on the GPU: featurecache train with --validate-every (benchmarks/device_plan.sh general_start)
    # 3. here, with the run's log.jsonl back: the validation curve into RESULTS.md / results.csv
    python3 benchmarks/generalisation.py record OUT

Sub-commands:
  survey           every file of the snapshots in --mirrors that passes the criteria below, as
                   entries.csv rows (split empty) on stdout: how the entries were found
  gather           entries.csv's files out of the snapshots (sha256 checked) into --inputs, one
                   <pdb id>.cif each; a PDB-format source is converted by featurecache's own reader
                   (io/pdb.py: the block `precompute` would parse from it)
  cache            `featurecache precompute` of --inputs into --cache: no sequence database exists
                   here, so every MSA is the query alone (no --alignments, no search tools), and no
                   templates; zstd records, 1 shard
  split            the train / validation split from the cache's own clusters (the manifest's
                   "sampling" table: MMseqs2 at 40 % identity for proteins, 100 % for nucleic
                   acids, identical sequence for peptides, as AF3 SI 2.5.3) -> entries.csv
  check            the split of entries.csv still holds on the cache: no validation entry shares a
                   polymer cluster with a training entry, >= 100 train and >= 10 validation
  prepare          gather + cache + check
  keys             the validation keys, comma-separated (for `featurecache train --validation-keys`)
  ccd OUT          biotite's CCD cut to the components the validation entries in --inputs use (and
                   the standard residues), as a components.bcif at OUT: the GPU's carry has no room
                   for the whole 63 MB dictionary that `featurecache predict` reads when it writes
                   the held-out entries' mmCIFs (device_plan.sh puts it in biotite's place there)
  run OUT          `featurecache train` on the cache (--preset small, CUDA graphs on a GPU) with
                   --validate-every on the validation entries, until --minutes have passed (then it
                   is stopped) or --steps are done (without a GPU: the tiny preset at crop 128 on
                   the CPU, a proxy for the GPU figure); the run's settings and stamp to
                   OUT/generalisation.json, its log to OUT/run/log.jsonl. The first validation pass
                   is at step 0: the untrained model the curve must end clearly above.
                   --smoke: the same path on the CPU at the tiny preset, a few steps, the first 3
                   validation entries (a check of the plumbing, not a figure: the other validation
                   entries are trained on then)
  record OUT       OUT/run/log.jsonl's validation lines: the table and curve into RESULTS.md and
                   results.csv (benchmark "generalisation", or --results DIR's copies of them), and
                   the figure OUT/generalisation.png (`plot OUT` draws it alone)

The split: entries are linked when they share a polymer chain cluster (ligand clusters do not link:
SO4 or MG would join everything); validation takes whole connected groups, smallest first, so no
validation entry has a chain within 40 % identity of a training entry's. Ligands are not held out
(AF3 clusters them by CCD code; a validation entry's cofactor may occur in training).
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import dataclasses
import gzip
import hashlib
import json
import math
import os
import pathlib
import re
import subprocess
import sys
import time

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

ENTRIES = HERE / "generalisation" / "entries.csv"
DEVDATA = HERE.parent / ".devdata" / "general"
CLI = [sys.executable, "-m", "featurecache.cli"]

# What an entry must be (checked by `survey` on the file itself)
METHOD = "X-RAY DIFFRACTION"
MAX_RESOLUTION = 3.5  # Angstrom
POLYMER_RESIDUES = (50, 800)  # residues in the polymer chains' full sequences
MIN_TRAIN, MIN_VALIDATION = 100, 10  # issue 33
VALIDATION_TARGET = 12  # held out: a little over the minimum, in case one fails later
# A file that is the entry as the PDB distributes it: "1abc.cif", "pdb1abc.ent.gz", "1ABC.pdb";
# edited copies ("3eiy_stripped_ele.cif", "3SGB-subset.pdb") are left out by their names.
ENTRY_FILE = re.compile(r"^(?:pdb)?(\d[a-z0-9]{3})\.(cif|mmcif|pdb|ent)(\.gz)?$", re.IGNORECASE)
MAX_FILE_BYTES = 4_000_000  # snapshots lack files of 4 MiB and more

COLUMNS = (
    "pdb_id",
    "split",
    "split_reason",
    "repository",
    "path",
    "commit",
    "sha256",
    "source_format",
    "method",
    "resolution",
    "polymer_residues",
    "polymer_chains",
    "ligands",
)


# --- the entries file --------------------------------------------------------------------------


def read_entries(path: pathlib.Path = ENTRIES) -> list[dict]:
    with open(path, newline="") as handle:
        return list(csv.DictReader(handle))


def write_entries(entries: list[dict], path: pathlib.Path | None = ENTRIES) -> None:
    """Entries as CSV, sorted by PDB id, into `path` (None: stdout)."""
    with contextlib.ExitStack() as stack:
        handle = sys.stdout if path is None else stack.enter_context(open(path, "w", newline=""))
        writer = csv.DictWriter(handle, COLUMNS, lineterminator="\n")
        writer.writeheader()
        writer.writerows(sorted(entries, key=lambda entry: entry["pdb_id"]))


# --- survey and gather -------------------------------------------------------------------------


def snapshot(mirrors: pathlib.Path, repository: str) -> pathlib.Path:
    """The git directory `fetch` made for `repository` ("owner/name")."""
    git_dir = mirrors / repository.replace("/", "+", 1) / "repo"
    if not git_dir.is_dir():
        raise SystemExit(f"{git_dir}: no snapshot of {repository} (fetch github:{repository} first)")
    return git_dir


def git(git_dir: pathlib.Path, *args: str) -> bytes:
    return subprocess.run(["git", "--git-dir", str(git_dir), *args], check=True, capture_output=True).stdout


def file_bytes(git_dir: pathlib.Path, commit: str, path: str) -> bytes:
    """A file of a snapshot at `commit`, decompressed when gzipped."""
    data = git(git_dir, "cat-file", "blob", f"{commit}:{path}")
    return gzip.decompress(data) if path.lower().endswith(".gz") else data


def mmcif_text(data: bytes, source: str) -> tuple[str, str]:
    """(mmCIF text, source format) of an entry file: an mmCIF as it is, a PDB-format file as the
    block featurecache's reader converts it into (io/pdb.py)."""
    from featurecache.io.common import decode_text
    from featurecache.io.pdb import looks_like_pdb, pdb_to_mmcif_block

    text = decode_text(data, source)
    if not looks_like_pdb(text):
        return text, "mmcif"
    return pdb_to_mmcif_block(text, source, warnings=[]).as_string(), "pdb"


def describe(text: str) -> dict | None:
    """The survey's columns of one entry, or None when it fails a criterion (or is no structure)."""
    import gemmi

    try:
        block = gemmi.cif.read_string(text).sole_block()
        structure = gemmi.make_structure_from_block(block)
    except (RuntimeError, ValueError):
        return None
    method = " ".join(block.find_values("_exptl.method")).strip("'\" ").upper()
    entity_lengths = {
        entity.name: len(entity.full_sequence)
        for entity in structure.entities
        if entity.entity_type == gemmi.EntityType.Polymer
    }
    if len(structure) != 1 or method != METHOD or not 0 < structure.resolution <= MAX_RESOLUTION or not entity_lengths:
        return None
    model = structure[0]
    chains = [subchain for subchain in model.subchains() if subchain.check_polymer_type() != gemmi.PolymerType.Unknown]
    residues = sum(
        entity_lengths.get(structure.get_entity_of(chain).name, 0) if structure.get_entity_of(chain) else 0
        for chain in chains
    )
    if not POLYMER_RESIDUES[0] <= residues <= POLYMER_RESIDUES[1]:
        return None
    ligands = sorted(
        {
            residue.name
            for chain in model
            for residue in chain
            if residue.het_flag == "H" and residue.name not in ("HOH", "DOD")
        }
    )
    return {
        "method": method,
        "resolution": f"{structure.resolution:.2f}",
        "polymer_residues": str(residues),
        "polymer_chains": str(len(chains)),
        "ligands": " ".join(ligands),
    }


def survey(mirrors: pathlib.Path) -> list[dict]:
    """Every entry file of every snapshot under `mirrors` that passes the criteria; one per PDB id
    (an mmCIF before a PDB-format copy, then the repository first in name order)."""
    found: dict[str, dict] = {}
    for git_dir in sorted(mirrors.glob("*+*/repo")):
        repository = git_dir.parent.name.replace("+", "/", 1)
        commit = git(git_dir, "rev-parse", "HEAD").decode().strip()
        for line in git(git_dir, "ls-tree", "-r", "-l", commit).decode().splitlines():
            meta, path = line.split("\t", 1)
            size = meta.split()[3]
            match = ENTRY_FILE.match(path.rsplit("/", 1)[-1])
            if not match or not size.isdigit() or int(size) > MAX_FILE_BYTES:
                continue
            try:
                data = file_bytes(git_dir, commit, path)
                text, source_format = mmcif_text(data, f"{repository}:{path}")
            except (subprocess.CalledProcessError, OSError, EOFError, ValueError, RuntimeError):
                continue
            columns = describe(text)
            if columns is None:
                continue
            pdb_id = match.group(1).lower()
            entry = {
                "pdb_id": pdb_id,
                "split": "",
                "split_reason": "",
                "repository": repository,
                "path": path,
                "commit": commit,
                "sha256": hashlib.sha256(data).hexdigest(),
                "source_format": source_format,
                **columns,
            }
            known = found.get(pdb_id)
            if known is None or (known["source_format"] == "pdb" and source_format == "mmcif"):
                found[pdb_id] = entry
    return list(found.values())


def gather(entries: list[dict], mirrors: pathlib.Path, inputs: pathlib.Path) -> None:
    """Each entry's file out of its snapshot, checked against its sha256, as inputs/<pdb id>.cif."""
    inputs.mkdir(parents=True, exist_ok=True)
    for entry in entries:
        source = f"{entry['repository']}:{entry['path']}@{entry['commit'][:12]}"
        data = file_bytes(snapshot(mirrors, entry["repository"]), entry["commit"], entry["path"])
        if hashlib.sha256(data).hexdigest() != entry["sha256"]:
            raise SystemExit(f"{source}: sha256 differs from entries.csv's")
        text, _ = mmcif_text(data, source)
        (inputs / f"{entry['pdb_id']}.cif").write_text(text)
    print(f"{len(entries)} entries in {inputs}")


# --- cache and split ---------------------------------------------------------------------------


def build_cache(inputs: pathlib.Path, cache: pathlib.Path) -> None:
    """`featurecache precompute` with query-only MSAs (no database, no alignments, no templates)."""
    subprocess.run(
        [
            *CLI,
            "precompute",
            str(inputs),
            "--cache",
            str(cache),
            "--executor",
            "inline",
            "--shards",
            "1",
            "--no-progress",
        ],
        check=True,
    )


def target_clusters(cache: pathlib.Path) -> dict[str, set[str]]:
    """Each cached target's polymer chain clusters (the manifest's sampling table)."""
    from featurecache.store.manifest import SAMPLING_TABLE, read_manifest

    sampling = read_manifest(cache).index.get(SAMPLING_TABLE) or {}
    return {
        target: {chain["cluster"] for chain in entry["chains"] if chain["molecule_type"] != "ligand"}
        for target, entry in sampling.items()
    }


def linked_groups(clusters: dict[str, set[str]]) -> list[list[str]]:
    """Targets joined (transitively) by a shared polymer cluster: the groups a split must keep whole."""
    parent = {target: target for target in clusters}

    def root(target: str) -> str:
        while parent[target] != target:
            parent[target] = parent[parent[target]]
            target = parent[target]
        return target

    by_cluster: dict[str, str] = {}
    for target in sorted(clusters):
        for cluster in sorted(clusters[target]):
            first = by_cluster.setdefault(cluster, target)
            parent[root(target)] = root(first)
    groups: dict[str, list[str]] = {}
    for target in sorted(clusters):
        groups.setdefault(root(target), []).append(target)
    return list(groups.values())


def split(entries: list[dict], clusters: dict[str, set[str]]) -> list[dict]:
    """Validation: whole linked groups, one-entry groups first, alternating between entries with
    and without ligands and between one and several chains (a mixed held-out set), until
    VALIDATION_TARGET; the rest trains. An entry precompute left out is marked "excluded"."""
    by_id = {entry["pdb_id"]: entry for entry in entries}
    groups = linked_groups({target: clusters[target] for target in clusters if target in by_id})
    singles = sorted(
        (group[0] for group in groups if len(group) == 1),
        key=lambda target: (int(by_id[target]["polymer_chains"]) > 1, bool(by_id[target]["ligands"]), target),
    )
    kinds: dict[tuple[bool, bool], list[str]] = {}
    for target in singles:
        kinds.setdefault((int(by_id[target]["polymer_chains"]) > 1, bool(by_id[target]["ligands"])), []).append(target)
    held_out: list[str] = []
    while len(held_out) < VALIDATION_TARGET and any(kinds.values()):
        for queue in kinds.values():
            if queue and len(held_out) < VALIDATION_TARGET:
                held_out.append(queue.pop(len(queue) // 2))  # from the middle of the id order: no bias to old ids
    for entry in entries:
        target = entry["pdb_id"]
        if target not in clusters:
            entry["split"], entry["split_reason"] = (
                "excluded",
                "not in the cache (curation or featurization left it out)",
            )
        elif target in held_out:
            entry["split"] = "validation"
            entry["split_reason"] = (
                "its polymer clusters (" + " ".join(sorted(clusters[target])) + ") occur in no other entry"
            )
        else:
            entry["split"] = "train"
            entry["split_reason"] = "shares no polymer cluster with a validation entry"
    return entries


def check(entries: list[dict], clusters: dict[str, set[str]]) -> None:
    """Raise SystemExit unless the split holds on this cache."""
    train = [entry["pdb_id"] for entry in entries if entry["split"] == "train"]
    validation = [entry["pdb_id"] for entry in entries if entry["split"] == "validation"]
    missing = sorted(target for target in train + validation if target not in clusters)
    if missing:
        raise SystemExit(f"entries.csv: {len(missing)} entries are not in the cache: {', '.join(missing)}")
    seen = set().union(*(clusters[target] for target in train))
    leaks = {target: sorted(clusters[target] & seen) for target in validation if clusters[target] & seen}
    if leaks:
        raise SystemExit(f"entries.csv: validation entries share clusters with training entries: {leaks}")
    if len(train) < MIN_TRAIN or len(validation) < MIN_VALIDATION:
        raise SystemExit(
            f"entries.csv: {len(train)} train and {len(validation)} validation entries, "
            f"need >= {MIN_TRAIN} and >= {MIN_VALIDATION}"
        )
    print(f"split holds: {len(train)} train, {len(validation)} validation entries, no polymer cluster shared")


def validation_keys(entries: list[dict]) -> list[str]:
    return sorted(entry["pdb_id"] for entry in entries if entry["split"] == "validation")


# --- run ---------------------------------------------------------------------------------------

# The GPU run's settings: issue 33's `small` preset at the crop the overfit run used, a short
# warm-up and a fast EMA for a run of minutes (AF3's 1,000 steps and 0.999 would still weigh the
# untrained weights at its end), one recycling cycle (query-only MSAs give recycling little)
GPU_RUN = {
    "preset": "small",
    "crop_size": 384,
    "diffusion_batch": 32,
    "lr": 1e-3,
    "warmup": 200,
    "ema_decay": 0.99,
    "max_recycling_cycles": 1,
    "validate_every": 250,
    "validation_sampler_steps": 40,
    "checkpoint_every": 500,
    "num_workers": 4,
}
# Without a GPU (a proxy, not issue 33's figure): the tiny preset at crop 128 on one CPU thread,
# ~1 s a step on 2 cores, so a two-hour run takes some thousands of steps; one data worker (the
# other core)
CPU_RUN = {
    "preset": "tiny",
    "crop_size": 128,
    "diffusion_batch": 8,
    "lr": 1e-3,
    "warmup": 100,
    "ema_decay": 0.99,
    "max_recycling_cycles": 1,
    "validate_every": 500,
    "validation_sampler_steps": 40,
    "checkpoint_every": 1000,
    "num_workers": 1,
}
SMOKE_RUN = {
    "preset": "tiny",
    "crop_size": 48,
    "diffusion_batch": 2,
    "lr": 1e-3,
    "warmup": 2,
    "ema_decay": 0.9,
    "max_recycling_cycles": 1,
    "validate_every": 2,
    "validation_sampler_steps": 2,
    "checkpoint_every": 4,
    "num_workers": 2,  # workers forked after validation, as on the GPU (a reader-inheritance bug hid at 0)
}
SMOKE_STEPS, SMOKE_VALIDATION = 4, 3


def run(cache: pathlib.Path, out: pathlib.Path, entries: list[dict], minutes: float, steps: int, smoke: bool) -> dict:
    """`featurecache train` with validation, for `minutes` (its --max-minutes) or `steps`."""
    import torch
    from harness import run_budgeted_train, run_stamp

    cuda = torch.cuda.is_available() and not smoke
    settings = dict(SMOKE_RUN if smoke else GPU_RUN if cuda else CPU_RUN)
    keys = validation_keys(entries)[:SMOKE_VALIDATION] if smoke else validation_keys(entries)
    steps = SMOKE_STEPS if smoke else steps
    out.mkdir(parents=True, exist_ok=True)
    command = [
        *CLI,
        "train",
        "--cache",
        str(cache),
        "--out",
        str(out / "run"),
        "--steps",
        str(steps),
        "--validation-keys",
        ",".join(keys),
        *(item for name, value in settings.items() for item in (f"--{name.replace('_', '-')}", str(value))),
        *(["--cuda-graphs"] if cuda else ["--device", "cpu"]),
    ]
    print("$", " ".join(command), flush=True)
    # on the CPU one thread: a tiny model's OpenMP threads only wait on each other (tests/conftest.py)
    environment = {**os.environ, "OMP_NUM_THREADS": "1"} if not cuda else None
    start = time.monotonic()
    failure = None
    try:
        train_s, stopped = run_budgeted_train(command, minutes, environment)
    except SystemExit as error:  # the curve logged before a crash is still a figure, with the crash beside it
        failure, train_s, stopped = str(error), time.monotonic() - start, False
    result = {
        "command": " ".join(command),
        "stamp": dataclasses.asdict(run_stamp()),
        "settings": settings,
        "steps": steps,
        "minutes": minutes,
        "train_s": train_s,
        "stopped": stopped,
        "smoke": smoke,
        "validation_keys": keys,
        "train_entries": sum(entry["split"] != "excluded" for entry in entries) - len(keys),
        **({"note": failure} if failure else {}),
    }
    (out / "generalisation.json").write_text(json.dumps(result, indent=1))
    if failure:
        raise SystemExit(failure)
    return result


# --- the CCD for the device --------------------------------------------------------------------

# a predicted polymer's residues are matched against these too (prediction/mmcif.py)
STANDARD_RESIDUES = (
    "ALA ARG ASN ASP CYS GLN GLU GLY HIS ILE LEU LYS MET PHE PRO SER THR TRP TYR VAL UNK A C G U N DA DC DG DT DN HOH"
).split()


def ccd_subset(inputs: pathlib.Path, keys: list[str], out: pathlib.Path) -> int:
    """Write biotite's CCD cut to the components of the entries `keys` (files in `inputs`); the count."""
    import gemmi
    import numpy as np
    from biotite.structure.info import get_ccd
    from biotite.structure.io.pdbx import (
        BinaryCIFBlock,
        BinaryCIFCategory,
        BinaryCIFColumn,
        BinaryCIFData,
        BinaryCIFFile,
    )

    codes = set(STANDARD_RESIDUES)
    for key in keys:
        path = inputs / f"{key.split('-')[0].split('_')[0]}.cif"
        if not path.is_file():
            raise SystemExit(f"ccd: {path} does not exist (run `prepare` first)")
        for model in gemmi.read_structure(str(path)):
            codes.update(residue.name for chain in model for residue in chain)
            break
    block = get_ccd()
    kept = BinaryCIFBlock()
    for name, id_column in (("chem_comp", "id"), ("chem_comp_atom", "comp_id"), ("chem_comp_bond", "comp_id")):
        category = block[name]
        rows = np.isin(category[id_column].as_array(str), sorted(codes))
        columns = {}
        for column_name, column in category.items():
            mask = None if column.mask is None else BinaryCIFData(column.mask.array[rows])
            columns[column_name] = BinaryCIFColumn(BinaryCIFData(column.data.array[rows]), mask)
        kept[name] = BinaryCIFCategory(columns)
    file = BinaryCIFFile()
    file["components"] = kept
    out.parent.mkdir(parents=True, exist_ok=True)
    file.write(out)
    return int(np.isin(block["chem_comp"]["id"].as_array(str), sorted(codes)).sum())


# --- record ------------------------------------------------------------------------------------


def validation_curve(log_path: pathlib.Path) -> list[dict]:
    lines = [json.loads(line) for line in log_path.read_text().splitlines() if line.strip()]
    return sorted((line for line in lines if line.get("kind") == "validation"), key=lambda line: line["step"])


def curve_table(curve: list[dict]) -> str:
    def cell(value) -> str:
        return "-" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:.3f}"

    lines = [
        "| step | lDDT | lDDT protein | lDDT ligand | lDDT DNA | lDDT RNA | loss |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for point in curve:
        lines.append(
            f"| {point['step']} | {cell(point.get('lddt'))} | {cell(point.get('lddt_protein'))} | "
            f"{cell(point.get('lddt_ligand'))} | {cell(point.get('lddt_dna'))} | {cell(point.get('lddt_rna'))} | "
            f"{cell(point.get('loss'))} |"
        )
    return "\n".join(lines)


def trend(curve: list[dict]) -> str:
    """A one-line verdict: the end against the untrained start, and whether the trend rises."""
    import numpy as np

    steps = np.array([point["step"] for point in curve], float)
    lddt = np.array([point["lddt"] for point in curve], float)
    slope = float(np.polyfit(steps, lddt, 1)[0]) if len(curve) > 2 else float("nan")
    start = "untrained (step 0)" if curve[0]["step"] == 0 else f"step {curve[0]['step']}"
    fit = f"; least-squares slope {slope * 1000:+.4f} per 1,000 steps" if math.isfinite(slope) else ""
    return (
        f"validation lDDT {lddt[0]:.3f} at {start}, {lddt[-1]:.3f} at step {int(steps[-1])} "
        f"(best {lddt.max():.3f}){fit}"
    )


def whole_entries(out: pathlib.Path, inputs: pathlib.Path) -> tuple[list[dict], str]:
    """`featurecache evaluate` of the top-ranked whole-entry predictions in OUT/predictions
    (device_plan.sh general_collect) against the deposited structures in `inputs`: the scores and
    a table with their medians ('' when the run brought no predictions back)."""
    import statistics

    folder = out / "predictions"
    scores = []
    # predict's layout: the top-ranked sample of entry KEY at KEY/KEY_model.cif
    for path in sorted(folder.glob("*/*_model.cif")) if folder.is_dir() else []:
        key = path.name.removesuffix("_model.cif")
        if key != path.parent.name:
            continue
        truth = inputs / f"{key}.cif"
        evaluated = subprocess.run(
            [*CLI, "evaluate", "--json", "--truth", str(truth), str(path)], capture_output=True, text=True
        )
        if evaluated.returncode != 0:
            raise SystemExit(f"{path}: featurecache evaluate failed: {evaluated.stderr.strip()}")
        scores.append({"key": key, **json.loads(evaluated.stdout.splitlines()[0])})
    if not scores:
        return [], ""
    lines = ["| entry | CA atoms | CA-RMSD Å | all-atom lDDT | CA-lDDT |", "| --- | ---: | ---: | ---: | ---: |"]
    lines += [
        f"| {s['key']} | {s['ca_atoms']} | {s['ca_rmsd']:.1f} | {s['lddt']:.3f} | {s['ca_lddt']:.3f} |" for s in scores
    ]
    median = {name: statistics.median(s[name] for s in scores) for name in ("ca_rmsd", "lddt", "ca_lddt")}
    lines.append(f"| median | | {median['ca_rmsd']:.1f} | {median['lddt']:.3f} | {median['ca_lddt']:.3f} |")
    return scores, "\n".join(lines)


def record(out: pathlib.Path, results: pathlib.Path | None = None, inputs: pathlib.Path = DEVDATA / "inputs") -> None:
    """The run in OUT into RESULTS.md and results.csv (benchmarks/, or the copies in `results`)."""
    import records
    from harness import RunStamp
    from records import Row

    result = json.loads((out / "generalisation.json").read_text())
    curve = validation_curve(out / "run" / "log.jsonl")
    if not curve:
        raise SystemExit(f"{out}/run/log.jsonl: no validation line (did the run reach --validate-every?)")
    stamp = RunStamp(**result["stamp"])
    settings = result["settings"]
    shape = (
        f"{result['train_entries']} train / {len(result['validation_keys'])} validation entries, "
        f"{settings['preset']} preset, crop {settings['crop_size']}"
    )
    rows = [
        Row("generalisation", "featurecache", f"{shape}; step {point['step']}", f"validation {name}", point[name])
        for point in curve
        for name in ("lddt", "lddt_protein", "lddt_ligand")
        if point.get(name) is not None and not math.isnan(point[name])
    ]
    steps_done = max(
        (
            json.loads(line).get("step", 0)
            for line in (out / "run" / "log.jsonl").read_text().splitlines()
            if line.strip()
        ),
        default=0,
    )
    section = "\n".join(
        [
            f"### {shape} ({stamp.header()})",
            "",
            f"`{result['command']}`",
            "",
            f"{steps_done} steps in {result['train_s']:.0f} s "
            f"({'stopped by the budget' if result['stopped'] else 'all steps done'}); validation "
            f"({settings['validation_sampler_steps']} sampler steps, EMA weights) every {settings['validate_every']} steps on "
            f"{', '.join(result['validation_keys'])} (held out by 40 % sequence cluster: "
            f"benchmarks/generalisation/entries.csv); MSAs are the query alone (no sequence database).",
            "",
            curve_table(curve),
            "",
            trend(curve) + ".",
            *([""] + [result["note"]] if result.get("note") else []),
        ]
    )
    scores, table = whole_entries(out, inputs)
    if scores:
        section += (
            "\n\nThe held-out entries whole (uncropped) through `featurecache predict --samples 5 --steps 200 "
            "--cycles 1 --cuda-graphs` with the run's last EMA weights, the top-ranked sample scored by "
            "`featurecache evaluate` against the deposited structure:\n\n" + table
        )
        rows += [
            Row("generalisation", "featurecache", f"{shape}; whole entry {s['key']}", name, s[name])
            for s in scores
            for name in ("ca_rmsd", "lddt")
        ]
    results_md, results_csv = (
        (results / "RESULTS.md", results / "results.csv")
        if results is not None
        else (records.RESULTS_MD, records.RESULTS_CSV)
    )
    records.append_rows(stamp, rows, results_csv)
    records.add_section(
        "generalisation", section, "Generalisation: validation on held-out PDB entries (issue 33)", results_md
    )
    records.write_headline(results_md, results_csv)
    print(f"recorded in {results_md} and {results_csv}")


def plot(out: pathlib.Path) -> pathlib.Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    log = [json.loads(line) for line in (out / "run" / "log.jsonl").read_text().splitlines() if line.strip()]
    train = [line for line in log if line.get("kind", "train") == "train" and "loss" in line]
    curve = validation_curve(out / "run" / "log.jsonl")
    figure, (loss_axis, lddt_axis) = plt.subplots(1, 2, figsize=(10, 4))
    loss_axis.plot([line["step"] for line in train], [line["loss"] for line in train], linewidth=0.5, label="train")
    loss_axis.plot([point["step"] for point in curve], [point["loss"] for point in curve], "o-", label="validation")
    loss_axis.set(title="loss", xlabel="step", yscale="log")
    loss_axis.legend(fontsize=8)
    for name in ("lddt", "lddt_protein", "lddt_ligand"):
        points = [(point["step"], point[name]) for point in curve if point.get(name) is not None]
        if points:
            lddt_axis.plot(*zip(*points), "o-", label=name)
    lddt_axis.set(title="validation lDDT (held-out entries)", xlabel="step", ylim=(0, 1))
    lddt_axis.legend(fontsize=8)
    figure.tight_layout()
    path = out / "generalisation.png"
    figure.savefig(path, dpi=120)
    return path


# --- the command line --------------------------------------------------------------------------


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "command",
        choices=("survey", "gather", "cache", "split", "check", "prepare", "keys", "ccd", "run", "record", "plot"),
    )
    parser.add_argument("out", nargs="?", type=pathlib.Path, help="run / record / plot: the run's OUT folder")
    parser.add_argument(
        "--mirrors",
        type=pathlib.Path,
        default=pathlib.Path("/work/.mirror"),
        help="folder of the fetched snapshots (<owner>+<name>/repo)",
    )
    parser.add_argument("--inputs", type=pathlib.Path, default=DEVDATA / "inputs")
    parser.add_argument("--cache", type=pathlib.Path, default=DEVDATA / "cache")
    parser.add_argument("--entries", type=pathlib.Path, default=ENTRIES)
    parser.add_argument("--minutes", type=float, default=13.0, help="run: wall-clock budget of the training")
    parser.add_argument("--steps", type=int, default=100_000, help="run: training steps at most")
    parser.add_argument("--smoke", action="store_true", help="run: tiny preset, a few steps, on the CPU")
    parser.add_argument(
        "--results",
        type=pathlib.Path,
        metavar="DIR",
        help="record: into DIR/RESULTS.md and DIR/results.csv instead of benchmarks/'s",
    )
    args = parser.parse_args(argv)
    if args.command in ("ccd", "run", "record", "plot") and args.out is None:
        parser.error(f"{args.command} needs the run's OUT folder")
    if args.command == "survey":
        write_entries(survey(args.mirrors), None)
    elif args.command == "keys":
        print(",".join(validation_keys(read_entries(args.entries))))
    elif args.command == "ccd":
        count = ccd_subset(args.inputs, validation_keys(read_entries(args.entries)), args.out)
        print(f"{args.out}: {count} components, {args.out.stat().st_size} bytes")
    elif args.command == "run":
        run(args.cache, args.out, read_entries(args.entries), args.minutes, args.steps, args.smoke)
        print(curve_table(validation_curve(args.out / "run" / "log.jsonl")))
    elif args.command == "record":
        record(args.out, args.results, args.inputs)
        print(plot(args.out))
    elif args.command == "plot":
        print(plot(args.out))
    else:
        entries = read_entries(args.entries)
        if args.command in ("gather", "prepare"):
            used = (
                [entry for entry in entries if entry["split"] != "excluded"] if args.command == "prepare" else entries
            )
            gather(used, args.mirrors, args.inputs)
        if args.command in ("cache", "prepare"):
            build_cache(args.inputs, args.cache)
        if args.command == "split":
            write_entries(split(entries, target_clusters(args.cache)), args.entries)
            entries = read_entries(args.entries)
        if args.command in ("split", "check", "prepare"):
            check(entries, target_clusters(args.cache))


if __name__ == "__main__":
    main()
