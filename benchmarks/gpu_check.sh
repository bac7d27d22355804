#!/usr/bin/env bash
# The GPU check: one command that measures the project on one GPU in <= 9 minutes (issue 31).
#
#   bash ../shared/gpu/prepare.sh          # here, once: wheels for the GPU machine (carry .gpu)
#   source .gpu/device_setup.sh && RESULTS=$OUT COMMIT=<hash> bash benchmarks/gpu_check.sh   # there
#   DEV=cpu RESULTS=/tmp/check bash benchmarks/gpu_check.sh                # CI: the same stages, tiny
#
# Staged by value; each stage writes its results, and the report ($RESULTS/cuda.md, cuda.json) is
# rewritten after every stage, so a call cut off by its time limit still leaves a table:
#   1. conformance on every fixture: float32 on the device against the references and the CPU;
#      bfloat16 and float16 drift (benchmarks/device_conformance.py); LSG (every sparsity type) and
#      LED on the flex path against the whole-tensor path, outputs and gradients (flex_gradcheck.py);
#   2. encoder forward at 16K and 64K: linear, bart, lsg_norm, led, locost (bf16, batch 1, base), and
#      one profiled call of each (gpu_check/profile_<arch>_enc_<length>.txt: the kernels by device time);
#   3. fairseq-train smokes (30 updates, tiny archs) with --fp16 and --bf16: finite, decreasing loss,
#      LOCOST's parameter group lines in the log (the four runs side by side on the GPU);
#   4. forward+backward at 16K (one profiled step of each: profile_<arch>_train_16384.txt), and at
#      64K with --checkpoint-activations;
#   5. while time is left: LOCOST at 600K; LSG and LED on both GPU paths (whole tensors, what auto
#      takes, and flex, forced) beside linear at 16K and 64K; the encoder layers compiled (run.py
#      --compile-layers: linear, bart, lsg_norm, led, forward+backward at 16K and the encoder at 4K:
#      how much of a row is the host's eager dispatch); training at 16K with 4 sequences a call
#      (run.py --batch: the device's pace); one attention layer alone, eager, in a
#      CUDA graph and compiled (benchmarks/layer_probe.py: launch-bound or not); LOCOST's S4D layer
#      alone at 16K and 64K, in variants (benchmarks/conv_probe.py); LOCOST with the fused (compiled) kernel
#      generator at 16K, cached and not, beside bart; the flex kernel alone in variants at 16K
#      (benchmarks/flex_probe.py: which change moves it); 4K rows; hf_bart / hf_led at 16K;
#      generation at 16K (beam 4); the fused generator's product in TF32 for training.
# Benchmark rows run in one process per stage (run.py --one-process): spawning one per row cost
# ~13 s each on the first GPU reading.
#
# Environment: DEV (cuda | cpu), RESULTS (default benchmarks/results), BUDGET_S (seconds for the
# whole check, default 480: stages that would not fit are recorded as not run), STAGES (the names of
# the stages to run, in the order above whatever the order given, or the groups `timed` (every
# benchmark stage) and `untimed` (conformance, flex_grad, train_smoke); default all: the others are
# recorded as not selected), COMMIT (the commit measured, where the copy has no .git), PYTHON
# (default python), FORCE (1: replace the check RESULTS holds; without it such a folder is refused).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
# shellcheck source=scripts/lib.sh
source scripts/lib.sh  # die
DEV=${DEV:-cuda}
RESULTS=${RESULTS:-benchmarks/results}
BUDGET_S=${BUDGET_S:-480}
PYTHON=${PYTHON:-python}
COMMIT=${COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}
ALL_STAGES="conformance flex_grad enc train_smoke train16k train64k_ckpt locost600k paths compiled16k compiled4k train16k_b4 \
layerprobe convprobe fused16k flexprobe extra4k peers16k gen16k fused16k_tf32"
# right or wrong, not fast or slow: these may share the GPU with other work (benchmarks/gpu_call.sh)
UNTIMED_STAGES="conformance flex_grad train_smoke"
selected=""
for name in ${STAGES:-}; do
    case $name in
    timed) for s in $ALL_STAGES; do [[ " $UNTIMED_STAGES " == *" $s "* ]] || selected+=" $s"; done ;;
    untimed) selected+=" $UNTIMED_STAGES" ;;
    *) [[ " $ALL_STAGES " == *" $name "* ]] \
        || die "STAGES: unknown stage '$name' (stages: $ALL_STAGES; groups: timed, untimed)"
        selected+=" $name" ;;
    esac
