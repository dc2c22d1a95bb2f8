"""Every command in the README runs exactly as written.

The README's `bash` and `python` blocks are run in order, as a user would paste them after
`./setup.sh` (which, with the test command itself, is the only block left out). Templates with
placeholders live in `text` blocks and are not run. Two substitutions only keep the test from
touching a user's files: the absolute `/tmp/` prefix becomes a private folder, and `../shared/data`
becomes the sample data this test session uses (FC_SHARED_DATA on a GPU machine).
"""

from __future__ import annotations

import os
import pathlib
import re
import subprocess
import sys

import pytest

from tests.conftest import SHARED_DATA

REPO = pathlib.Path(__file__).resolve().parents[1]
README = REPO / "README.md"
NOT_RUN = ("./setup.sh", "python3 -m pytest -q")  # the setup and the test command (this test)
BLOCK = re.compile(r"^```(bash|python)\n(.*?)^```", re.MULTILINE | re.DOTALL)
BLOCK_TIMEOUT_S = 900


def readme_blocks() -> list[tuple[str, str]]:
    """(language, code) of every runnable block, in README order."""
    blocks = []
    for language, code in BLOCK.findall(README.read_text()):
        if code.strip() in NOT_RUN:
            continue
        blocks.append((language, code))
    return blocks


def sandboxed(code: str, tmp: pathlib.Path) -> str:
    code = re.sub(r"(?<![\w./])/tmp/", f"{tmp}/", code)
    return code.replace("../shared/data", str(SHARED_DATA))


def test_setup_and_test_commands_are_the_readme_blocks_left_out():
    texts = [code.strip() for _, code in BLOCK.findall(README.read_text())]
    for command in NOT_RUN:
        assert command in texts, f"README has no block with exactly `{command}`"


@pytest.mark.slow
def test_every_readme_block_runs_as_written(tmp_path):
    blocks = readme_blocks()
    assert len(blocks) >= 5, "expected the main job, search, publish, loading and training blocks"
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    for number, (language, code) in enumerate(blocks, 1):
        script = sandboxed(code, tmp_path)
        command = ["bash", "-euo", "pipefail", "-c", script] if language == "bash" else [sys.executable, "-c", script]
        result = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=BLOCK_TIMEOUT_S)
        output = (result.stdout + result.stderr)[-3000:]
        assert result.returncode == 0, f"README block {number} ({language}) failed:\n{code}\n--- output ---\n{output}"
        assert "Traceback" not in result.stderr, f"README block {number} printed a traceback:\n{output}"
