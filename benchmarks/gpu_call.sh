#!/usr/bin/env bash
# A lent GPU machine's session in two device calls (the device tool runs each from the project root
# there, `.gpu` carried: ../shared/gpu/README.md; what a call leaves in $OUT comes back, at most 8 files).
#
#   bash benchmarks/gpu_call.sh check COMMIT      # 1st call: set up; the timed stages of
#                                                 # benchmarks/gpu_check.sh (TIMED_STAGES, BUDGET_S) while the
#                                                 # long_context data is made on the CPUs; then the
#                                                 # long_context run in its own session, and beside it the
#                                                 # untimed stages (CHECK_STAGES, CHECKS_BUDGET_S)
#   bash benchmarks/gpu_call.sh collect SECONDS   # 2nd call, at once: waits up to SECONDS for that run
#   bash benchmarks/gpu_call.sh more COMMIT SECONDS STAGE...  # a later call on the still-warm machine:
#                                                 # more timed stages (after the long_context run
#                                                 # ended), SECONDS for them; files back: cuda_more.md,
#                                                 # cuda_more.json, gpu_more.tgz
#
# Timed stages have the GPU to themselves; the untimed ones (conformance, the flex gradient check, the
# train smokes: right or wrong, not fast or slow) share it with the long_context training, which is
# only timed as a whole run's wall. Defaults: TIMED_STAGES "timed" (gpu_check.sh's group: every
# benchmark stage), CHECK_STAGES "untimed" (conformance, flex_grad, train_smoke); an empty
# CHECK_STAGES skips the second check.
#
# The long_context run (issue 31), only where LC_ARCHS names its rows (default none: lsg_norm and
# bart_1024 are measured, examples/long_context/gpu_fp16/; the two took 365 s on an H200):
# examples/long_context/run.sh with DEVICE=cuda PRECISION=fp16, no extrapolation rows, its default
# sizes and seeds. It goes on between the two calls. A dry run here: SETUP=/dev/null DEV=cpu
# LC_DEVICE=cpu LC_PRECISION=bf16 SMOKE=1 OUT=/tmp/o (tests/test_gpu_check.py runs one without
# LC_ARCHS; GPU_CALL_WORK, default /tmp, holds the work between calls). Files back: nvidia_smi.csv;
# cuda.md, cuda.json, gpu_check.tgz (the timed stages' logs and records); cuda_checks.md,
# cuda_checks.json, gpu_checks.tgz (the untimed ones); then long_context_fp16.tgz (run log, report,
# train logs, recall).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
# shellcheck source=scripts/lib.sh
source scripts/lib.sh  # die
usage="usage: gpu_call.sh check COMMIT | collect SECONDS | more COMMIT SECONDS STAGE..."
what=${1:-}
case $what in
    check) [ $# -eq 2 ] || die "$usage" ;;
    collect) [ $# -eq 2 ] || die "$usage"; seconds=$2
        is_whole "$seconds" 0 || die "collect SECONDS: '$seconds' is not a whole number of seconds" ;;
    more) [ $# -ge 4 ] || die "$usage (more: name the stages to run)"; seconds=$3
        is_whole "$seconds" || die "more SECONDS: '$seconds' is not a number of seconds" ;;
    "") die "$usage" ;;
    *) die "$what: expected check, collect or more" ;;
esac
W=${GPU_CALL_WORK:-/tmp}  # where the calls keep their work between them (the machine's own disk)
RES=$W/gpu_results CHECKS=$W/gpu_checks MORE=$W/gpu_more LC=$W/lc_fp16 ENV_FILE=$W/gpu_call_env.sh
LC_ENV=(OUT="$LC" REPORT_DIR="$LC/report" DEVICE="${LC_DEVICE:-cuda}" PRECISION="${LC_PRECISION:-fp16}" ARCHS="${LC_ARCHS:-}"
        EXTRAPOLATION=0)
[ -n "${OUT:-}" ] && [ -d "$OUT" ] || die "OUT=${OUT:-}: the folder whose files come back from the device call is not set or not a folder"
DEVICE_OUT=$OUT

pack_long_context() {
    [ -d "$LC" ] || return 0
    (cd "$LC" && tar czf "$DEVICE_OUT/long_context_fp16.tgz" --ignore-failed-read run.log data.log finished report \
        runs/*/train.log runs/*/time eval/*/hypotheses.out eval/*/recall.json eval/*/rouge.json eval/*/probe.json 2> /dev/null)
}

