"""The README's commands for AlphaFold 3, Protenix and Boltz (its `text` block after the `search`
example) get files their tools accept as written.

The tools cannot predict here (no GPU, no weights), so the README's `search` / `export` block runs
as written (sandboxed like tests/test_readme_commands.py), and every file each tool command names
goes through that tool's own reader: `protenix pred -i` through Protenix's JSON parser and MSA
featurizer, `boltz predict` through Boltz's YAML parser and MSA CSV reader, `run_alphafold.py`
inputs through AF3's documented format (docs/input.md) and its template rule (a release date).
"""

from __future__ import annotations

import json
import pathlib
import re
import subprocess

import pytest

from featurecache.io.af3_json import read_af3_json
from featurecache.testing.boltz_inputs import parse_boltz_input, parse_boltz_msa
from featurecache.testing.protenix_inputs import protenix_features
from tests.io.test_af3_json_writer import af3_template_release_date
from tests.precompute.test_search_command import check_af3_input
from tests.test_readme_commands import README, REPO, sandboxed

BLOCK = re.compile(r"^```(bash|text)\n(.*?)^```", re.MULTILINE | re.DOTALL)


def _section_blocks() -> tuple[str, str, str]:
    """(the line that builds the test databases, the search block, the tools' text block)."""
    text = README.read_text()
    databases = next(line for line in text.splitlines() if line.startswith("python3 -m featurecache.testing.testdb"))
    blocks = BLOCK.findall(text)
    number = next(index for index, (_, code) in enumerate(blocks) if code.startswith("featurecache search"))
    assert blocks[number + 1][0] == "text" and "protenix pred" in blocks[number + 1][1]
    return databases, blocks[number][1], blocks[number + 1][1]


@pytest.mark.slow
def test_every_file_the_readme_gives_af3_protenix_and_boltz_is_read_by_them(tmp_path):
    databases, search, tools = _section_blocks()
    script = sandboxed(f"{databases}\n{search}", tmp_path)
    for output_format in ("protenix-json", "boltz-yaml"):  # the formats the block's comment offers
        script += (
            f"\nfeaturecache export {tmp_path}/fc-msas/cache 721p-assembly1 --format {output_format} "
            f"--out {tmp_path}/fc-export"
        )
    result = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", script], cwd=REPO, capture_output=True, text=True, timeout=1500
    )
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    commands = [line for line in sandboxed(tools, tmp_path).splitlines() if line and not line.startswith("#")]
    checked = {"af3": 0, "protenix": 0, "boltz": 0}
    for command in commands:
        if command.startswith("python run_alphafold.py"):
            found = re.search(r"--json_path=(\S+)|--input_dir=(\S+)", command)
            path = pathlib.Path(found.group(1) or found.group(2))
            for json_path in [path] if path.suffix == ".json" else sorted(path.glob("*.json")):
                _check_af3(json_path)
                checked["af3"] += 1
        elif command.startswith("protenix pred"):
            path = pathlib.Path(re.search(r"-i (\S+)", command).group(1))
            for job in json.loads(path.read_text()):
                features, _ = protenix_features(job, tmp_path)
                assert features["msa"].shape[0] >= 1 and features["token_index"].shape[0] > 300
            checked["protenix"] += 1
        elif command.startswith("boltz predict"):
            path = pathlib.Path(command.split()[2])
            target = parse_boltz_input(path, tmp_path)
            assert len(target.structure.chains) >= 2
            for chain in target.record.chains:
                if chain.msa_id != -1:
                    assert len(parse_boltz_msa(pathlib.Path(chain.msa_id)).sequences) > 1
            checked["boltz"] += 1
        else:
            pytest.fail(f"README tool command this test does not know: {command}")
    assert checked["af3"] >= 3 and checked["protenix"] >= 1 and checked["boltz"] >= 1, checked
    # the exported dialects too
    (job,) = json.loads((tmp_path / "fc-export" / "721p-assembly1.protenix.json").read_text())
    protenix_features(job, tmp_path)
    parse_boltz_input(tmp_path / "fc-export" / "721p-assembly1.yaml", tmp_path)


def _check_af3(path: pathlib.Path) -> None:
    document = json.loads(path.read_text())
    check_af3_input(document)
    read_af3_json(path, path.stem)  # featurecache's reader, which checks AF3's rules on MSAs and templates
    for entry in document["sequences"]:
        for template in entry.get("protein", {}).get("templates", []):
            assert af3_template_release_date(template["mmcif"]) is not None
