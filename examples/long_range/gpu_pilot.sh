#!/usr/bin/env bash
# examples/long_range/run.sh on one GPU, every training side by side on the card, inside one device
# call. Defaults: pilot 5 of the README (one-key binding, 1-layer decoder, validation split, one seed).
#
#   here:  DATA_ONLY=1 OUT=work_dirs/lr_gpu SPLIT=valid VARIANTS=binding MIN_KEYS=1 MAX_KEYS=1 N_SHORT=20000 \
#              N_LONG=800 N_TEST=40 bash examples/long_range/run.sh          # the data, carried with the checkout
#   there: source .gpu/device_setup.sh && bash examples/long_range/gpu_pilot.sh "$OUT"   # -> $OUT/pilot.tar.gz
#
# WORK (default work_dirs/lr_gpu) is run.sh's OUT there: where the carried data is and the trainings
# write. Not OUT itself: the device sets OUT to the folder whose files come back (DEST above).
#
# Any run.sh setting can be given (the data flags must match what was made here, or run.sh makes the
# data again there). With U_SHORT and U_LONG given, the updates are those; without, a probe of
# PROBE_SHORT + PROBE_LONG updates (first seed, all rows at once) measures the slowest row's updates
# per second and the run takes SHORT_S and LONG_S seconds of that rate, the same for every row, at
# least MIN_SHORT and MIN_LONG updates. BUDGET_S (default 570) is the whole call's time.
# Everything small (tables, raw hypotheses, training logs) is packed into DEST/pilot.tar.gz after
# each stage, so that a run cut off by the device's time limit still brings back what it did.
set -euo pipefail
cd "$(dirname "$0")/../.."
# shellcheck source=scripts/lib.sh
source scripts/lib.sh  # die, whole_numbers
[ $# -eq 1 ] || die "usage: gpu_pilot.sh DEST_DIR"
DEST=$1
BUDGET_S=${BUDGET_S:-570}
whole_numbers BUDGET_S
(( BUDGET_S > 60 )) || die "BUDGET_S=$BUDGET_S: the probe alone needs more than 60 s"
DEADLINE=$(( SECONDS + BUDGET_S ))
SHORT_S=${SHORT_S:-280} LONG_S=${LONG_S:-70}   # seconds of the slowest row's rate per stage
PROBE_SHORT=${PROBE_SHORT:-400} PROBE_LONG=${PROBE_LONG:-100} MIN_SHORT=${MIN_SHORT:-1000} MIN_LONG=${MIN_LONG:-100}
export OUT=${WORK:-work_dirs/lr_gpu} DEVICE=${DEVICE:-cuda} SPLIT=${SPLIT:-valid} VARIANTS=${VARIANTS:-binding} \
    MIN_KEYS=${MIN_KEYS:-1} MAX_KEYS=${MAX_KEYS:-1} SEEDS=${SEEDS:-1} N_SHORT=${N_SHORT:-20000} \
    N_LONG=${N_LONG:-800} N_TEST=${N_TEST:-40} MODEL_FLAGS=${MODEL_FLAGS---decoder-layers 1} \
    MAX_TOKENS=${MAX_TOKENS:-16800} DATA_FLAGS=${DATA_FLAGS:-}
ROWS=${ROWS:-"local_8 full_4096 lsg_norm led locost"}
first_seed=${SEEDS%% *}
mkdir -p "$DEST" "$OUT"
# The first import of torch and fairseq on a fresh machine is slow; once here, not in every job at once.
{ nvidia-smi -L; python -c "import torch, fairseq; print('torch', torch.__version__, 'cuda', torch.version.cuda)"
  date -u; } > "$OUT/device.txt" 2>&1 || true

pack() {  # everything small, one file (the device returns at most 8)
    # shellcheck disable=SC2046
    tar -czf "$DEST/pilot.tar.gz" "$OUT/device.txt" $(ls -d "$OUT"/probe "$OUT"/main 2>/dev/null) \
        $(ls "$OUT"/runs/*/train.log "$OUT"/runs/*/time "$OUT"/runs/*/generate.err 2>/dev/null) 2>/dev/null || true
}

min_ups() {  # min_ups STAGE_SUFFIX ROWS...: the slowest row's median updates/s over its log lines
    local suffix=$1 v=${VARIANTS%% *}; shift
    for row in "$@"; do
        grep -oE "ups=[0-9.]+" "$OUT/runs/$v.$row.s$first_seed$suffix/train.log" | cut -d= -f2 | sort -g \
            | awk '{a[NR]=$1} END {if (NR) print a[int((NR+1)/2)]}'
    done | sort -g | head -1
}

budget() {  # budget SECONDS UPS STEP MIN MAX: updates in SECONDS at UPS, a multiple of STEP, clamped
    awk -v s="$1" -v u="$2" -v k="$3" -v lo="$4" -v hi="$5" \
        'BEGIN {n = int(s * u / k) * k; print (n < lo ? lo : (n > hi ? hi : n))}'
}

ok=$ROWS
if [ -z "${U_SHORT:-}" ] || [ -z "${U_LONG:-}" ]; then
    echo "== probe: $PROBE_SHORT short + $PROBE_LONG long updates, rows at once: $ROWS" >&2
    jobs=$(wc -w <<< "$ROWS")
    ROWS="$ROWS" SEEDS=$first_seed JOBS=$jobs U_SHORT=$PROBE_SHORT U_LONG=$PROBE_LONG \
        REPORT_DIR=$OUT/probe timeout $(( DEADLINE - SECONDS - 30 )) bash examples/long_range/run.sh \
        || echo "probe: exit $?" >&2
    ok=""
    for row in $ROWS; do
        if [ -s "$OUT/runs/${VARIANTS%% *}.$row.s$first_seed/hypotheses.txt" ]; then ok="$ok $row"
        else echo "probe: $row failed" >&2; fi
    done
    pack
    [ -n "$ok" ] || { echo "no row survived the probe" >&2; exit 1; }
    # shellcheck disable=SC2086
    ups_short=$(min_ups .short $ok)
    # shellcheck disable=SC2086
    ups_long=$(min_ups "" $ok)
    U_SHORT=$(budget "$SHORT_S" "$ups_short" 500 "$MIN_SHORT" 30000)
    U_LONG=$(budget "$LONG_S" "$ups_long" 50 "$MIN_LONG" 2000)
    echo "ups_short=$ups_short ups_long=$ups_long" >> "$OUT/device.txt"
fi
ok=${ok# }
jobs=$(( $(wc -w <<< "$ok") * $(wc -w <<< "$SEEDS") * $(wc -w <<< "$VARIANTS") ))
echo "== main: U_SHORT=$U_SHORT U_LONG=$U_LONG, rows: $ok, seeds: $SEEDS, $jobs trainings at once" >&2
echo "U_SHORT=$U_SHORT U_LONG=$U_LONG rows=$ok seeds=$SEEDS" >> "$OUT/device.txt"
ROWS="$ok" JOBS=${JOBS:-$jobs} U_SHORT=$U_SHORT U_LONG=$U_LONG REPORT_DIR=$OUT/main \
    timeout $(( DEADLINE - SECONDS - 10 )) bash examples/long_range/run.sh || echo "main: exit $?" >&2
pack
echo "== done" >&2
