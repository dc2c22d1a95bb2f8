#!/usr/bin/env bash
# Build the featurecache image from nothing, on a machine that reaches Debian's mirror and PyPI but
# no container registry: debootstrap a minimal Debian, import it as a buildah base image, build
# docker/Dockerfile on it (the CPU wheel of PyTorch; the install steps are
# scripts/install_in_image.sh, shared with every Dockerfile build), then run the fast tests inside
# the image. Run as root. Prints the time of each stage and the image size. docs/CONTAINER.md.
#
#   scripts/build_image.sh [--fresh] [--no-test]
#
# Environment (defaults in brackets):
#   FC_IMAGE_STORE   buildah storage and scratch space [/var/tmp/featurecache-image]
#   FC_IMAGE         image name [featurecache:latest]
#   FC_SUITE         Debian release of the base [this machine's, from /etc/os-release]
#   FC_MIRROR        Debian mirror [http://deb.debian.org/debian]
#   FC_TORCH_SPEC    PyTorch requirement [torch==2.13.0]
#   FC_WHEELS_DIR    local wheels (the CPU torch wheel) mounted at /wheels [/opt/wheels if present]
#   FC_TORCH_INDEX   pip index for torch when there are no local wheels [https://download.pytorch.org/whl/cpu]
#   FC_CA_BUNDLE     CA bundle pip trusts inside the build (a TLS-inspecting proxy) [$PIP_CERT if set]
#   FC_SHARED_DATA   the sample data the tests read [../shared/data beside the repository]
#   FC_IMAGE_ARCHIVE also write the image as a docker-archive tar here (for docker/podman load) [none]
set -euo pipefail
REPO="$(cd "$(dirname "$0")/.." && pwd)"

fresh=0 run_tests=1
for arg in "$@"; do
    case "$arg" in
        --fresh) fresh=1 ;;
        --no-test) run_tests=0 ;;
        *) echo "build_image.sh: unknown option $arg (expected --fresh or --no-test)" >&2; exit 2 ;;
    esac
done
if [ "$(id -u)" -ne 0 ]; then echo "build_image.sh: run as root (debootstrap and buildah mount need it)" >&2; exit 2; fi
for tool in buildah debootstrap; do
    command -v "$tool" >/dev/null || { echo "build_image.sh: $tool missing: apt-get install -y buildah debootstrap" >&2; exit 2; }
done

STORE="${FC_IMAGE_STORE:-/var/tmp/featurecache-image}"
IMAGE="${FC_IMAGE:-featurecache:latest}"
SUITE="${FC_SUITE:-$(. /etc/os-release && echo "${VERSION_CODENAME:-}")}"
MIRROR="${FC_MIRROR:-http://deb.debian.org/debian}"
TORCH_SPEC="${FC_TORCH_SPEC:-torch==2.13.0}"
WHEELS_DIR="${FC_WHEELS_DIR:-}"
if [ -z "$WHEELS_DIR" ] && [ -d /opt/wheels ]; then WHEELS_DIR=/opt/wheels; fi
TORCH_INDEX="${FC_TORCH_INDEX:-}"
if [ -z "$WHEELS_DIR" ] && [ -z "$TORCH_INDEX" ]; then TORCH_INDEX=https://download.pytorch.org/whl/cpu; fi
CA_BUNDLE="${FC_CA_BUNDLE:-${PIP_CERT:-}}"
DATA="${FC_SHARED_DATA:-$(dirname "$REPO")/shared/data}"
BASE="localhost/featurecache-base:$SUITE"
[ -n "$SUITE" ] || { echo "build_image.sh: no VERSION_CODENAME in /etc/os-release: set FC_SUITE" >&2; exit 2; }

# vfs and chroot isolation work without overlayfs, user namespaces or a container runtime.
bah() { buildah --storage-driver vfs --root "$STORE/storage" --runroot "$STORE/run" "$@"; }
stage_start=0
begin() { stage_start=$(date +%s); echo "== $1"; }
end() { echo "== $1 took $(( $(date +%s) - stage_start )) s" | tee -a "$STORE/build-times.txt"; }

