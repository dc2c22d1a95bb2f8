"""Bad input to the newer commands (search, export, plot, train's recipe options, predict) is one
line naming the file, record or option, with exit status 2; a refused run writes nothing; a batch
job records a failing input and carries on; an output cut short (the disk fills) is never left
half-written under its final name, and the file it would have replaced is intact.

The commands run in-process through click's CliRunner, inside the same error boundary as the
installed `featurecache` script (tests/reliability/test_cli_errors.py runs that script itself),
on the tiny cache and one-step training run of the session (tests/reliability/_tiny.py).
"""

from __future__ import annotations

import resource
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from featurecache.cli import cli
from featurecache.store.verify import verify_cache
from tests.reliability._tiny import TARGET, TINY_PREDICT, TINY_TRAIN, checkpoint_of, pipeline_config

pytestmark = pytest.mark.usefixtures("shared_data")


def _invoke(args: list[str]):
    result = CliRunner().invoke(cli, [str(arg) for arg in args])
    output = result.output  # stdout and stderr, as a terminal shows them
    assert result.exception is None or isinstance(result.exception, SystemExit), (
        f"featurecache {' '.join(map(str, args))} raised {result.exception!r}"
    )
    assert "Traceback" not in output, output
    return result, output


def _error_line(output: str) -> str:
    lines = [line for line in output.splitlines() if line.startswith("Error")]
    assert len(lines) == 1, output
    return lines[0]


