#!/usr/bin/env bash
# Pilot on one GPU (validation split, one seed): is one-key binding with a 1-layer decoder learned
# when the budget is many times what 2 CPU cores allow? The rows train side by side on the one GPU.
#
#   here:  DATA_ONLY=1 OUT=work_dirs/lr_gpu SPLIT=valid VARIANTS=binding MIN_KEYS=1 MAX_KEYS=1 N_SHORT=20000 \
#              N_LONG=800 N_TEST=40 bash examples/long_range/run.sh          # the data, carried with the checkout
#   there: source .gpu/device_setup.sh && bash examples/long_range/gpu_pilot.sh "$OUT"   # -> $OUT/pilot.tar.gz
#
# The number of updates is set by the card's speed, the same for every row: a probe of 400 short and
# 100 long updates (all rows at once, as in the main run) gives the slowest row's updates per second,
# and the main run takes SHORT_S and LONG_S seconds of that rate. Everything small (tables, raw
# hypotheses, training logs) is packed into DEST/pilot.tar.gz after each stage, so that a run cut off
# by the device's time limit still brings back what it did.
set -euo pipefail
cd "$(dirname "$0")/../.."
DEST=${1:?usage: gpu_pilot.sh DEST_DIR}
DEADLINE=$(( SECONDS + ${BUDGET_S:-570} ))
SHORT_S=${SHORT_S:-280} LONG_S=${LONG_S:-70}   # seconds of the slowest row's rate per stage
PROBE_SHORT=${PROBE_SHORT:-400} PROBE_LONG=${PROBE_LONG:-100} MIN_SHORT=${MIN_SHORT:-1000} MIN_LONG=${MIN_LONG:-100}
export OUT=work_dirs/lr_gpu DEVICE=${DEVICE:-cuda} SPLIT=valid VARIANTS=binding MIN_KEYS=1 MAX_KEYS=1 SEEDS=1 \
    N_SHORT=20000 N_LONG=800 N_TEST=40 MODEL_FLAGS="--decoder-layers 1" MAX_TOKENS=${MAX_TOKENS:-16800}
ROWS=${ROWS:-"local_8 full_4096 lsg_norm led locost"}
export JOBS=$(( $(wc -w <<< "$ROWS") ))
mkdir -p "$DEST"
mkdir -p "$OUT"
{ nvidia-smi -L; python -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)"; date -u; } \
    > "$OUT/device.txt" 2>&1 || true

pack() {  # everything small, one file (the device returns at most 8)
    tar -czf "$DEST/pilot.tar.gz" "$OUT/device.txt" "$OUT"/probe "$OUT"/main \
        $(ls "$OUT"/runs/*/train.log "$OUT"/runs/*/time "$OUT"/runs/*/generate.err 2>/dev/null) 2>/dev/null || true
}

min_ups() {  # min_ups STAGE_SUFFIX ROWS...: the slowest row's median updates/s over its log lines
    local suffix=$1; shift
    for row in "$@"; do
        grep -oE "ups=[0-9.]+" "$OUT/runs/binding.$row.s1$suffix/train.log" | cut -d= -f2 | sort -g \
            | awk '{a[NR]=$1} END {if (NR) print a[int((NR+1)/2)]}'
    done | sort -g | head -1
}

echo "== probe: $PROBE_SHORT short + $PROBE_LONG long updates, rows at once: $ROWS" >&2
ROWS="$ROWS" U_SHORT=$PROBE_SHORT U_LONG=$PROBE_LONG REPORT_DIR=$OUT/probe \
    timeout $(( DEADLINE - SECONDS - 30 )) bash examples/long_range/run.sh || echo "probe: exit $?" >&2
ok=""
for row in $ROWS; do
    if [ -s "$OUT/runs/binding.$row.s1/hypotheses.txt" ]; then ok="$ok $row"; else echo "probe: $row failed" >&2; fi
done
pack
[ -n "$ok" ] || { echo "no row survived the probe" >&2; exit 1; }
# shellcheck disable=SC2086
ups_short=$(min_ups .short $ok)
# shellcheck disable=SC2086
ups_long=$(min_ups "" $ok)
budget() {  # budget SECONDS UPS STEP MIN MAX: updates in SECONDS at UPS, a multiple of STEP, clamped
    awk -v s="$1" -v u="$2" -v k="$3" -v lo="$4" -v hi="$5" \
        'BEGIN {n = int(s * u / k) * k; print (n < lo ? lo : (n > hi ? hi : n))}'
}
U_SHORT=$(budget "$SHORT_S" "$ups_short" 500 "$MIN_SHORT" 30000)
U_LONG=$(budget "$LONG_S" "$ups_long" 50 "$MIN_LONG" 2000)
echo "== main: slowest short $ups_short ups, long $ups_long ups -> U_SHORT=$U_SHORT U_LONG=$U_LONG, rows:$ok" >&2
echo "ups_short=$ups_short ups_long=$ups_long U_SHORT=$U_SHORT U_LONG=$U_LONG rows=$ok" >> "$OUT/device.txt"
export JOBS=$(( $(wc -w <<< "$ok") ))
ROWS="${ok# }" U_SHORT=$U_SHORT U_LONG=$U_LONG REPORT_DIR=$OUT/main \
    timeout $(( DEADLINE - SECONDS - 10 )) bash examples/long_range/run.sh || echo "main: exit $?" >&2
pack
echo "== done" >&2