# source_setup: the device machine's python (SETUP=/dev/null: this machine's as it is, a dry run)
source_setup() {
    local setup=${SETUP:-.gpu/device_setup.sh}
    [ -e "$setup" ] || die "SETUP=$setup: no such file (carry .gpu: ../shared/gpu/README.md)"
    # shellcheck source=/dev/null
    source "$setup"
}

# run_check DIR NAME TGZ BUDGET STAGES: gpu_check.sh's STAGES into DIR within BUDGET seconds; back in
# $OUT: its report as NAME.md and NAME.json, its work folder (logs, records) as TGZ
run_check() {
    local dir=$1 name=$2 tgz=$3 budget=$4 stages=$5
    rm -rf "$dir"; mkdir -p "$dir"
    RESULTS=$dir COMMIT=$commit BUDGET_S=$budget STAGES=$stages bash benchmarks/gpu_check.sh
    cp "$dir/cuda.md" "$DEVICE_OUT/$name.md" 2> /dev/null
    cp "$dir/cuda.json" "$DEVICE_OUT/$name.json" 2> /dev/null
    (cd "$dir" && tar czf "$DEVICE_OUT/$tgz" --exclude=gpu_check/train_smoke/data gpu_check)
}

case $what in
check)
    commit=$2
    BUDGET_S=${BUDGET_S:-480} CHECKS_BUDGET_S=${CHECKS_BUDGET_S:-300}
    whole_numbers BUDGET_S CHECKS_BUDGET_S
    source_setup
    declare -p PATH PYTHONPATH > "$ENV_FILE" 2> /dev/null || declare -p PATH > "$ENV_FILE"  # for `more`
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm,temperature.gpu,utilization.gpu \
        --format=csv > "$DEVICE_OUT/nvidia_smi.csv" 2>&1 || true
    rm -rf "$LC"
    if [ -n "${LC_ARCHS:-}" ]; then
        mkdir -p "$LC"
        # the CPUs make the data sets (sentencepiece, binarising) while the GPU is measured: one core of 16
        env "${LC_ENV[@]}" DATA=only nice -n 19 bash examples/long_context/run.sh > "$LC/data.log" 2>&1 &
        data_pid=$!
    fi
    run_check "$RES" cuda gpu_check.tgz "$BUDGET_S" "${TIMED_STAGES:-timed}"
    if [ -n "${LC_ARCHS:-}" ]; then
        if wait "$data_pid"; then
            setsid nohup bash -c "env ${LC_ENV[*]@Q} DATA=reuse bash examples/long_context/run.sh > $LC/run.log 2>&1; \
                echo \$? > $LC/finished" < /dev/null > /dev/null 2>&1 &
            echo "long_context fp16 run started in the background (its log: $LC/run.log)"
        else
            echo "gpu_call.sh: the long_context data failed:"; tail -n 5 "$LC/data.log"
            pack_long_context
        fi
    fi
    checks=${CHECK_STAGES-untimed}
    if [ -n "$checks" ]; then
        echo "== untimed stages${LC_ARCHS:+ beside the long_context run}: $checks"
        run_check "$CHECKS" cuda_checks gpu_checks.tgz "$CHECKS_BUDGET_S" "$checks"
    fi
    ;;
collect)
    wait_s=$seconds
    [ -d "$LC" ] || { echo "gpu_call.sh: no long_context run to collect (the check ran without LC_ARCHS)"; exit 0; }
    t0=$(date +%s)
    while [ ! -f "$LC/finished" ] && [ $(( $(date +%s) - t0 )) -lt "$wait_s" ]; do sleep 5; done
    if [ -f "$LC/finished" ]; then echo "long_context run ended, status $(cat "$LC/finished")"; else echo "long_context run still going after ${wait_s} s"; fi
    grep "^== \|recall\|: nll_loss" "$LC/run.log" 2> /dev/null | tail -n 20
    pack_long_context
    ;;
more)
    commit=$2 budget=$seconds
    shift 3
    [ -f "$LC/finished" ] || [ ! -d "$LC" ] || echo "gpu_call.sh: note: the long_context run is still going (it shares the GPU)"
    # the setup of the first call, kept by it (the machine is the same while it stays warm)
    # shellcheck source=/dev/null
    if [ -f "$ENV_FILE" ]; then source "$ENV_FILE"; else source_setup; fi
    run_check "$MORE" cuda_more gpu_more.tgz "$budget" "$*"
    ;;
esac