done
STAGES=${selected# }
# every setting checked before anything is written: a refusal after the folder is made would leave a
# check there that the corrected run is refused for
case $DEV in cuda|cpu) ;; *) die "DEV=$DEV: expected cuda or cpu" ;; esac
whole_numbers BUDGET_S
command -v "$PYTHON" > /dev/null || die "PYTHON=$PYTHON: no such command"
# the run's record, and whether DEV=cuda has a GPU (exit 3 if not), in one torch import
env_json=$("$PYTHON" - "$DEV" "$COMMIT" "$STAGES" 2> /dev/null <<'EOF'
import datetime, json, os, platform, sys
import torch
from lsg_text.provenance import cpu_name
dev, commit, selected = sys.argv[1:4]
if dev == "cuda" and not torch.cuda.is_available():
    sys.exit(3)
card = torch.cuda.get_device_name() if dev == "cuda" and torch.cuda.is_available() else f"CPU: {cpu_name()}"
print(json.dumps({"device": dev, "card": card, "torch": torch.__version__, "cuda": torch.version.cuda,
                  "python": platform.python_version(), "commit": commit, "cpu": cpu_name(),
                  "stages_selected": selected.split() or "all",
                  "load_average_start": [round(x, 2) for x in os.getloadavg()],
                  "started": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}))
EOF
)
case $? in
    0) ;;
    3) die "DEV=cuda: torch sees no CUDA GPU here (DEV=cpu runs the tiny check)" ;;
    *) die "PYTHON=$PYTHON: a python with torch and lsg_fairseq is needed" ;;
esac
work="$RESULTS/gpu_check"
# A folder that holds a check is replaced only when asked, and then as a whole: the report reads every
# stage file it finds, so an earlier check's files would sit in this one's tables under this card's name.
held=
for f in "$RESULTS/cuda.md" "$RESULTS/cuda.json" "$work/stages.tsv"; do
    [ -n "$held" ] || [ ! -e "$f" ] || held=$f  # the first that is there, named in the refusal
done
if [ -n "$held" ]; then
    [ -n "${FORCE:-}" ] \
        || die "RESULTS=$RESULTS holds a check ($held): another RESULTS for a new one, or FORCE=1 to replace it"
    rm -rf "$work" "$RESULTS/cuda.md" "$RESULTS/cuda.json"
fi
mkdir -p "$work"
: > "$work/stages.tsv"
echo "$env_json" > "$work/env.json"
start=$(date +%s)
left() { echo $(( BUDGET_S - ($(date +%s) - start) )); }
export PYTHONUNBUFFERED=1

report() {
    "$PYTHON" benchmarks/gpu_check_report.py --work "$work" --out "$RESULTS/cuda" > /dev/null \
        || echo "gpu_check.sh: the report failed" >&2
}

# stage NAME MIN_SECONDS COMMAND...: runs COMMAND if MIN_SECONDS are left, within what is left
stage() {
    local name=$1 need=$2; shift 2
    local t0 status remaining
    if [ -n "$STAGES" ] && [[ " $STAGES " != *" $name "* ]]; then
        printf '%s\tnot selected (STAGES)\t0\n' "$name" >> "$work/stages.tsv"
        return
    fi
    remaining=$(left)
    if [ "$remaining" -lt "$need" ]; then
        printf '%s\tnot run: %ss left, needs %ss\t0\n' "$name" "$remaining" "$need" >> "$work/stages.tsv"
        echo "== $name: not run ($remaining s left)"
        return
    fi
    echo "== $name ($remaining s left)"
    t0=$(date +%s)
    timeout --kill-after=10 "$remaining" "$@" > "$work/$name.log" 2>&1
    case $? in
        0) status=ok ;;
        124|137) status="cut off at the time limit" ;;
        *) status="failed (see gpu_check/$name.log)" ;;
    esac
    printf '%s\t%s\t%s\n' "$name" "$status" "$(( $(date +%s) - t0 ))" >> "$work/stages.tsv"
    tail -n 3 "$work/$name.log"
    report
}

if [ "$DEV" = cuda ]; then
    bench=(benchmarks/run.py --device cuda --dtype bf16 --one-process --control-row --warmup 2 --repeat 5 --budget 3
           --timeout 240 --max-full-length 65536 --out "$work" --no-plots)
    conformance=(--device cuda)
    flex=(--device cuda)
    L16=16384; L64=65536; L4=4096; L600=600000; UPDATES=30; TRAIN_TOKENS=4096; DOC_TOKENS=300
    PATH_LENGTHS=("$L16" "$L64"); PATH_ARCHS=(linear lsg_norm lsg_norm_flex led led_flex)
    probe=(--device cuda --length "$L16")
    conv=(--device cuda --lengths "$L16" "$L64")
    layer=(--device cuda --length "$L16" --variants model cuda_graph)  # the compiled row when time allows
    COMPILED=(--compile-layers --arch linear bart lsg_norm led)
    BATCHED=(--batch 4 --arch linear bart lsg_norm led)
