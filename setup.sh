#!/usr/bin/env bash
# One-command setup on a fresh Debian machine with Python 3.11 (run as root, or with sudo rights).
# Installs the search tools from Debian packages (and TCMalloc, the allocator train and predict
# preload: featurecache/training/allocator.py), the CPU build of PyTorch, then featurecache.
set -euo pipefail
cd "$(dirname "$0")"

SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq \
    hmmer hmmer-examples hhsuite mmseqs2 mmseqs2-examples kalign libtcmalloc-minimal4 >/dev/null

PYTHON="${PYTHON:-python3}"
# The CPU build first: an unpinned torch would pull a multi-GB CUDA build.
"$PYTHON" -m pip install -q "torch==2.13.0" || "$PYTHON" -m pip install -q "torch>=2.4"
"$PYTHON" -m pip install -q -e ".[test]"
# Protenix 2.0 (pure Python), the reference of tests/equivalence: its declared pins (torch 2.7.1,
# biotite 1.4, rdkit 2025.9, CUDA packages) would replace featurecache's, so it is installed without
# them; its model and loss modules import with what is here plus optree and scipy (the test extra).
"$PYTHON" -m pip install -q --no-deps "protenix==2.0.0"
# Boltz 2.2's input parsers (YAML, MSA CSV and A3M), for the tests of the files featurecache writes for
# it: its pins (numpy<2, torch, gemmi 0.6.5, click 8.1.7, CUDA packages) would replace featurecache's;
# the parsers import with the test extra. The model itself is not used.
"$PYTHON" -m pip install -q --no-deps "boltz==2.2.0"
echo "featurecache setup done: $("$PYTHON" -c 'import featurecache, torch, triton; print(featurecache.__version__, "torch", torch.__version__, "triton", triton.__version__)')"
