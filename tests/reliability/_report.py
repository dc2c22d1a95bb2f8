"""Render the figures the reliability tests collected as docs/RELIABILITY.md."""

from __future__ import annotations

import datetime
import os
import platform
import sys


def _cell(text: object) -> str:
    """One markdown table cell: single line, pipes escaped, long messages shortened."""
    value = " ".join(str(text).split()).replace("|", "\\|")
    return value if len(value) <= 240 else value[:237] + "..."


def _table(header: list[str], rows: list[list[object]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(_cell(value) for value in row) + " |" for row in rows]
    return lines


def render_report(figures: dict) -> str:
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    lines = [
        "# Reliability report",
        "",
        "Written by the reliability suite itself from one passing run "
        "(`FEATURECACHE_WRITE_RELIABILITY_REPORT=1 python3 -m pytest -q tests/reliability`); "
        "a section appears only if its test passed. Do not edit by hand.",
        "",
        f"Run: {now}, {platform.machine()}, {os.cpu_count()} CPUs, "
        f"Python {sys.version.split()[0]}, {platform.system()} {platform.release()}.",
        "",
    ]
    kill = figures.get("kill")
    if kill and "rows" in kill:
        lines += [
            "## (a) kill -9 during precompute",
            "",
            f"`tests/reliability/test_kill.py`, seed {kill['seed']}: {kill['trials']} trials, each a precompute "
            f"process ({kill['targets']} targets with {kill['msa_records']} unique chain MSAs, "
            f"{kill['num_shards']} shards, {kill['batch_records']} records per transaction; an uninterrupted run "
            f"took {kill['full_run_s']:.2f} s, of which {kill.get('commit_s', kill['full_run_s']):.2f} s until its "
            f"last record commit) killed with SIGKILL after a random delay: "
            f"{kill['trials'] - kill.get('late_trials', 0)} trials one in each equal slice of {kill['span']} times "
            f"the commit phase, {kill.get('late_trials', 0)} after it (clustering, manifest write), counted from "
            f"the moment all shard files exist, "
            f"then rerun to the end. After every "
            f"kill each committed record decoded and matched the uninterrupted reference byte for byte; after "
            f"every rerun the cache held each target and each unique chain MSA exactly once, equal to the "
            f"reference, and `verify` was clean.",
            "",
        ]
        lines += _table(
            [
                "trial",
                "killed after (s)",
                "exit status",
                "committed at the kill: features / msa",
                "manifest at the kill",
                "rerun: featurized / skipped",
                "verify",
            ],
            [
                [
                    row["trial"],
                    f"{row['delay_s']:.2f}",
                    row["exit_code"],
                    f"{row['committed']} / {row['committed_msa']}",
                    "yes" if row["manifest"] else "no",
                    f"{row['done']} / {row['skipped']}",
                    "clean",
                ]
                for row in kill["rows"]
            ],
        )
        ray = kill.get("ray")
        if ray:
            lines += [
                "",
                f"One more trial ran the command line on a local Ray cluster (2 CPUs) and killed the driver, "
                f"raylet and workers with SIGKILL while records were being committed: "
                f"{ray['committed']} targets and {ray['committed_msa']} MSAs were committed; the rerun "
                f"featurized {ray['done']} and skipped {ray['skipped']}, matched the reference and "
                f"`verify` was clean.",
            ]
        killed = sum(row["exit_code"] == -9 for row in kill["rows"]) + (1 if ray else 0)
        finished = sum(row["exit_code"] != -9 for row in kill["rows"])
        lines += [
            "",
            f"Trials survived: {killed} killed mid-run and {finished} that finished before their "
            f"kill; every rerun completed, matched "
            f"the reference and verified clean.",
            "",
        ]
    corruption = figures.get("corruption")
    if corruption:
        lines += [
            "## (b) byte flips in shard files",
            "",
            f"`tests/reliability/test_corruption.py`, seed {corruption['seed']}: random bytes of randomly chosen "
            f"records flipped in the shard files of a published generation (a real sample-data cache).",
            "",
        ]
        lines += _table(
            [
                "round",
                "records in cache",
                "records damaged",
                "bytes flipped",
                "named by verify",
                "raised by CacheDataset",
                "skipped with on_error='skip'",
            ],
            [
                [
                    row["round"],
                    row["records"],
                    row["damaged"],
                    row["flips"],
                    row["verify_named"],
                    row["raised"],
                    row["skipped"],
                ]
                for row in corruption["rows"]
            ],
        )
        total = sum(row["damaged"] for row in corruption["rows"])
        named = sum(row["verify_named"] for row in corruption["rows"])
        lines += [
            "",
            f"Corruptions detected: {named} of {total} damaged records.",
            "",
            f"Example loader error: `{_cell(corruption['example_error'])}`",
            "",
        ]
    anywhere = figures.get("corruption_anywhere")
    if anywhere:
        lines += [
            f"Flips anywhere in the files (seed {anywhere['seed']}): {anywhere['rounds']} rounds, "
            f"{anywhere['flips']} bytes flipped at random offsets of the shard files, {anywhere['in_records']} of them "
            f"inside records and the rest in LMDB's own pages, keys and free space. verify (run in a child process, "
            f"so a crash would count as a failure; none happened) flagged {anywhere['shards_flagged']} of "
            f"{anywhere['shards_hit']} flipped shard files by sha256 and named {anywhere['records_named']} of the "
            f"{anywhere['records_hit']} records whose bytes were hit (a record is allowed to go unnamed only when "
            f"its shard is reported unreadable).",
            "",
        ]
    sections = [
        ("bad_inputs", "(c) bad inputs in one batch"),
        ("tool_failures", "(c) failing search tools"),
        ("setup_errors", "(c) setup problems (exit status 2, nothing written)"),
        ("full_disk", "(c) full disk"),
        ("cli_errors", "(c) command-line mistakes (exit status 2, one line, nothing written)"),
        (
            "cli_new_commands",
            "(c) mistakes with search, export, plot, train's recipe options and predict "
            "(exit status 2, one line, nothing written)",
        ),
        ("outputs_cut_short", "(c) outputs cut short by a full disk (whole or absent, never half-written)"),
    ]
    present = [(name, title) for name, title in sections if figures.get(name)]
    if present:
        count = sum(len(figures[name]) for name, _ in present)
        lines += [
            "## (c) bad inputs, tools and caches",
            "",
            f"`tests/reliability/test_bad_inputs.py`, `test_cli_errors.py` and `test_cli_new_commands.py`: "
            f"{count} bad inputs tried "
            f"in {len(present)} classes; each message below is the "
            f"one the pipeline produced (temporary folder prefix removed), and in every batch run the good "
            f"targets were cached.",
            "",
        ]
        for name, title in present:
            lines += [f"### {title}", ""]
            lines += _table(
                ["case", "what", "outcome", "stage", "message"],
                [[row["key"], row["what"], row["outcome"], row["stage"], row["message"]] for row in figures[name]],
            )
            lines.append("")
    update = figures.get("interrupted_update")
    if update:
        lines += [
            "## (g) interrupted update of a finished cache",
            "",
            f"`tests/reliability/test_interrupted_update.py`, seed {update['seed']}: {update['trials']} updates "
            f"of a finished cache ({update['targets']} targets, an uninterrupted update took "
            f"{update['update_s']:.2f} s) killed by SIGKILL or SIGINT at a random point while a reader process "
            f"read manifests, records, CacheDataset samples and stats throughout. The reader never failed; "
            f"after each kill `verify` exited 0 naming the interrupted update, and the rerun's manifest "
            f"replaced the last finished one.",
            "",
        ]
        lines += _table(
            ["trial", "signal", "after (s)", "exit status", "interrupted mid-update", "reader passes"],
            [
                [
                    row["trial"],
                    row["signal"],
                    f"{row['delay_s']:.2f}",
                    row["exit_code"],
                    "yes" if row["interrupted"] else "no",
                    row["reader_passes"],
                ]
                for row in update["rows"]
            ],
        )
        lines.append("")
    fuzz = figures.get("cli_fuzz")
    if fuzz:
        lines += [
            "## (f) command-line fuzz",
            "",
            f"`tests/reliability/test_cli_fuzz.py` (hypothesis): {fuzz['examples']} random command lines over "
            f"{len(fuzz['commands'])} commands ({', '.join(fuzz['commands'])}) with random option values, "
            f"missing, binary, Latin-1, empty and garbled files; exit statuses seen "
            f"{fuzz['exit_codes']}; no traceback, and the cache written before the fuzz verified after every "
            f"example.",
            "",
        ]
    pickle = figures.get("no_pickle")
    if pickle:
        lines += [
            "## (e) no pickle on the data path",
            "",
            "`tests/reliability/test_no_pickle.py`: " + pickle["summary"],
            "",
        ]
    lines += [
        "## (d) readers during publish",
        "",
        "`tests/store/test_publish.py::test_readers_of_old_generations_keep_working_while_new_ones_are_published` "
        "runs 8 StoreReader processes doing 1,000 random reads each while three generations are published, "
        "every read checked against the expected arrays, and asserts 0 errors.",
        "",
    ]
    readers = figures.get("readers")
    if readers:
        lines += [
            f"`tests/reliability/test_readers.py` does the same through the loader: {readers['readers']} forked "
            f"processes, each a `CacheDataset(..., follow_latest=True)` on the publish root calling `set_epoch` "
            f"every 100 reads, made {readers['reads']:,} reads (each record's arrays compared with the generation "
            f"it came from, and a cropped sample built) while {readers['publishes']} generations were published; "
            f"every reader followed `LATEST` from the first generation to the last, with {readers['errors']} errors.",
            "",
        ]
    known = figures.get("xfail")
    if known:
        lines += [
            "## Known gaps",
            "",
            "Bugs the suite found in code it does not own, each pinned by a strict xfail test that "
            "turns into a failure once the bug is fixed (then remove the marker):",
            "",
        ]
        # One row per test function: parametrized cases share their reason.
        rows = {node.split("[")[0]: reason for node, reason in known}
        lines += _table(["test", "bug"], [[f"`{node}`", reason] for node, reason in rows.items()])
        lines.append("")
    return "\n".join(lines)
