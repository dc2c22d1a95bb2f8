#!/usr/bin/env bash
# Issue 24's H200 measurements in three device calls (checked on the CPU with --smoke first).
#
# Budget: 30 min of device time; each call <= 600 s of command, ~100 s to start a fresh machine
# (Triton's compile cache is lost with it), ~25 s to install the wheels. Estimates below are from
# the 2026-12-03/04 runs (triton + CUDA graph 1.2 s at crop 384 and 4.1 s at 768, launched 2.5 s,
# eager 8 s at 384, Protenix 8-9 s at 384 and 15 s at 768, a cold first Triton step >= 150 s).
#
# Here (CPU), once:   bash benchmarks/device_plan.sh prepare
#   builds .devdata/cache384 (721p 398 tokens, 7a4d 547 tokens: every crop is 384; their A3Ms cut to
#   the first 1024 sequences, 0.9 MB) and .whl-core/ (featurecache's wheels without Protenix's),
#   and prints what each call sends against the 64 MiB limit.
#
# Device calls, in this order (the `run` tool; issue the next one at once, while the machine is
# still warm: that saves ~100 s of start and the cold Triton compilation):
#   1. ~25 + 550 s  run(command="bash benchmarks/device_plan.sh call1", carry=[".whl", ".devdata"], timeout_s=600)
#      steps at crop 384 and 768: triton + CUDA graph (~190 s, cold Triton), triton (~35 s),
#      Protenix 2.0 in a child process (140-190 s: its Triton kernel autotunes per length), then
#      the data wait through the training loop with the cache, triton kernels, 12 steps (~80 s)
#   2. ~25 + 520 s  run(command="bash benchmarks/device_plan.sh call2", carry=[".whl-core", ".devout"], timeout_s=600)
#      the largest crop, checkpoint_group 7, steps of 128: triton tries 2560 (issue 24's target;
#      2304 fit and 2560 ran out of memory on 2026-12-04, before the diffusion transformer's
#      inputs were grouped too), then 2432 if 2560 does not fit (~100 s a trial); eager from 512
#      up (doubling, then bisection); their one step at 384 first (~150 s cold, ~30 s)
#   3. ~25 + 420 s  run(command="bash benchmarks/device_plan.sh call3", carry=[".whl-core", ".devout"], timeout_s=480)
#      eager (~130 s) and torch.compile of the blocks (compile_blocks, ~275 s) at 384 and 768; its
#      table merges calls 1 and 2: every variant and ratio of the issue in one table
#   Three fresh machines: ~1,865 s, more than the 1,800 s budget, and a machine is taken back when
#   the session's time runs out (nothing comes back): before each call read `status` and, when
#   budget_left_s < 125 + the call's budget + 60, pass a smaller budget as the call's argument,
#   e.g. "bash benchmarks/device_plan.sh call3 300" (each call's budget is its first argument).
#   If short, the budget cuts call 3's compile steps first (they run last); the table says so.
# After each call, here (FILES = the reply's files_at):
#   mkdir -p .devout && cp FILES/train_step.json .devout/callN.json && cp FILES/RESULTS.md FILES/results.csv benchmarks/
# (each call records its own rows with --record; a later call's table also shows the earlier cells)
set -euo pipefail
cd "$(dirname "$0")/.."

CORE_WHEELS="biotite gemmi lmdb msgpack rdkit zstandard"
LIMIT=$((64 * 1024 * 1024))
# CORE_WHEELS installed (unzipped, as pip --target does) and packed with xz: the same files in
# about two thirds of the wheels' bytes, which leaves room in a call's 64 MiB for a training cache
SITE_ARCHIVE=.devdata/site-core.tar.xz
# biotite's CCD (63 MB) cut to the components of the held-out entries (generalisation.py ccd)
CCD_CUT=.devdata/general/components.bcif

prepare() {
    local data=../shared/data
    grep -qx '/.devdata/' .git/info/exclude || printf '/.devdata/\n/.devout/\n/.whl-core/\n' >> .git/info/exclude
    rm -rf .devdata/cache384 .devdata/inputs .devdata/alignments && mkdir -p .devdata/inputs .devdata/alignments .devout
    cp "$data"/structures/721p-assembly1.cif "$data"/structures/7a4d-assembly1.cif .devdata/inputs/
    python3 - "$data/alignments/pdb" .devdata/alignments <<'EOF'
import gzip, pathlib, sys
source, target = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
for path in [*source.glob("721p-*.a3m*"), *source.glob("7a4d-*.a3m*")]:
    with (gzip.open if path.suffix == ".gz" else open)(path, "rt") as handle:
        lines = handle.read().splitlines()
    kept, sequences = [], 0
    for line in lines:  # the query and the next 1023 sequences
        sequences += line.startswith(">")
        if sequences > 1024:
            break
        kept.append(line)
    (target / path.name.removesuffix(".gz")).write_text("\n".join(kept) + "\n")
EOF
    featurecache precompute .devdata/inputs --cache .devdata/cache384 --alignments .devdata/alignments \
        --executor inline --shards 1 --no-progress
    rm -rf .devdata/inputs .devdata/alignments
    mkdir -p .whl-core && for name in $CORE_WHEELS; do ln -f .whl/"$name"-*.whl .whl-core/; done
    local tree
    tree=$(git ls-files -z | xargs -0 du -cb | tail -1 | cut -f1)
    for call in "call1 .whl .devdata" "call2 .whl-core .devout" "call3 .whl-core .devout"; do
        set -- $call
        local name=$1 total=$tree
        shift
        total=$((total + $(du -cb "$@" | tail -1 | cut -f1)))
        echo "$name: tree $tree + $* = $total bytes of $LIMIT ($(( (LIMIT - total) / 1024 )) KiB spare)"
        [ "$total" -lt "$LIMIT" ] || echo "  $name does not fit: leave a wheel out or shrink .devdata"
    done
}

