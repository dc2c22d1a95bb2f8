#!/usr/bin/env bash
# The one install recipe of the featurecache image. docker/Dockerfile runs it, and
# scripts/build_image.sh builds that Dockerfile, so the CUDA image a user builds and the CPU image
# built here from a debootstrap base get the same packages and steps.
#
# Runs inside the image being built, as root, from the source folder (the one with pyproject.toml).
#   FC_TORCH_SPEC   PyTorch requirement installed first ("torch==2.13.0"); empty keeps the base
#                   image's torch (the CUDA build of a pytorch/pytorch base)
#   FC_TORCH_INDEX  extra pip index for it (https://download.pytorch.org/whl/cpu); optional
#   FC_WHEELS       folder of local wheels pip may take from (e.g. a CPU torch wheel); optional
#   FC_PIP_CERT     CA bundle pip trusts (a network behind a TLS-inspecting proxy); optional
set -euo pipefail

# The search tools, as setup.sh installs them, and TCMalloc (train and predict preload it:
# featurecache/training/allocator.py). The -examples packages ship the UniProt sample and the
# HMMER tutorial that featurecache.testing.testdb builds the small test databases from.
SEARCH_PACKAGES=(hmmer hmmer-examples hhsuite mmseqs2 mmseqs2-examples kalign libtcmalloc-minimal4)
# A base without Python 3.11+ (a bare Debian) gets the distribution's.
PYTHON_PACKAGES=(python3 python3-pip)
# Every program featurecache runs (precompute/tools, setpriv for the parent-death signal), checked
# at the end so that a broken image fails its build rather than its first job.
REQUIRED_TOOLS=(jackhmmer nhmmer hmmbuild hmmsearch hhblits hhsearch ffindex_build mmseqs kalign setpriv)
# Where the image's users mount databases, inputs, caches, the publish root and run folders.
MOUNT_POINTS=(/databases /inputs /cache /shared /runs)

python_ok() {
    command -v python3 >/dev/null \
        && python3 -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else 1)' \
        && python3 -m pip --version >/dev/null 2>&1
}

packages=("${SEARCH_PACKAGES[@]}")
if ! python_ok; then packages+=("${PYTHON_PACKAGES[@]}"); fi

# Minimized Ubuntu bases (pytorch/pytorch) drop /usr/share/doc from every package: keep the
# example data the test databases are built from.
if ls /etc/dpkg/dpkg.cfg.d/* >/dev/null 2>&1 && grep -qs 'path-exclude=/usr/share/doc' /etc/dpkg/dpkg.cfg.d/*; then
    printf 'path-include=/usr/share/doc/%s/*\n' hmmer mmseqs2 > /etc/dpkg/dpkg.cfg.d/zz-featurecache-examples
fi

apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${packages[@]}" >/dev/null
apt-get clean
rm -rf /var/lib/apt/lists/*

if ! python_ok; then
    echo "featurecache needs Python >= 3.11 with pip; this base has $(python3 --version 2>&1)" >&2
    exit 1
fi

# The image is the installation: pip may write beside the distribution's Python (PEP 668).
export PIP_BREAK_SYSTEM_PACKAGES=1 PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore
if [ -n "${FC_PIP_CERT:-}" ]; then export PIP_CERT="$FC_PIP_CERT"; fi
pip_sources=()
if [ -n "${FC_WHEELS:-}" ]; then pip_sources+=(--find-links "$FC_WHEELS"); fi
if [ -n "${FC_TORCH_INDEX:-}" ]; then pip_sources+=(--extra-index-url "$FC_TORCH_INDEX"); fi
# PyTorch first, from the chosen build: an unpinned torch from PyPI would be a multi-GB CUDA build.
if [ -n "${FC_TORCH_SPEC:-}" ]; then
    python3 -m pip install -q "${pip_sources[@]}" "$FC_TORCH_SPEC"
fi
# Not editable: the image is a release, not a checkout. torch already satisfies pyproject's range.
python3 -m pip install -q "${pip_sources[@]}" ".[test]"
# Protenix 2.0 without its pins, as setup.sh installs it (the reference of tests/equivalence).
python3 -m pip install -q "${pip_sources[@]}" --no-deps "protenix==2.0.0"

python3 -c "import featurecache, torch, triton; \
print('featurecache', featurecache.__version__, 'torch', torch.__version__, 'triton', triton.__version__)"
for tool in "${REQUIRED_TOOLS[@]}"; do
    command -v "$tool" >/dev/null || { echo "missing tool in the image: $tool" >&2; exit 1; }
done
test -f /usr/share/doc/mmseqs2/example-data/DB.fasta.gz \
    || { echo "missing the mmseqs2-examples UniProt sample" >&2; exit 1; }
mkdir -p "${MOUNT_POINTS[@]}"
