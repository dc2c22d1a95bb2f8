"""The README documents every record array and every CLI command."""

import pathlib
import re

from featurecache.cli import cli
from featurecache.schema import FEATURES

README = (pathlib.Path(__file__).resolve().parents[1] / "README.md").read_text()


def test_every_array_is_documented_with_its_dtype():
    for spec in FEATURES:
        rows = [line for line in README.splitlines() if line.startswith("|") and f"`{spec.name}`" in line]
        assert rows, f"README does not document {spec.name}"
        assert any(f"| {spec.dtype} |" in row for row in rows), f"README has the wrong dtype for {spec.name}"


def test_every_command_is_documented():
    for name in cli.list_commands(None):
        assert re.search(rf"`featurecache {name}\b", README), f"README does not document `featurecache {name}`"


def test_setup_and_test_commands_are_near_the_top():
    head = "\n".join(README.splitlines()[:30])
    assert "./setup.sh" in head and "python3 -m pytest -q" in head