device_setup() {  # on the device: the carried wheels (or their packed install, SITE_ARCHIVE) into /tmp/site
    local wheels=.whl-core
    compgen -G ".whl/*.whl" > /dev/null && wheels=.whl  # call 1: every wheel (Protenix's too)
    if [ -f "$SITE_ARCHIVE" ] && ! compgen -G "$wheels/*.whl" > /dev/null; then
        mkdir -p /tmp/site && python3 -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2], filter="data")' \
            "$SITE_ARCHIVE" /tmp/site
    else
        python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "$wheels"/*.whl
    fi
    # Protenix and its own dependencies (peer_wheels), carried beside the packed core: .whl whole
    # no longer fits a call's 64 MiB with the tree
    if compgen -G ".whl-peer/*.whl" > /dev/null; then
        python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl-peer/*.whl
    fi
    export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
    # a CCD cut to what the carried cache's entries use (general_prepare), where biotite looks for its own
    if [ -f "$CCD_CUT" ] && [ ! -f /tmp/site/biotite/structure/info/components.bcif ]; then
        cp "$CCD_CUT" /tmp/site/biotite/structure/info/components.bcif
    fi
    # the device's copy of the tree may carry an older .git (2026-12-05: it reported d4ef982 for 2c7e87d's
    # tree): pass this side's HEAD in the command, FC_COMMIT=$(git rev-parse --short HEAD) written out
    export FC_COMMIT=${FC_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}
    OUTDIR=${OUT:-bench-out}
    mkdir -p "$OUTDIR"
    trap 'cp benchmarks/RESULTS.md benchmarks/results.csv "$OUTDIR"/ 2>/dev/null || true' EXIT
    nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv,noheader || true
}

merged() {  # the --merge arguments: the earlier calls' JSON that came back and was carried
    local files=()
    for name in "$@"; do [ -f ".devout/$name.json" ] && files+=(".devout/$name.json"); done
    [ ${#files[@]} -eq 0 ] || echo "--merge ${files[*]}"
}

FULL="--model af3 --depth 48 --block-lengths --no-checks --step-warmup 1 --step-reps 1 --peer-reps 1"

call1() {
    device_setup
    python3 benchmarks/train_step.py $FULL --crop 384 768 --variants triton+graphs triton protenix \
        --cache .devdata/cache384 --data-kernels triton --data-steps 12 \
        --crop-budget-s 0 --budget-s "${1:-550}" --peer-budget-s 190 --out "$OUTDIR" --record 2>&1 | tee "$OUTDIR/log.txt"
}

call2() {
    device_setup
    python3 benchmarks/train_step.py $FULL --crop 384 --variants triton eager \
        --crop-checkpoint-group 7 --crop-start triton=2560 eager=512 --crop-step 128 --crop-limit 2560 \
        --crop-budget-s 200 --budget-s "${1:-520}" --out "$OUTDIR" --record 2>&1 | tee "$OUTDIR/log.txt"
}

call3() {
    device_setup
    # (the crop options only label call 2's merged largest-crop row: no search runs here)
    python3 benchmarks/train_step.py $FULL --crop 384 768 --variants eager compile --crop-budget-s 0 \
        --crop-checkpoint-group 7 --crop-step 128 --first-step-s 200 --budget-s "${1:-420}" $(merged call1 call2) \
        --out "$OUTDIR" --record 2>&1 | tee "$OUTDIR/log.txt"
}

# Calls 1-3 above ran on 2026-12-04 (NOTES-train_step.md); two cells stayed empty: Protenix (its
# 190 s ran out while it built its LayerNorm extension) and torch.compile (its first step did not
# finish in 320 s). These three calls fill them, each with a call of its own:
#   peer     ~25 + 550 s  run(command="bash benchmarks/device_plan.sh peer", carry=[".whl"], timeout_s=600)
#            Protenix 2.0 alone at 384 and 768 (build, autotune and steps; stage lines in the log)
#   compile  ~25 + 550 s  run(command="bash benchmarks/device_plan.sh compile", carry=[".whl"], timeout_s=600)
#            eager, then torch.compile of the blocks with static shapes (no crop search), at 384
#   kernels  ~25 + 450 s  run(command="bash benchmarks/device_plan.sh kernels", carry=[".whl", ".devout"], timeout_s=600)
#            triton + CUDA graph and triton at 384 and 768, the table merged with peer and compile,
#            then the EvoAttention L = 768 sweep (run 2 of NOTES-evo_attention.md attempt 8)
peer() {
    device_setup
    python3 benchmarks/train_step.py $FULL --crop 384 768 --variants protenix --crop-budget-s 0 \
        --peer-budget-s "${1:-530}" --budget-s "${1:-530}" --out "$OUTDIR" --record 2>&1 | tee "$OUTDIR/log.txt"
}

compile() {
    device_setup
    python3 benchmarks/train_step.py $FULL --crop 384 --variants eager compile --crop-budget-s 0 \
        --first-step-s 440 --budget-s "${1:-540}" --out "$OUTDIR" --record 2>&1 | tee "$OUTDIR/log.txt"
}

kernels() {
    device_setup
    python3 benchmarks/train_step.py $FULL --crop 384 768 --variants triton+graphs triton --crop-budget-s 0 \
        --budget-s "${1:-260}" $(merged peer compile) --out "$OUTDIR" --record 2>&1 | tee "$OUTDIR/log.txt"
    python3 benchmarks/evo768_sweep.py --budget-s "${2:-170}" 2>&1 | tee "$OUTDIR/evo768.txt"
}

# Issue 33's overfit (benchmarks/learning.py: train, predict, evaluate through the CLI), longer than
# one call: started under setsid in one call, collected in the next, issued at once (a machine
# is taken back 30 s after a call).
#   here, once:  bash benchmarks/device_plan.sh learn_prepare   (.devdata/learn721p and its truth)
#   1. ~30 + 560 s  run(command="bash benchmarks/device_plan.sh learn_start 13", carry=[".whl-core", ".devdata"], timeout_s=600)
#   2. ~30 + 300 s  run(command="bash benchmarks/device_plan.sh learn_collect", carry=[".whl-core", ".devdata"], timeout_s=600)
#   here:  python3 benchmarks/learning.py --record-only FILES/learn && python3 benchmarks/learning.py --plot FILES/learn
LEARN_OUT=/root/learn
LEARN="--cache .devdata/learn721p --truth .devdata/truth/721p-assembly1.cif --preset small --crop-size 416
       --diffusion-batch 32 --lr 1e-3 --warmup 100 --ema-decay 0.99 --checkpoint-every 250 --eval-every 500
       --cycles 1 --train-args=--max-recycling-cycles=1"

learn_prepare() {
    local data=../shared/data
    rm -rf .devdata/learn721p .devdata/truth .devdata/learn-alignments
    mkdir -p .devdata/truth .devdata/learn-alignments
    cp "$data"/structures/721p-assembly1.cif .devdata/truth/
    for path in "$data"/alignments/pdb/721p-*.a3m; do  # the query and the next 1023 sequences
        awk '/^>/ { n++ } n > 1024 { exit } { print }' "$path" > .devdata/learn-alignments/"$(basename "$path")"
    done
    featurecache precompute .devdata/truth --cache .devdata/learn721p --alignments .devdata/learn-alignments \
        --executor inline --shards 1 --no-progress
    rm -rf .devdata/learn-alignments
}

learn_start() {
    device_setup
    rm -rf "$LEARN_OUT" && mkdir -p "$LEARN_OUT"
    setsid nohup python3 benchmarks/learning.py $LEARN --minutes "${1:-13}" --out "$LEARN_OUT" \
        > "$LEARN_OUT/log.txt" 2>&1 < /dev/null &
    local waited=0
    while [ "$waited" -lt "${2:-550}" ] && pgrep -f benchmarks/learning.py > /dev/null; do sleep 5; waited=$((waited + 5)); done
    grep -v '^step ' "$LEARN_OUT/log.txt" | tail -5
    tail -c 300 "$LEARN_OUT/run/log.jsonl" 2>/dev/null || true
}

learn_collect() {
    device_setup
    while [ ! -f "$LEARN_OUT/learning.json" ] && pgrep -f benchmarks/learning.py > /dev/null; do sleep 5; done
    mkdir -p "$OUTDIR/learn/run"
    cp "$LEARN_OUT"/learning.json "$LEARN_OUT"/log.txt "$OUTDIR/learn/" || true
    cp "$LEARN_OUT"/run/log.jsonl "$OUTDIR/learn/run/" || true
    grep -v '^step ' "$LEARN_OUT/log.txt" | tail -12
}

# Issue 33's cost of the fp32 coordinate path (benchmarks/diffusion_precision.py: the af3 step at
# crop 384 as CUDA graphs, diffusion_coordinates_fp32 on and off, timed in alternating rounds):
#   here, once:  bash benchmarks/device_plan.sh pack_site [WHEELS]   (.devdata/site-core.tar.xz)
#   ~40 + 300 s  run(command="bash benchmarks/device_plan.sh precision", carry=[".devdata/site-core.tar.xz"], timeout_s=600)
#   here:  cp FILES/RESULTS.md FILES/results.csv benchmarks/
precision() {
    device_setup
    python3 benchmarks/diffusion_precision.py --record 2>&1 | tee "$OUTDIR/log.txt"
}

# Issue 34's inference against Protenix 2.0 (benchmarks/inference.py: af3 preset, 5 samples x 200
# steps, 4 cycles, random weights; each variant in its own process with a budget), one call per
# group of sizes, the packed core and Protenix's wheels carried:
#   here, once:  bash benchmarks/device_plan.sh peer_wheels   (.whl-peer: Protenix and its dependencies)
#   ~40 + 560 s  run(command="bash benchmarks/device_plan.sh inference 384 768", carry=[".devdata/site-core.tar.xz", ".whl-peer"], timeout_s=600)
#   ~40 + 560 s  run(command="bash benchmarks/device_plan.sh inference 1024", carry=[".devdata/site-core.tar.xz", ".whl-peer"], timeout_s=600)
#   here:  cp FILES/RESULTS.md FILES/results.csv benchmarks/
PEER_WHEELS="protenix absl_py ml_collections optree pyyaml"

peer_wheels() {  # here: Protenix's wheels and its dependencies' from .whl into .whl-peer
    grep -qx '/.whl-peer/' .git/info/exclude || printf '/.whl-peer/\n' >> .git/info/exclude
    rm -rf .whl-peer && mkdir -p .whl-peer
    for name in $PEER_WHEELS; do ln -f .whl/"$name"-*.whl .whl-peer/; done
    carry_size "$SITE_ARCHIVE" .whl-peer
}

inference() {  # LAYERNORM_TYPE=torch in the command skips Protenix's ~150 s LayerNorm build (its own switch)
    device_setup
    # Protenix's first call builds its fast LayerNorm (nvcc): on 2026-12-05 that took more than 175 s
    python3 benchmarks/inference.py --tokens ${*:-384 768 1024} --reps 1 --variant-budget-s 120 --peer-budget-s 330 --record 2>&1 |
        tee "$OUTDIR/log.txt"
}

# Issue 34's step through the CLI (benchmarks/cli_step.py: `featurecache train --cuda-graphs` on the
# cache of 721p and 7a4d, with their 1,024-row MSAs, timed from the run's log): the af3 preset at
# crop 384 (target <= 0.6 s; the headline shows its TFLOP/s) and the tiny preset (target <= 40 ms)
#   here, once:  bash benchmarks/device_plan.sh prepare   (.devdata/cache384)
#   ~40 + 540 s  run(command="bash benchmarks/device_plan.sh cli_steps", carry=[".devdata/cache384", ".devdata/site-core.tar.xz"], timeout_s=600)
#   here:  cp FILES/RESULTS.md FILES/results.csv benchmarks/
cli_steps() {
    device_setup
    python3 benchmarks/cli_step.py --cache .devdata/cache384 --preset tiny --crop 384 --steps 120 --minutes 2 \
        --out /root/cli-tiny --record 2>&1 | grep -av '^step ' | tee "$OUTDIR/log.txt"
    python3 benchmarks/cli_step.py --cache .devdata/cache384 --preset af3 --crop 384 --steps 60 --minutes "${1:-6}" \
        --out /root/cli-af3 --record 2>&1 | grep -av '^step ' | tee -a "$OUTDIR/log.txt"
}

# The tiny preset's graphed step, kernel by kernel (tiny_step.py --kernel-profile): NOTES.md
# section 7 predicts a step of mostly kernels under 5 us (launch-bound), the mini-rollout's share
# near its share of operators; this counts the kernels a step and what they cost
#   here, once:  bash benchmarks/device_plan.sh prepare   (.devdata/cache384)
#   ~40 + 200 s  run(command="bash benchmarks/device_plan.sh tiny_profile", carry=[".devdata/cache384", ".devdata/site-core.tar.xz"], timeout_s=400)
tiny_profile() {
    device_setup
    python3 benchmarks/tiny_step.py --cache .devdata/cache384 --device cuda --cuda-graphs --steps 30 \
        --kernel-profile 5 --record 2>&1 | tee "$OUTDIR/log.txt"
    python3 benchmarks/tiny_step.py --cache .devdata/cache384 --device cuda --cuda-graphs --steps 30 \
        --kernel-profile 5 --setting confidence_rollout_steps=2 2>&1 | tail -40 | tee -a "$OUTDIR/log.txt"
}

# The same kernel profile for the af3 preset on the same real data (the Trainer `featurecache train`
# builds, CUDA graphs, crop 384): the step the issue's <= 0.6 s target is about, kernel by kernel
#   here, optionally:  bash benchmarks/device_plan.sh base_export COMMIT   (.devdata/base: the tiny step
#                      of that commit's package runs beside this one's first; add ".devdata/base" to carry)
#   ~40 + 560 s  run(command="bash benchmarks/device_plan.sh step_profiles", carry=[".devdata/cache384", ".devdata/site-core.tar.xz"], timeout_s=600)
step_profiles() {
    device_setup
    # with .devdata/base (here: base_export COMMIT), that commit's package side by side first
    local beside=()
    [ -f .devdata/base/featurecache/__init__.py ] && beside=(--variant "$(cat .devdata/base/COMMIT)=.devdata/base")
    timeout 200 python3 benchmarks/tiny_step.py --cache .devdata/cache384 --device cuda --cuda-graphs --steps 30 \
        "${beside[@]}" --record 2>&1 | tee "$OUTDIR/log.txt" || true
    timeout 90 python3 benchmarks/tiny_step.py --cache .devdata/cache384 --device cuda --cuda-graphs --steps 5 \
        --kernel-profile 5 2>&1 | tee -a "$OUTDIR/log.txt" || true
    # two atom buckets: ~8 warm-up and capture steps, so 16 steps give ~8 replays (the median's)
    timeout "${1:-360}" python3 benchmarks/tiny_step.py --cache .devdata/cache384 --preset af3 --device cuda \
        --cuda-graphs --steps 16 --kernel-profile 2 --record 2>&1 | tee -a "$OUTDIR/log.txt"
}

# The af3 step of this tree beside .devdata/base's package (base_export COMMIT), in one call on one
# machine: a change's effect on the graphed af3 step at crop 384, then both kernel profiles
#   ~40 + 560 s  run(command="bash benchmarks/device_plan.sh af3_beside", carry=[".devdata/cache384", ".devdata/site-core.tar.xz", ".devdata/base"], timeout_s=600)
af3_beside() {
    device_setup
    timeout "${1:-540}" python3 benchmarks/tiny_step.py --cache .devdata/cache384 --preset af3 --device cuda \
        --cuda-graphs --steps "${2:-14}" --kernel-profile 2 --variant "$(cat .devdata/base/COMMIT)=.devdata/base" \
        --record 2>&1 | tee "$OUTDIR/log.txt"
}

# Where the af3 step's pair kernels stand against PyTorch's own at the model's shapes (the
# forwards, and the Transition's backward with dx tile candidates), and EvoAttention at L = 768
# (issue 34's two targets). Ran 2026-12-06 06:43 (NOTES.md section 13; the backward since added).
#   ~40 + 360 s  run(command="bash benchmarks/device_plan.sh explore", carry=[".devdata/site-core.tar.xz"], timeout_s=480)
explore() {
    device_setup
    timeout 150 python3 benchmarks/pair_forwards.py 2>&1 | tee "$OUTDIR/log.txt" || true
    timeout "${1:-200}" python3 benchmarks/evo768_sweep.py --budget-s "$(( ${1:-200} - 30 ))" 2>&1 | tee "$OUTDIR/evo768.txt"
}

# EvoAttention's backward modes at the triangle shapes (L = 384 and 768), with and without the
# shared bias's gradient (evo_bwd_parts.py). Ran 2026-12-07 10:17 (NOTES-evo_attention.md attempt 11).
#   ~40 + 90 s  run(command="FC_COMMIT=<HEAD> bash benchmarks/device_plan.sh evo_modes", carry=[".devdata/site-core.tar.xz"], timeout_s=240)
evo_modes() {
    device_setup
    timeout "${1:-200}" python3 benchmarks/evo_bwd_parts.py 2>&1 | tee "$OUTDIR/log.txt"
}

# A kernel change timed alone beside its parent before the step: .devdata/base's package (base_export,
# as af3_beside's) and this tree's, each in its own process, through pair_forwards.py --only PARTS
# ("evo" for evo_bwd_parts.py, EvoAttention's backward modes). Each part ~40-70 s a package.
#   ~40 + 160 s  run(command="FC_COMMIT=<HEAD> bash benchmarks/device_plan.sh kernels_beside transition_backward evo", carry=[".devdata/site-core.tar.xz", ".devdata/base"], timeout_s=300)
kernels_beside() {
    device_setup
    local pair=() evo=false root part
    for part in "$@"; do
        if [ "$part" = evo ]; then evo=true; else pair+=("$part"); fi
    done
    for root in .devdata/base "$PWD"; do
        echo "=== package of $([ "$root" = .devdata/base ] && cat .devdata/base/COMMIT || echo "$FC_COMMIT") ($root)"
        if [ ${#pair[@]} -gt 0 ]; then
            FC_PACKAGE_ROOT=$root timeout 150 python3 benchmarks/pair_forwards.py --only "${pair[@]}" 2>&1 | tail -14 || true
        fi
        if $evo; then
            FC_PACKAGE_ROOT=$root timeout 90 python3 benchmarks/evo_bwd_parts.py 2>&1 | tail -8 || true
        fi
    done | tee "$OUTDIR/log.txt"
}

# The pair kernels alone (pair_forwards.py: LayerNorm-linear forward tiles,
# the Transition's forward and dx tiles): a kernel change's effect before the step's.
#   ~40 + 200 s  run(command="FC_COMMIT=<HEAD> bash benchmarks/device_plan.sh pair_kernels", carry=[".devdata/site-core.tar.xz"], timeout_s=280)
#   (FC_COMMIT written out: the device copy's .git can be stale; 2026-12-06 it named a0ebbe0 for 80fca03)
pair_kernels() {
    device_setup
    timeout "${1:-230}" python3 benchmarks/pair_forwards.py 2>&1 | tee "$OUTDIR/log.txt"
}

# What recomputation costs the af3 step (checkpoint_blocks off: every block keeps its activations,
# memory permitting) and the tiny graphed step. Ran 2026-12-06 06:49 (NOTES.md section 13): without
# checkpoints the af3 step needs 79-82 GB and its capture ran out of an H100's 80 GB.
#   ~40 + 240 s  run(command="bash benchmarks/device_plan.sh recompute_cost", carry=[".devdata/cache384", ".devdata/site-core.tar.xz"], timeout_s=300)
recompute_cost() {
    device_setup
    timeout 150 python3 benchmarks/tiny_step.py --cache .devdata/cache384 --preset af3 --device cuda --cuda-graphs \
        --steps 12 --setting checkpoint_blocks=false 2>&1 | tee "$OUTDIR/log.txt" || true
    timeout 90 python3 benchmarks/tiny_step.py --cache .devdata/cache384 --device cuda --cuda-graphs --steps 30 \
        --record 2>&1 | tee -a "$OUTDIR/log.txt" || true
}

# The operators behind an eager af3 step's kernels (tiny_step.py --gpu-operators): where the graphed
# step's 44 ms of bf16 copies and 123 ms of sub-5-us kernels come from. A fresh machine compiles
# the Triton kernels in the first eager step (84 s on 2026-12-06), then the profiled step records
# ~70k kernels with their operators: give it the whole call.
#   ~40 + 500 s  run(command="bash benchmarks/device_plan.sh gpu_operators", carry=[".devdata/cache384", ".devdata/site-core.tar.xz"], timeout_s=560)
gpu_operators() {
    device_setup
    timeout "${1:-500}" python3 benchmarks/tiny_step.py --cache .devdata/cache384 --preset af3 --device cuda --steps 1 \
        --gpu-operators 70 2>&1 | tee "$OUTDIR/log.txt"
}

# Issue 34's two unmeasured size targets, this tree alone: inference at 1,024 tokens with the
# sampler's graph (target <= 20 s) and the graphed af3 training step at crop 768 (target <= 2.0 s)
#   ~40 + 420 s  run(command="bash benchmarks/device_plan.sh large_targets", carry=[".devdata/cache384", ".devdata/site-core.tar.xz"], timeout_s=480)
large_targets() {
    device_setup
    timeout 170 python3 benchmarks/inference.py --tokens 1024 --variants featurecache+graphs --reps 1 \
        --variant-budget-s 160 --record 2>&1 | tee "$OUTDIR/log.txt" || true
    timeout "${1:-260}" python3 benchmarks/tiny_step.py --cache .devdata/cache384 --preset af3 --crop 768 --device cuda \
        --cuda-graphs --steps 11 --record 2>&1 | tee -a "$OUTDIR/log.txt" || true
}

# Issue 34's two training-step targets on one machine, this tree alone: the graphed af3 step at
# crop 384 (with its kernel profile) and at crop 768. A fresh machine compiles the Triton kernels
# in the first step (~95 s); 768 reuses most of them.
#   ~40 + 540 s  run(command="FC_COMMIT=<HEAD> bash benchmarks/device_plan.sh step_targets", carry=[".devdata/cache384", ".devdata/site-core.tar.xz"], timeout_s=600)
step_targets() {
    device_setup
    timeout "${1:-280}" python3 benchmarks/tiny_step.py --cache .devdata/cache384 --preset af3 --device cuda \
        --cuda-graphs --steps 14 --kernel-profile 2 --record 2>&1 | tee "$OUTDIR/log.txt" || true
    timeout "${2:-250}" python3 benchmarks/tiny_step.py --cache .devdata/cache384 --preset af3 --crop 768 --device cuda \
        --cuda-graphs --steps 16 --record 2>&1 | tee -a "$OUTDIR/log.txt" || true
}

# The output gates' kernels (sigmoid_gate, swiglu) beside the PyTorch composition and
# torch.compile of it, at the af3 step's shapes (each checked against float64 first, op_bench.py).
#   ~40 + 120 s  run(command="FC_COMMIT=<HEAD> bash benchmarks/device_plan.sh output_gates", carry=[".devdata/site-core.tar.xz"], timeout_s=180)
output_gates() {
    device_setup
    timeout "${1:-120}" python3 benchmarks/output_gates.py --out "$OUTDIR" --record 2>&1 | tee "$OUTDIR/log.txt"
}

# The H100's own block sizes for the Transition and the triangle multiplication (their kernels:
# ~160 ms of the af3 step's 908 on the H100, which runs the H200's table), then their effect on the
# graphed af3 step: this tree's package as it came (the base) beside the tree with the winners.
#   ~40 + 560 s  run(command="FC_COMMIT=<HEAD> bash benchmarks/device_plan.sh h100_tables", carry=[".devdata/cache384", ".devdata/site-core.tar.xz"], timeout_s=600)
#   here:  python3 benchmarks/apply_sweep.py FILES/*_sweep.json --device "NVIDIA H100 80GB HBM3"
h100_tables() {
    device_setup
    mkdir -p /tmp/base && cp -r featurecache /tmp/base/ && echo "$FC_COMMIT" > /tmp/base/COMMIT
    timeout "${1:-130}" python3 benchmarks/transition.py --sweep --variants 5 --no-peers --out "$OUTDIR" \
        2>&1 | tee "$OUTDIR/log.txt" || true
    timeout "${2:-200}" python3 benchmarks/triangle_mult.py --sweep --variants 5 --no-peers --out "$OUTDIR" \
        2>&1 | tee -a "$OUTDIR/log.txt" || true
    compgen -G "$OUTDIR/*_sweep.json" > /dev/null || return 0
    python3 benchmarks/apply_sweep.py "$OUTDIR"/*_sweep.json 2>&1 | tee -a "$OUTDIR/log.txt"
    cp featurecache/kernels/configs/fused_ops.json "$OUTDIR"/
    timeout "${3:-230}" python3 benchmarks/tiny_step.py --cache .devdata/cache384 --preset af3 --device cuda \
        --cuda-graphs --steps 14 --kernel-profile 2 --variant "$FC_COMMIT=/tmp/base" \
        2>&1 | tee -a "$OUTDIR/log.txt" || true
}

base_export() {  # here: COMMIT's featurecache package into .devdata/base (a --variant checkout for a device call)
    rm -rf .devdata/base && mkdir -p .devdata/base
    git archive "$1" featurecache | tar -x -C .devdata/base
    git rev-parse --short "$1" > .devdata/base/COMMIT
}

# Issue 33's generalisation (benchmarks/generalisation.py): `featurecache train --preset small` on
# 117 real PDB entries with --validate-every on 12 held out by 40 % sequence cluster
# (benchmarks/generalisation/entries.csv), started under setsid in one call, collected in the next.
#   here, once:  fetch every repository entries.csv names (the `fetch` tool: github:OWNER/NAME;
#                `cut -d, -f4 benchmarks/generalisation/entries.csv | sort -u` lists them), then
#                bash benchmarks/device_plan.sh general_prepare [WHEELS]
#                (.devdata/general/cache with query-only MSAs, .devdata/site-core.tar.xz from the
#                wheels in WHEELS (default .whl-core); prints the carry's size against 64 MiB)
#   check here:  bash benchmarks/device_plan.sh general_smoke   (the same steps at the tiny preset)
#   1. ~40 + 560 s  run(command="bash benchmarks/device_plan.sh general_start 14", carry=[".devdata/general/cache", ".devdata/general/components.bcif", ".devdata/site-core.tar.xz"], timeout_s=600)
#   2. ~40 + 420 s  run(command="bash benchmarks/device_plan.sh general_collect", carry=[".devdata/general/cache", ".devdata/general/components.bcif", ".devdata/site-core.tar.xz"], timeout_s=600)
#   or both in one call, a shorter run:
#      ~40 + 560 s  run(command="bash benchmarks/device_plan.sh general_once 7.3 460 110", carry=[...as above], timeout_s=600)
#   (2026-12-05: two pairs of calls lost their runs. At 18:08 the cause was found: call 2's copy of the
#   tree rewrote the carried LMDB in place under the data workers' maps, and a worker segfaulted;
#   general_start now trains from a copy outside the tree. A 7.6-minute general_once on the H100
#   reached step 501 (validation lDDT 0.084 -> 0.258): ~165 s of the budget go to the first step's
#   compilation and the three validations, so the pair of calls (~1,700 steps) is the better figure;
#   the run stopped cleanly but its process then segfaulted at exit, since fixed in train (unverified))
#   here:  mkdir -p .devout/general && tar -xzf FILES/general.tar.gz -C .devout/general &&
#          python3 benchmarks/generalisation.py record .devout/general   (RESULTS.md, results.csv, the figure)
GENERAL_OUT=/root/general
GENERAL_CARRY=".devdata/general/cache $CCD_CUT $SITE_ARCHIVE"

general_prepare() {
    python3 benchmarks/generalisation.py prepare
    python3 benchmarks/generalisation.py ccd "$CCD_CUT"
    pack_site "${1:-.whl-core}"
    carry_size $GENERAL_CARRY
}

pack_site() {  # the wheels in $1 installed into a folder, as pip --target would, then tar.xz
    local wheels=${1:-.whl-core} site
    for name in $CORE_WHEELS; do
        compgen -G "$wheels/$name-*.whl" > /dev/null || { echo "$wheels: no $name wheel" >&2; return 2; }
    done
    site=$(mktemp -d)
    for name in $CORE_WHEELS; do python3 -m zipfile -e "$wheels"/"$name"-*.whl "$site"; done
    tar -C "$site" -cf - . | xz -6 -T0 > "$SITE_ARCHIVE"
    rm -rf "$site"
}

carry_size() {  # the tree and the carried paths against a call's 64 MiB
    local total
    total=$(( $(git ls-files -z | xargs -0 du -cb | tail -1 | cut -f1) + $(du -cb "$@" | tail -1 | cut -f1) ))
    echo "tree + $* = $total bytes of $LIMIT ($(( (LIMIT - total) / 1024 )) KiB spare)"
    [ "$total" -lt "$LIMIT" ] || { echo "does not fit: shrink the cache or the wheels" >&2; return 2; }
}

general_start() {
    device_setup
    rm -rf "$GENERAL_OUT" && mkdir -p "$GENERAL_OUT"
    # the run reads its own copy: the next call's copy of the tree rewrites the carried cache in place,
    # under the data workers' memory maps (2026-12-05 18:08: a worker's segfault ended a run there)
    cp -r .devdata/general/cache "$GENERAL_OUT/cache"
    setsid nohup python3 benchmarks/generalisation.py run "$GENERAL_OUT" --cache "$GENERAL_OUT/cache" \
        --minutes "${1:-14}" > "$GENERAL_OUT/log.txt" 2>&1 < /dev/null &
    local waited=0
    while [ "$waited" -lt "${2:-550}" ] && pgrep -f benchmarks/generalisation.py > /dev/null; do
        sleep 5; waited=$((waited + 5))
    done
    grep -av '^step ' "$GENERAL_OUT/log.txt" | tail -8
    tail -c 300 "$GENERAL_OUT/run/log.jsonl" 2>/dev/null || true
}

general_collect() {
    device_setup
    while [ ! -f "$GENERAL_OUT/generalisation.json" ] && pgrep -f benchmarks/generalisation.py > /dev/null; do sleep 5; done
    grep -av '^step ' "$GENERAL_OUT/log.txt" | tail -16
    # the held-out entries whole (uncropped) through `featurecache predict` with the run's last EMA
    # weights; the top-ranked mmCIF of each comes back to be scored here by `featurecache evaluate`
    # (predict reads biotite's CCD to name residues: $SITE_ARCHIVE's biotite has none, so the carried
    # $CCD_CUT stands in; without it predict stopped with "Internal CCD not found" on 2026-12-05)
    local keys
    keys=$(python3 benchmarks/generalisation.py keys | tr , ' ')
    if [ -f "$GENERAL_OUT/run/weights.pt" ]; then
        timeout "${1:-240}" python3 -m featurecache.cli predict $keys --cache "$GENERAL_OUT/cache" \
            --checkpoint "$GENERAL_OUT/run/weights.pt" --out "$GENERAL_OUT/predictions" --samples 5 --steps 200 \
            --cycles 1 --cuda-graphs > "$GENERAL_OUT/predict.txt" 2>&1 || echo "predict: exit $?"
        tail -4 "$GENERAL_OUT/predict.txt"
    fi
    # one archive: at most 8 files come back from a call
    local kept=(generalisation.json log.txt predict.txt run/log.jsonl)
    for key in $keys; do kept+=("predictions/$key/${key}_model.cif"); done
    (cd "$GENERAL_OUT" && tar -czf "$OUTDIR/general.tar.gz" --ignore-failed-read "${kept[@]}" 2>/dev/null) || true
    ls -la "$OUTDIR/general.tar.gz"
}

general_once() {  # start and collect in one call (a shorter run; nothing is lost if the machine is taken back between calls)
    general_start "${1:-7.3}" "${2:-460}"
    general_collect "${3:-110}"
}

general_smoke() {  # here: general_start's and record's code on the CPU, tiny preset, 4 steps, 3 validation entries
    local out=${1:-/tmp/general-smoke}
    rm -rf "$out" && mkdir -p "$out/results"
    python3 benchmarks/generalisation.py check
    python3 benchmarks/generalisation.py run "$out/general" --smoke
    cp benchmarks/RESULTS.md benchmarks/results.csv "$out/results/"
    python3 benchmarks/generalisation.py record "$out/general" --results "$out/results"
}

# The same invocations at tiny sizes on the CPU (here; PYTHONPATH must hold protenix for c):
# a = call 3 (aot_eager: inductor's C++ compilation of the blocks took > 15 min on 2 busy cores),
# b = the triton variants (interpreted; triton+graphs reports "needs a CUDA device"), c = call 1's
# Protenix and data wait, d = call 2's crop search with its checkpoint group
smoke() {
    local out=${1:-/tmp/device-plan-smoke}
    local tiny="--smoke --model af3 --depth 1 --crop 24 --diffusion-batch 2 --msa-rows 8 --templates 1 --block-lengths --no-checks --budget-s 1200"
    python3 benchmarks/train_step.py $tiny --variants eager compile --compile-backend aot_eager --crop-budget-s 0 \
        --out "$out/a"
    TRITON_INTERPRET=1 python3 benchmarks/train_step.py $tiny --variants triton+graphs triton triton+compile \
        --compile-backend aot_eager --step-warmup 1 --step-reps 1 --crop-budget-s 0 --out "$out/b"
    python3 benchmarks/train_step.py $tiny --variants protenix --cache .devdata/cache384 --data-kernels torch \
        --data-steps 4 --crop-budget-s 0 --merge "$out/a/train_step.json" "$out/b/train_step.json" --out "$out/c"
    python3 benchmarks/train_step.py $tiny --variants eager --crop-checkpoint-group 2 --crop-start eager=24 \
        --crop-step 8 --crop-limit 32 --crop-budget-s 300 --out "$out/d"
}

"${1:?usage: device_plan.sh prepare|peer_wheels|base_export|cli_steps|step_profiles|af3_beside|kernels_beside|explore|evo_modes|pair_kernels|recompute_cost|gpu_operators|large_targets|step_targets|inference|call1|call2|call3|peer|compile|kernels|learn_prepare|learn_start|learn_collect|precision|pack_site|general_prepare|general_start|general_collect|general_smoke|h100_tables|output_gates|smoke [OUT]}" "${@:2}"
