"""train and predict re-execute themselves once with TCMalloc preloaded where it is installed
(featurecache/training/allocator.py): when, with what environment, and a real re-execution."""

import subprocess
import sys

import pytest

from featurecache.training.allocator import (
    ALLOCATOR_VARIABLE,
    LARGE_ALLOC_REPORT_VARIABLE,
    AllocatorChoiceError,
    preload_environment,
    runs_the_model,
    tcmalloc_library,
)


def test_the_preload_is_added_once_and_never_over_the_users():
    environment = preload_environment({"PATH": "/bin"}, "libtcmalloc_minimal.so.4")
    assert environment["LD_PRELOAD"] == "libtcmalloc_minimal.so.4"
    assert environment["PATH"] == "/bin"
    assert int(environment[LARGE_ALLOC_REPORT_VARIABLE]) > 1 << 40  # no "large alloc" lines
    assert preload_environment(environment, "libtcmalloc_minimal.so.4") is None  # the re-executed process
    assert preload_environment({"LD_PRELOAD": "libjemalloc.so.2"}, "libtcmalloc_minimal.so.4") is None
    assert preload_environment({ALLOCATOR_VARIABLE: "System"}, "libtcmalloc_minimal.so.4") is None
    assert preload_environment({}, None) is None
    kept = preload_environment({LARGE_ALLOC_REPORT_VARIABLE: "1000"}, "libtcmalloc_minimal.so.4")
    assert kept[LARGE_ALLOC_REPORT_VARIABLE] == "1000"


def test_the_switch_takes_tcmalloc_or_system_and_refuses_the_rest():
    library = "libtcmalloc_minimal.so.4"
    assert preload_environment({ALLOCATOR_VARIABLE: " TCMalloc "}, library)["LD_PRELOAD"] == library
    assert preload_environment({ALLOCATOR_VARIABLE: ""}, library)["LD_PRELOAD"] == library
    assert preload_environment({ALLOCATOR_VARIABLE: ""}, None) is None  # the default falls back quietly
    for value in ("jemalloc", "glibc", "tc malloc", "1"):
        with pytest.raises(AllocatorChoiceError, match=f"{ALLOCATOR_VARIABLE}='{value}': expected one of"):
            preload_environment({ALLOCATOR_VARIABLE: value}, library)
    with pytest.raises(AllocatorChoiceError, match="libtcmalloc_minimal is not installed"):
        preload_environment({ALLOCATOR_VARIABLE: "tcmalloc"}, None)  # asked for, missing: said, not ignored


def test_a_bad_switch_stops_the_command_with_one_line_before_it_runs(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "featurecache.cli", "train", "--cache", str(tmp_path / "none")],
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": ":".join(sys.path), ALLOCATOR_VARIABLE: "jemalloc"},
        capture_output=True,
        text=True,
    )
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        f"Error: {ALLOCATOR_VARIABLE}='jemalloc': expected one of tcmalloc, system (or unset: TCMalloc where installed)"
    ]


@pytest.mark.parametrize(
    "argv, expected",
    [
        (["train", "--cache", "c"], True),
        (["--debug", "predict", "run"], True),
        (["train", "--help"], False),
        (["precompute", "inputs", "--cache", "train"], False),
        ([], False),
    ],
)
def test_only_the_models_commands_are_re_executed(argv, expected):
    assert runs_the_model(argv) is expected


@pytest.mark.skipif(tcmalloc_library() is None, reason="TCMalloc is not installed (setup.sh installs it)")
def test_a_re_executed_process_runs_on_tcmalloc_with_its_own_command_line():
    script = (
        "import sys\n"
        "from featurecache.training.allocator import reexecute_with_tcmalloc\n"
        "reexecute_with_tcmalloc()\n"
        "maps = open('/proc/self/maps').read()\n"
        "print('tcmalloc' in maps, sys.argv[1:])\n"
    )
    environment = {"PATH": "/usr/bin:/bin", "PYTHONPATH": ":".join(sys.path)}
    done = subprocess.run(
        [sys.executable, "-c", script, "a", "b"], env=environment, capture_output=True, text=True, check=True
    )
    assert done.stdout.split() == ["True", "['a',", "'b']"]
    assert done.stderr == ""
    plain = subprocess.run(
        [sys.executable, "-c", script],
        env={**environment, ALLOCATOR_VARIABLE: "system"},
        capture_output=True,
        text=True,
    )
    assert plain.stdout.split()[0] == "False"
