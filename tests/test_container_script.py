"""The image build scripts: they parse, and the Dockerfile and scripts/build_image.sh install through
the one recipe (scripts/install_in_image.sh), which covers what setup.sh and the search code need.

The build itself (debootstrap + buildah, minutes) runs from scripts/build_image.sh, not here.
"""

import pathlib
import re
import shlex
import subprocess

import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]
DOCKERFILE = REPO / "docker" / "Dockerfile"
BUILD_SCRIPT = REPO / "scripts" / "build_image.sh"
INSTALL_SCRIPT = REPO / "scripts" / "install_in_image.sh"
INSTALL_PATH = "scripts/install_in_image.sh"


def _bash_array(script: pathlib.Path, name: str) -> list[str]:
    """The words of a top-level `NAME=(...)` array in a bash script."""
    match = re.search(rf"^{name}=\(([^)]*)\)", script.read_text(), re.MULTILINE)
    assert match, f"{script.name} has no {name}=(...) array"
    return shlex.split(match.group(1))


def _installs_something(line: str) -> bool:
    return bool(re.search(r"apt-get\s+install|\bpip3?\s+install|-m\s+pip\s+install|\bapk\s+add|\bdnf\s+install", line))


def _dockerfile_instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs with continuation lines joined and comments dropped."""
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text())
    pairs = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            pairs.append((word.upper(), rest.strip()))
    return pairs


@pytest.mark.parametrize("script", [BUILD_SCRIPT, INSTALL_SCRIPT], ids=lambda p: p.name)
def test_script_parses(script):
    result = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def test_dockerfile_installs_only_through_the_shared_script():
    instructions = _dockerfile_instructions()
    copies = [args for word, args in instructions if word == "COPY"]
    assert any(INSTALL_PATH in args.split() for args in copies), "the Dockerfile must COPY the install script"
    runs = [args for word, args in instructions if word == "RUN"]
    assert any(INSTALL_PATH in args for args in runs), "the Dockerfile must RUN the install script"
    assert not [args for args in runs if _installs_something(args)], "install steps belong in the install script"


def test_build_script_builds_the_dockerfile_and_installs_nothing_itself():
    text = BUILD_SCRIPT.read_text()
    assert re.search(r"\bbuild\b[^\n]*-f \"\$REPO/docker/Dockerfile\"", text), (
        "build_image.sh must build docker/Dockerfile (so both share the install script)"
    )
    commands = [
        line for line in text.splitlines() if not line.lstrip().startswith("#") and "echo " not in line
    ]  # not its help texts
    assert not [line for line in commands if _installs_something(line)]


def test_build_args_the_script_passes_are_declared_in_the_dockerfile():
    declared = {args.split("=")[0] for word, args in _dockerfile_instructions() if word == "ARG"}
    passed = set(re.findall(r"--build-arg\s+\"?([A-Z_]+)=", BUILD_SCRIPT.read_text()))
    assert passed, "build_image.sh passes no --build-arg"
    assert passed <= declared, f"undeclared build args: {sorted(passed - declared)}"
    for name in ("BASE_IMAGE", "TORCH_SPEC"):  # what a CUDA user sets (docs/CONTAINER.md)
        assert name in declared


def test_install_script_has_every_package_setup_sh_installs():
    setup = re.sub(r"\\\n", " ", (REPO / "setup.sh").read_text())
    match = re.search(r"apt-get install ([^\n>]*)", setup)
    assert match, "setup.sh no longer installs with apt-get: update this test"
    setup_packages = {word for word in shlex.split(match.group(1)) if not word.startswith("-")}
    assert setup_packages, setup
    assert setup_packages <= set(_bash_array(INSTALL_SCRIPT, "SEARCH_PACKAGES"))


def test_install_script_checks_every_tool_the_search_code_runs():
    sources = "\n".join(path.read_text() for path in (REPO / "featurecache" / "precompute" / "tools").glob("*.py"))
    programs = set(re.findall(r'binary_name = "([^"]+)"', sources))
    programs |= set(re.findall(r'resolve_binary\("([^"]+)"', sources))
    assert {"jackhmmer", "hhblits", "mmseqs", "kalign"} <= programs, "the tool modules changed shape: update this test"
    assert programs <= set(_bash_array(INSTALL_SCRIPT, "REQUIRED_TOOLS"))