cleared=""
if [ "$fresh" -eq 1 ] && [ -e "$STORE" ]; then
    begin "clean: remove $STORE"      # vfs keeps full copies: thousands of files per image
    bah rm --all >/dev/null 2>&1 || true
    rm -rf "$STORE"
    cleared="== clean took $(( $(date +%s) - stage_start )) s"
fi
mkdir -p "$STORE"
echo "== $(date -u +%FT%TZ) building $IMAGE in $STORE" >> "$STORE/build-times.txt"
if [ -n "$cleared" ]; then echo "$cleared" | tee -a "$STORE/build-times.txt"; fi
containers=()
cleanup() { for c in "${containers[@]}"; do bah rm "$c" >/dev/null 2>&1 || true; done; }
trap cleanup EXIT

# 1. A minimal Debian, debootstrapped straight into an empty container, committed as the base.
if bah inspect --type image "$BASE" >/dev/null 2>&1; then
    echo "== base: reusing $BASE (--fresh rebuilds it)"
else
    begin "base: debootstrap --variant=minbase $SUITE"
    ctr=$(bah from --name featurecache-base-build scratch); containers+=("$ctr")
    root=$(bah mount "$ctr")
    debootstrap --variant=minbase "$SUITE" "$root" "$MIRROR" > "$STORE/debootstrap.log" \
        || { tail -20 "$STORE/debootstrap.log" "$root/debootstrap/debootstrap.log" 2>/dev/null; exit 1; }
    cat > "$root/etc/apt/sources.list" <<SOURCES
deb $MIRROR $SUITE main
deb $MIRROR $SUITE-updates main
deb http://deb.debian.org/debian-security $SUITE-security main
SOURCES
    rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/* "$root"/tmp/*
    bah unmount "$ctr" >/dev/null
    bah config --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
        --env LANG=C.UTF-8 --cmd /bin/bash "$ctr"
    bah commit --quiet --rm "$ctr" "$BASE" >/dev/null
    end "base"
fi

# 2. docker/Dockerfile on that base: the same file and install script a CUDA build uses.
begin "image: docker/Dockerfile on $BASE with $TORCH_SPEC"
wheel_args=()
if [ -n "$WHEELS_DIR" ]; then wheel_args=(--volume "$WHEELS_DIR:/wheels:ro" --build-arg WHEELS=/wheels); fi
if [ -n "$CA_BUNDLE" ]; then wheel_args+=(--volume "$(realpath "$CA_BUNDLE"):/run/build-ca.crt:ro" --build-arg PIP_CERT=/run/build-ca.crt); fi
bah build --isolation chroot --layers=false --quiet -f "$REPO/docker/Dockerfile" \
    --build-arg BASE_IMAGE="$BASE" --build-arg TORCH_SPEC="$TORCH_SPEC" \
    --build-arg TORCH_INDEX="$TORCH_INDEX" "${wheel_args[@]}" -t "$IMAGE" "$REPO"
bah rmi --prune >/dev/null 2>&1 || true     # leftovers of earlier builds of the same name
end "image"

# 3. The fast tests inside the image: layering, the parsers, and the real search tools.
if [ "$run_tests" -eq 1 ]; then
    begin "tests inside $IMAGE"
    [ -d "$DATA" ] || { echo "build_image.sh: sample data not found at $DATA: set FC_SHARED_DATA" >&2; exit 2; }
    ctr=$(bah from --name featurecache-test "$IMAGE"); containers+=("$ctr")
    bah run --isolation chroot --volume "$DATA:/opt/shared/data:ro" "$ctr" -- \
        python3 -m pytest -q -p no:cacheprovider tests/test_layering.py tests/io \
        tests/precompute/test_tools.py \
        tests/precompute/test_search.py::test_protein_chain_from_structures_gets_msas_and_templates
    bah rm "$ctr" >/dev/null
    end "tests"
fi

if [ -n "${FC_IMAGE_ARCHIVE:-}" ]; then
    begin "archive: $FC_IMAGE_ARCHIVE"
    bah push --quiet "$IMAGE" "docker-archive:$FC_IMAGE_ARCHIVE:$IMAGE"
    end "archive"
fi
bah images --format '{{.Name}}:{{.Tag}} {{.Size}}' | tee -a "$STORE/build-times.txt"