def _bad_files(tmp: Path, run: Path, cache: Path) -> dict[str, Path]:
    """Files and folders a user passes by mistake, each made here from the real run and cache."""
    files = {"a_file": tmp / "a-file.txt", "plain_folder": tmp / "plain-folder", "never": tmp / "never-written"}
    files["a_file"].write_text("not a folder\n")
    files["plain_folder"].mkdir()
    log = (run / "log.jsonl").read_bytes()
    for name, content in {
        "truncated_log": log[: len(log) // 3],  # cut inside its first (only) record
        "garbled_log": b'{"step": 1, "loss"\n' + log,
        "empty_log": b"",
        "text_loss_log": log.replace(b'"loss": ', b'"loss": "high", "old_loss": ', 1),
    }.items():
        files[name] = tmp / name
        files[name].mkdir()
        (files[name] / "log.jsonl").write_bytes(content)
    checkpoint = checkpoint_of(run)
    files["truncated_checkpoint"] = tmp / "truncated.pt"
    files["truncated_checkpoint"].write_bytes(checkpoint.read_bytes()[:4096])
    files["empty_checkpoint"] = tmp / "empty.pt"
    files["empty_checkpoint"].write_bytes(b"")
    files["foreign_checkpoint"] = tmp / "foreign.pt"
    torch.save({"weights": torch.zeros(3)}, files["foreign_checkpoint"])
    state = torch.load(checkpoint, weights_only=False)
    files["config_not_dict_checkpoint"] = tmp / "config-not-dict.pt"
    torch.save({**state, "model_config": "tiny"}, files["config_not_dict_checkpoint"])
    # weights of one model labelled with another's settings (a checkpoint of another preset or depth)
    files["mislabelled_checkpoint"] = tmp / "mislabelled.pt"
    mislabelled = {**state["model_config"], "trunk": {**state["model_config"]["trunk"], "pairformer_blocks": 2}}
    torch.save({**state, "model_config": mislabelled}, files["mislabelled_checkpoint"])
    files["no_optimizer_checkpoint"] = tmp / "no-optimizer.pt"
    torch.save({name: value for name, value in state.items() if name != "optimizer"}, files["no_optimizer_checkpoint"])
    files["nan_step_log"] = tmp / "nan_step_log"
    files["nan_step_log"].mkdir()
    (files["nan_step_log"] / "log.jsonl").write_bytes(log.replace(b'"step": 1,', b'"step": NaN,', 1))
    files["config"] = pipeline_config(tmp)
    files["query"] = tmp / "query.fasta"
    files["query"].write_text(">A mol:protein\nMKTAYIAKQRQISFVKSHFSRQ\n")
    return files


def _cases(f: dict[str, Path], run: Path, cache: Path) -> list[tuple[str, str, list, tuple[str, ...]]]:
    """(key, what, arguments, words the one line must contain); none may write f['never']."""
    never, checkpoint = f["never"], checkpoint_of(run)
    train = ["train", "--cache", cache, "--out", never, *TINY_TRAIN]
    predict = ["predict", "--cache", cache, TARGET, "--checkpoint", checkpoint, "--out", never, *TINY_PREDICT]
    search = ["search", f["query"], "--config", f["config"], "--out", never, "--executor", "inline", "--no-progress"]
    with_checkpoint = lambda name: [*predict, "--checkpoint", f[name]]  # noqa: E731 - the later option wins
    return [
        (
            "plot_truncated_log",
            "plot of a run whose log.jsonl was cut inside its only record",
            ["plot", f["truncated_log"], "--out", never.with_suffix(".png")],
            ("log.jsonl", "no training step"),
        ),
        (
            "plot_garbled_log",
            "plot of a log.jsonl with a line that is not JSON",
            ["plot", f["garbled_log"], "--out", never.with_suffix(".png")],
            ("log.jsonl", "line 1", "not JSON"),
        ),
        (
            "plot_empty_log",
            "plot of an empty log.jsonl",
            ["plot", f["empty_log"], "--out", never.with_suffix(".png")],
            ("log.jsonl",),
        ),
        (
            "plot_wrong_type",
            "plot of a log whose loss is text, not a number",
            ["plot", f["text_loss_log"], "--out", never.with_suffix(".png")],
            ("log.jsonl", "line 1", "loss"),
        ),
        (
            "plot_nan_step",
            "plot of a log whose step is NaN",
            ["plot", f["nan_step_log"], "--out", never.with_suffix(".png")],
            ("log.jsonl", "line 1", "step"),
        ),
        ("plot_no_log", "plot of a folder that is no training run", ["plot", f["plain_folder"]], ("log.jsonl",)),
        ("plot_run_is_file", "plot of a file instead of a run folder", ["plot", f["a_file"]], ("a-file.txt", "file")),
        (
            "plot_out_below_file",
            "plot --out inside a path that is a file",
            ["plot", run, "--out", f["a_file"] / "plot.png"],
            ("--out", "not a folder"),
        ),
        (
            "plot_out_suffix",
            "plot --out with a suffix matplotlib cannot write",
            ["plot", run, "--out", never.with_suffix(".txt")],
            ("--out", ".png"),
        ),
        (
            "export_missing_key",
            "export of a key the cache does not hold",
            ["export", cache, "no-such-target", "--format", "af3-json", "--out", never],
            ("no-such-target",),
        ),
        (
            "export_empty_key",
            "export of an empty key",
            ["export", cache, "", "--format", "a3m", "--out", never],
            ("no feature record", "''"),
        ),
        (
            "export_not_a_cache",
            "export from a folder that is not a cache",
            ["export", f["plain_folder"], TARGET, "--format", "a3m", "--out", never],
            ("plain-folder", "not a cache"),
        ),
        (
            "export_cache_is_file",
            "export from a file given as the cache",
            ["export", f["a_file"], TARGET, "--format", "a3m", "--out", never],
            ("a-file.txt", "is a file"),
        ),
        (
            "export_out_is_file",
            "export --out that is a file",
            ["export", cache, TARGET, "--format", "a3m", "--out", f["a_file"]],
            ("--out", "is a file"),
        ),
        (
            "export_bad_format",
            "export --format that does not exist",
            ["export", cache, TARGET, "--format", "pdb", "--out", never],
            ("--format", "pdb"),
        ),
        ("train_accumulate_0", "train --accumulate 0", [*train, "--accumulate", "0"], ("--accumulate", "0")),
        ("train_accumulate_text", "train --accumulate two", [*train, "--accumulate", "two"], ("--accumulate", "two")),
        (
            "train_warmup_float",
            "train --warmup 1.5 (an integer option)",
            [*train, "--warmup", "1.5"],
            ("--warmup", "1.5"),
        ),
        (
            "train_validation_fraction_1",
            "train --validation-fraction 1 (outside [0, 1))",
            [*train, "--validation-fraction", "1"],
            ("--validation-fraction", "1"),
        ),
        (
            "train_validation_fraction_negative",
            "train --validation-fraction -0.1",
            [*train, "--validation-fraction", "-0.1"],
            ("--validation-fraction", "-0.1"),
        ),
        (
            "train_validation_fraction_nan",
            "train --validation-fraction nan",
            [*train, "--validation-fraction", "nan"],
            ("--validation-fraction", "nan"),
        ),
        (
            "train_validation_key_missing",
            "train --validation-keys naming a key the cache lacks",
            [*train, "--validate-every", "1", "--validation-keys", "no-such-target"],
            ("--validation-keys", "no-such-target"),
        ),
        (
            "train_validation_holds_all",
            "train holding out every target of the cache",
            [*train, "--validate-every", "1", "--validation-keys", TARGET],
            ("held out",),
        ),
        (
            "train_validate_without_targets",
            "train --validate-every without held-out targets",
            [*train, "--validate-every", "1"],
            ("--validate-every",),
        ),
        (
            "train_validation_steps_0",
            "train --validation-sampler-steps 0",
            [*train, "--validation-sampler-steps", "0"],
            ("--validation-sampler-steps", "0"),
        ),
        (
            "train_pair_shards_3",
            "train --pair-shards 3 on a world of 1 rank",
            [*train, "--pair-shards", "3"],
            ("--pair-shards", "3"),
        ),
        ("train_pair_shards_0", "train --pair-shards 0", [*train, "--pair-shards", "0"], ("--pair-shards", "0")),
        ("train_lr_inf", "train --lr inf", [*train, "--lr", "inf"], ("--lr", "inf")),
        (
            "train_weight_decay_nan",
            "train --weight-decay nan",
            [*train, "--weight-decay", "nan"],
            ("--weight-decay", "nan"),
        ),
        (
            "train_crop_mode_nan",
            "train --crop-mode-probs nan nan nan",
            [*train, "--crop-mode-probs", "nan", "nan", "nan"],
            ("--crop-mode-probs", "nan"),
        ),
        ("train_beta_1", "train --adam-beta1 1", [*train, "--adam-beta1", "1"], ("--adam-beta1", "1")),
        ("train_seed_negative", "train --seed -5", [*train, "--seed", "-5"], ("--seed", "-5")),
        ("train_out_is_file", "train --out that is a file", [*train, "--out", f["a_file"]], ("--out", "a-file.txt")),
        (
            "train_tensorboard_is_file",
            "train --tensorboard that is a file",
            [*train, "--tensorboard", f["a_file"]],
            ("--tensorboard", "a-file.txt"),
        ),
        (
            "train_not_a_cache",
            "train on a folder that is not a cache",
            [*train, "--cache", f["plain_folder"]],
            ("plain-folder", "not a cache"),
        ),
        (
            "train_resume_truncated",
            "train --resume of a checkpoint cut short",
            [*train, "--resume", f["truncated_checkpoint"]],
            ("--resume", "truncated.pt", "not a readable checkpoint"),
        ),
        (
            "train_resume_empty",
            "train --resume of an empty file",
            [*train, "--resume", f["empty_checkpoint"]],
            ("--resume", "empty.pt"),
        ),
        (
            "train_resume_foreign",
            "train --resume of a torch file that is no training checkpoint",
            [*train, "--resume", f["foreign_checkpoint"]],
            ("--resume", "foreign.pt", "not a featurecache"),
        ),
        (
            "train_resume_no_optimizer",
            "train --resume of a checkpoint without its optimizer state",
            [*train, "--resume", f["no_optimizer_checkpoint"]],
            ("--resume", "no-optimizer.pt", "optimizer"),
        ),
        (
            "predict_missing_key",
            "predict a key the cache does not hold",
            [*predict[:3], "no-such-target", *predict[4:]],
            ("no-such-target",),
        ),
        (
            "predict_not_a_cache",
            "predict from a folder that is not a cache",
            [*predict, "--cache", f["plain_folder"]],
            ("plain-folder", "not a cache"),
        ),
        (
            "predict_checkpoint_missing",
            "predict with a checkpoint that does not exist",
            [*predict, "--checkpoint", f["plain_folder"] / "gone.pt"],
            ("--checkpoint", "gone.pt"),
        ),
        (
            "predict_checkpoint_truncated",
            "predict with a checkpoint cut short",
            with_checkpoint("truncated_checkpoint"),
            ("--checkpoint", "not a readable checkpoint"),
        ),
        (
            "predict_checkpoint_empty",
            "predict with an empty checkpoint file",
            with_checkpoint("empty_checkpoint"),
            ("--checkpoint", "empty.pt"),
        ),
        (
            "predict_checkpoint_foreign",
            "predict with a torch file that is no training checkpoint",
            with_checkpoint("foreign_checkpoint"),
            ("--checkpoint", "not a featurecache"),
        ),
        (
            "predict_checkpoint_config",
            "predict with a checkpoint whose model settings are not a table",
            with_checkpoint("config_not_dict_checkpoint"),
            ("--checkpoint", "not a featurecache"),
        ),
        (
            "predict_checkpoint_other_model",
            "predict with weights of another model depth than its settings say",
            with_checkpoint("mislabelled_checkpoint"),
            ("--checkpoint", "does not load"),
        ),
        (
            "predict_out_is_file",
            "predict --out that is a file",
            [*predict, "--out", f["a_file"]],
            ("--out", "a-file.txt"),
        ),
        (
            "predict_out_below_file",
            "predict --out inside a path that is a file",
            [*predict, "--out", f["a_file"] / "predictions"],
            ("--out", "is a file"),
        ),
        ("predict_seed_huge", "predict --seed 2**70", [*predict, "--seed", str(2**70)], ("--seed",)),
        ("predict_samples_0", "predict --samples 0", [*predict, "--samples", "0"], ("--samples", "0")),
        (
            "search_config_missing",
            "search with a pipeline config that does not exist",
            [*search, "--config", f["plain_folder"] / "gone.toml"],
            ("--config", "gone.toml"),
        ),
        (
            "search_config_not_toml",
            "search with a pipeline config that is not TOML",
            [*search, "--config", f["query"]],
            ("query.fasta", "TOML"),
        ),
        (
            "search_missing_input",
            "search of an input that does not exist",
            ["search", f["plain_folder"] / "gone.fasta", *search[2:]],
            ("gone.fasta", "does not exist"),
        ),
        ("search_out_is_file", "search --out that is a file", [*search, "--out", f["a_file"]], ("--out", "a-file.txt")),
        (
            "search_cache_is_file",
            "search --cache that is a file",
            [*search, "--cache", f["a_file"]],
            ("--cache", "a-file.txt"),
        ),
        (
            "search_max_templates_negative",
            "search --max-templates -1",
            [*search, "--max-templates", "-1"],
            ("--max-templates", "-1"),
        ),
    ]


def test_each_new_command_mistake_is_one_line_with_exit_2(tmp_path, tiny_cache, tiny_run, reliability_report):
    files = _bad_files(tmp_path, tiny_run, tiny_cache)
    rows = []
    for key, what, args, words in _cases(files, tiny_run, tiny_cache):
        result, output = _invoke(args)
        assert result.exit_code == 2, f"{key}: exit {result.exit_code}\n{output}"
        line = _error_line(output)
        for word in words:
            assert word in line, f"{key}: {line!r} does not name {word!r}"
        assert not files["never"].exists() and not files["never"].with_suffix(".png").exists(), (
            f"{key}: a refused command wrote its output"
        )
        rows.append(
            {
                "key": key,
                "what": what,
                "outcome": "exit 2",
                "stage": args[0],
                "message": line.replace(str(tmp_path), "TMP")
                .replace(str(tiny_run), "RUN")
                .replace(str(tiny_cache), "CACHE"),
            }
        )
    assert verify_cache(tiny_cache).ok
    reliability_report["cli_new_commands"] = rows


def test_resume_with_another_model_names_the_settings(tmp_path, tiny_cache, tiny_run):
    """A checkpoint of another depth or preset: the settings that differ, not a list of tensor names."""
    result, output = _invoke(
        [
            "train",
            "--cache",
            tiny_cache,
            "--out",
            tmp_path / "run",
            *TINY_TRAIN,
            "--pairformer-blocks",
            "1",
            "--resume",
            checkpoint_of(tiny_run),
        ]
    )
    assert result.exit_code == 2, output
    line = _error_line(output)
    assert "--resume" in line and "pairformer_blocks 0 there, 1 here" in line, line


def test_a_search_batch_records_an_empty_input_and_carries_on(tmp_path):
    config = pipeline_config(tmp_path)
    good, empty = tmp_path / "good.fasta", tmp_path / "empty.fasta"
    good.write_text(">A mol:protein\nMKTAYIAKQRQISFVKSHFSRQ\n")
    empty.write_text("")
    result, output = _invoke(
        ["search", good, empty, "--config", config, "--out", tmp_path / "out", "--executor", "inline", "--no-progress"]
    )
    assert result.exit_code == 1, output
    assert "empty.fasta" in output and "no FASTA records" in output, output
    assert (tmp_path / "out" / "af3" / "good.json").is_file()


# Outputs cut short: the process may write only half of the file's whole size (RLIMIT_FSIZE), as on a full disk.


def _run_short_of_space(limit: int, *args) -> subprocess.CompletedProcess:
    def limit_file_size() -> None:
        # Python ignores SIGXFSZ, so a write past the limit fails with EFBIG instead of killing it.
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    return subprocess.run(
        [sys.executable, "-m", "featurecache.cli", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=600,
        preexec_fn=limit_file_size,
    )


def _files(folder: Path) -> set[Path]:
    return {path for path in folder.rglob("*") if path.is_file()}


def test_outputs_cut_short_are_never_left_half_written(tmp_path, tiny_cache, tiny_run, reliability_report):
    """plot, stats --plot and export into a disk that fills: exit 2 in one line, no file under the
    output's name (or the earlier file it would replace intact), no temporary file left behind."""
    run = tmp_path / "run"
    shutil.copytree(tiny_run, run)
    export_out = tmp_path / "export"
    cases = [
        ("plot_full_disk", "plot over an earlier figure", ["plot", run], run / "training.png", True),
        (
            "stats_plot_full_disk",
            "stats --plot",
            ["stats", tiny_cache, "--plot", tmp_path / "stats.png"],
            tmp_path / "stats.png",
            False,
        ),
        (
            "export_json_full_disk",
            "export --format af3-json",
            ["export", tiny_cache, TARGET, "--format", "af3-json", "--out", export_out],
            export_out / f"{TARGET}.json",
            False,
        ),
        (
            "export_a3m_full_disk",
            "export --format a3m",
            ["export", tiny_cache, TARGET, "--format", "a3m", "--out", export_out],
            export_out / TARGET,
            False,
        ),
    ]
    rows = []
    for key, what, args, output, keep_earlier in cases:
        assert _invoke(args)[0].exit_code == 0
        written = [output] if output.is_file() else sorted(output.iterdir())
        limit = min(path.stat().st_size for path in written) // 2
        earlier = {path: path.read_bytes() for path in written}
        if not keep_earlier:
            for path in written:
                path.unlink()
        before = _files(tmp_path)
        result = _run_short_of_space(limit, *args)
        assert result.returncode == 2, f"{key}: exit {result.returncode}\n{result.stderr}"
        assert "Traceback" not in result.stderr, result.stderr
        line = _error_line(result.stderr)
        if keep_earlier:
            assert all(path.read_bytes() == content for path, content in earlier.items()), (
                f"{key}: the earlier {output.name} was changed"
            )
        assert _files(tmp_path) == before, f"{key}: left {sorted(_files(tmp_path) ^ before)}"
        rows.append(
            {
                "key": key,
                "what": f"{what}, files capped at {limit} bytes (half its size; RLIMIT_FSIZE)",
                "outcome": "exit 2, no partial file",
                "stage": args[0],
                "message": line.replace(str(tmp_path), "TMP").replace(str(tiny_cache), "CACHE"),
            }
        )
    assert verify_cache(tiny_cache).ok
    reliability_report["outputs_cut_short"] = rows
