"""Property-based fuzz of the command line: whatever the options, files and encodings,

- the exit code is 0, 1, 2 (or click's 2 for usage errors) — never a crash code;
- no Python traceback is printed unless --debug is given;
- a cache that was already written still verifies afterwards.

Examples are bounded (CI) and derandomized per run seed; the commands run in-process through
click's CliRunner with the same error boundary as the installed `featurecache` script.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from featurecache.cli import cli
from featurecache.store.verify import verify_cache
from tests.conftest import SHARED_DATA as DATA
from tests.reliability._tiny import TARGET, TINY_PREDICT, TINY_TRAIN, checkpoint_of, pipeline_config

EXIT_CODES = {0, 1, 2}


@pytest.fixture(scope="module")
def workspace(tmp_path_factory, tiny_run) -> dict[str, Path]:
    """A finished cache, a training run with its checkpoint, a pipeline config, plus a zoo of
    files a user might pass by mistake."""
    root = tmp_path_factory.mktemp("fuzz")
    cache = root / "cache"
    runner = CliRunner()
    result = runner.invoke(
        cli,
        [
            "precompute",
            str(DATA / "structures" / "2q2k.cif"),
            "--alignments",
            str(DATA / "alignments"),
            "--cache",
            str(cache),
            "--executor",
            "inline",
            "--no-progress",
        ],
    )
    assert result.exit_code == 0, result.output
    files = {
        "cache": cache,
        "missing": root / "does-not-exist",
        "folder": root,
        "empty": root / "empty.cif",
        "latin1": root / "latin1.toml",
        "binary": root / "binary.fasta",
        "garbled_json": root / "manifest-copy.json",
        "fasta": root / "ok.fasta",
        "gap_fasta": root / "gaps.fasta",
        "structure": DATA / "structures" / "2q2k.cif",
        "plot_missing_dir": root / "no" / "such" / "plot.png",
        "plot_bad_suffix": root / "plot.xyz",
        "run": shutil.copytree(tiny_run, root / "run"),  # a copy: a fuzzed train --out may write into it
        "checkpoint": checkpoint_of(tiny_run),
        "truncated_checkpoint": root / "truncated.pt",
        "cut_log_run": root / "cut-log-run",
        "config": pipeline_config(root),
        "out": root / "out",
        "plot_in_file": root / "empty.cif" / "plot.png",
    }
    files["truncated_checkpoint"].write_bytes(files["checkpoint"].read_bytes()[:2048])
    files["cut_log_run"].mkdir()
    log = (tiny_run / "log.jsonl").read_bytes()
    (files["cut_log_run"] / "log.jsonl").write_bytes(log + log[: len(log) // 2])  # a run killed mid-line
    files["empty"].write_text("")
    files["latin1"].write_bytes("[search]\nname = 'caf\xe9'\n".encode("latin-1"))
    files["binary"].write_bytes(bytes(range(256)))
    files["garbled_json"].write_text('{"format": 1, "shards": [')
    files["fasta"].write_text(">A mol:protein\nMKTAYIAKQRQISFVKSHFSRQ\n")
    files["gap_fasta"].write_text(">A mol:protein\n--------\n")
    assert verify_cache(cache).ok
    return files


PATH_NAMES = [
    "cache",
    "missing",
    "folder",
    "empty",
    "latin1",
    "binary",
    "garbled_json",
    "fasta",
    "gap_fasta",
    "structure",
    "plot_missing_dir",
    "plot_bad_suffix",
    "run",
    "checkpoint",
    "truncated_checkpoint",
    "cut_log_run",
    "config",
    "out",
    "plot_in_file",
]
INTS = st.sampled_from(["-1", "0", "1", "3", "999999999999", "x", "1.5", ""])
FLOATS = st.sampled_from(["-1", "0", "1e-3", "0.5", "1", "2", "nan", "inf", "-inf", "1e400", "x", ""])
KEYS = st.sampled_from([TARGET, TARGET.upper(), "no-such-target", "", "../2q2k", "2q2k/../x"])
TEXT = st.text(alphabet=st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=12)


def _value(draw, kind: str, files):
    if kind == "int":
        return draw(INTS)
    if kind == "float":
        return draw(FLOATS)
    if kind == "key":
        return draw(st.one_of(KEYS, TEXT))
    if kind == "path":
        return str(files[draw(st.sampled_from(PATH_NAMES))])
    return draw(TEXT)


# command -> (positional argument kinds, {option: kind}); only options that exist on the command
COMMANDS = {
    "precompute": (
        ["path"],
        {
            "--cache": "path",
            "--config": "path",
            "--alignments": "path",
            "--templates": "path",
            "--workers": "int",
            "--shards": "int",
            "--msa-rows-stored": "int",
            "--executor": "text",
        },
    ),
    "stats": (["path"], {"--plot": "path", "--json": "flag"}),
    "verify": (["path"], {"--json": "flag", "--repair": "flag"}),
    "show": (["path", "text"], {"--table": "text"}),
    "publish": (["path", "path"], {}),
    "gc": (["path"], {"--keep": "int"}),
    "search": (["path"], {"--config": "path", "--out": "path", "--cache": "path", "--max-templates": "int"}),
    "export": (["path", "key"], {"--format": "text", "--out": "path"}),
    "plot": (["path"], {"--out": "path"}),
    "train": (
        [],
        {
            "--cache": "path",
            "--out": "path",
            "--resume": "path",
            "--tensorboard": "path",
            "--accumulate": "int",
            "--pair-shards": "int",
            "--validate-every": "int",
            "--validation-keys": "key",
            "--validation-fraction": "float",
            "--validation-sampler-steps": "int",
            "--deterministic": "flag",
            "--lr": "float",
            "--adam-beta1": "float",
            "--adam-beta2": "float",
            "--adam-eps": "float",
            "--weight-decay": "float",
            "--warmup": "int",
            "--lr-decay-factor": "float",
            "--lr-decay-every": "int",
            "--grad-clip": "float",
            "--ema-decay": "float",
            "--seed": "int",
            "--crop-size": "int",
            "--batch-size": "int",
        },
    ),
    "predict": (
        ["key"],
        {
            "--cache": "path",
            "--checkpoint": "path",
            "--out": "path",
            "--samples": "int",
            "--max-tokens": "int",
            "--seed": "int",
            "--kernels": "text",
        },
    ),
}
# Required options a command gets before the drawn ones (a drawn value given later wins), and the
# smallest work: a tiny training step, a two-step prediction, searches run in this process.
BASE_ARGS = {
    "search": lambda files: [
        "--config",
        str(files["config"]),
        "--out",
        str(files["out"]),
        "--executor",
        "inline",
        "--no-progress",
    ],
    "export": lambda files: ["--format", "a3m", "--out", str(files["out"])],
    "train": lambda files: ["--cache", str(files["cache"]), "--out", str(files["out"]), *TINY_TRAIN],
    "predict": lambda files: [
        "--cache",
        str(files["cache"]),
        "--checkpoint",
        str(files["checkpoint"]),
        "--out",
        str(files["out"]),
        *TINY_PREDICT,
    ],
}


@st.composite
def command_lines(draw, files):
    name = draw(st.sampled_from(sorted(COMMANDS)))
    positional, options = COMMANDS[name]
    args = [name] + [_value(draw, kind, files) for kind in positional]
    args += BASE_ARGS[name](files) if name in BASE_ARGS else []
    chosen = draw(st.lists(st.sampled_from(sorted(options)), unique=True, max_size=3)) if options else []
    for option in chosen:
        kind = options[option]
        args += [option] if kind == "flag" else [option, _value(draw, kind, files)]
    if name == "precompute":
        args += ["--executor", "inline", "--no-progress"]  # Ray start-up is too slow per example
    return args


def _run_fuzz(workspace, args) -> int:
    cache = workspace["cache"]
    result = CliRunner().invoke(cli, args, catch_exceptions=True)
    output = result.output + (result.stderr if result.stderr_bytes is not None else "")
    assert result.exception is None or isinstance(result.exception, SystemExit), (
        f"featurecache {' '.join(args)} raised {result.exception!r}"
    )
    assert result.exit_code in EXIT_CODES, f"featurecache {' '.join(args)} exited {result.exit_code}: {output}"
    assert "Traceback" not in output, f"featurecache {' '.join(args)} printed a traceback:\n{output}"
    report = verify_cache(cache)
    assert report.ok, f"after featurecache {' '.join(args)} the cache no longer verifies: {report.format()}"
    return result.exit_code


def test_cli_fuzz(workspace, reliability_report):
    seen: dict[int, int] = {}

    @settings(
        max_examples=80,
        deadline=None,
        derandomize=False,
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    )
    @given(args=command_lines(workspace))
    def check(args):
        code = _run_fuzz(workspace, args)
        seen[code] = seen.get(code, 0) + 1
        # keep the zoo intact for the next example: a publish may have created folders under it,
        # a search, export, train or predict its --out
        if workspace["out"].is_dir():
            shutil.rmtree(workspace["out"])
        for leftover in ("generations", "LATEST"):
            target = workspace["folder"] / leftover
            if target.is_dir():
                shutil.rmtree(target)
            elif target.exists():
                target.unlink()

    check()
    reliability_report["cli_fuzz"] = {
        "examples": sum(seen.values()),
        "commands": sorted(COMMANDS),
        "exit_codes": ", ".join(f"{code}: {n}" for code, n in sorted(seen.items())),
    }


def test_debug_shows_the_traceback(workspace):
    """The same failure with --debug raises instead of printing one line."""
    result = CliRunner().invoke(cli, ["--debug", "stats", str(workspace["garbled_json"])])
    assert result.exit_code != 0 and not isinstance(result.exception, SystemExit)
    plain = CliRunner().invoke(cli, ["stats", str(workspace["garbled_json"])])
    assert plain.exit_code == 2 and isinstance(plain.exception, SystemExit)
    assert len([line for line in plain.output.splitlines() if line.strip()]) == 1, plain.output