elif [ "$DEV" = cpu ]; then  # the CI smoke: every stage at tiny sizes
    bench=(benchmarks/run.py --device cpu --dtype bf16 --one-process --control-row --smoke --out "$work" --no-plots)
    conformance=(--device cpu --layer-path whole --families led --dtypes fp32 bf16)
    flex=(--device cpu --cases led)  # forward only there
    L16=256; L64=512; L4=128; L600=1024; UPDATES=4; TRAIN_TOKENS=400; DOC_TOKENS=80
    # flex compiles per row and length on a CPU: one of each holds the stage
    PATH_LENGTHS=("$L16"); PATH_ARCHS=(lsg_norm led led_flex)
    probe=(--device cpu --eager --length 512 --heads 2 --head-dim 16 --warmup 0 --repeat 1 --variants model all_full)
    conv=(--device cpu --lengths "$L16" --channels 32 --warmup 0 --repeat 1 --variants model transposed)
    layer=(--device cpu --length "$L16" --dim 64 --heads 4 --paths lsg_whole led_whole --variants model cuda_graph
           --warmup 0 --repeat 1)
    export RUNS="locost_tiny:fp16 lsg_bart_tiny:bf16"  # one of each precision (a CPU's float16 is slow)
    # the plumbing only: the captured graphs run by eager kernels (generating a CPU's code for them
    # takes a minute; tests/test_compiled_layers.py does that once)
    COMPILED=(--compile-layers --compile-backend aot_eager --arch lsg_norm)
    BATCHED=(--batch 2 --arch lsg_norm led)
else
    die "DEV=$DEV: expected cuda or cpu"
fi

# 1. conformance
stage conformance 60 "$PYTHON" benchmarks/device_conformance.py "${conformance[@]}" --out "$work/conformance.json"
stage flex_grad 40 "$PYTHON" benchmarks/flex_gradcheck.py "${flex[@]}" --out "$work/flex_grad.json"
# 2. encoder forward
# locost_cold: the S4D split with every kernel generated in the call (issue 32: "cached and not"),
# beside the rows it splits; last, so that a stage cut off by its time loses it first
stage enc 60 "$PYTHON" "${bench[@]}" --tag enc --modes enc --lengths "$L16" "$L64" --profile \
    --arch linear bart lsg_norm led locost locost_cold
# 3. fairseq-train smokes
stage train_smoke 60 bash benchmarks/gpu_train_smoke.sh "$work/train_smoke" "$DEV" "$UPDATES" "$TRAIN_TOKENS" \
    "$DOC_TOKENS"
# 4. forward + backward
stage train16k 40 "$PYTHON" "${bench[@]}" --tag train16k --modes train --lengths "$L16" --profile \
    --arch linear bart lsg_norm led locost
stage train64k_ckpt 40 "$PYTHON" "${bench[@]}" --tag train64k_ckpt --modes train --lengths "$L64" \
    --checkpoint-activations --arch linear lsg_norm led locost
# 5. while time is left, most wanted first (the issues' targets: 600K, both GPU paths, 4K, the HF peers)
stage locost600k 60 "$PYTHON" "${bench[@]}" --tag locost600k --modes enc --lengths "$L600" --warmup 1 \
    --repeat 1 --arch locost
stage paths 60 "$PYTHON" "${bench[@]}" --tag paths --modes enc train --lengths "${PATH_LENGTHS[@]}" \
    --arch "${PATH_ARCHS[@]}"
# the layers compiled: does the host's dispatch set the pace? The rows the host sets at batch 1 and
# the targets judge: training at 16K, the encoder at 4K (each row compiles its own graphs: no others)
stage compiled16k 120 "$PYTHON" "${bench[@]}" --tag compiled16k --modes train --lengths "$L16" --profile "${COMPILED[@]}"
stage compiled4k 90 "$PYTHON" "${bench[@]}" --tag compiled4k --modes enc --lengths "$L4" "${COMPILED[@]}"
# training at 16K with several sequences a call: where the device, not the host, sets the pace (the
# targets are at batch 1; these rows are shown, never judged)
stage train16k_b4 40 "$PYTHON" "${bench[@]}" --tag train16k_b4 --modes train --lengths "$L16" "${BATCHED[@]}"
stage layerprobe 40 "$PYTHON" benchmarks/layer_probe.py "${layer[@]}" --profile-dir "$work" --out "$work/layerprobe.json"
stage convprobe 40 "$PYTHON" benchmarks/conv_probe.py "${conv[@]}" --out "$work/convprobe.json"
stage fused16k 60 "$PYTHON" "${bench[@]}" --tag fused16k --modes enc train --lengths "$L16" --locost-kernel-compile \
    --arch bart locost locost_cold
stage flexprobe 90 "$PYTHON" benchmarks/flex_probe.py "${probe[@]}" --out "$work/flexprobe.json"
stage extra4k 40 "$PYTHON" "${bench[@]}" --tag extra4k --modes enc train --lengths "$L4" \
    --arch linear bart lsg_norm led locost hf_bart hf_led
stage peers16k 40 "$PYTHON" "${bench[@]}" --tag peers16k --modes enc train --lengths "$L16" --arch hf_bart hf_led
stage gen16k 60 "$PYTHON" "${bench[@]}" --tag gen16k --modes gen --lengths "$L16" --beam 4 \
    --arch linear lsg_norm led locost
stage fused16k_tf32 40 "$PYTHON" "${bench[@]}" --tag fused16k_tf32 --modes train --lengths "$L16" --locost-kernel-compile \
    --locost-kernel-product tf32 --arch locost
report
echo "wrote $RESULTS/cuda.md and $RESULTS/cuda.json in $(( $(date +%s) - start )) s"
