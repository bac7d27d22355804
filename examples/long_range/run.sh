#!/usr/bin/env bash
# Long range, not just long input: does an encoder carry information across 1,024+ tokens, beyond
# what the decoder's cross-attention finds by itself? One command, seeded:
#
#   bash examples/long_range/run.sh              # retrieval + binding, 6 rows, 3 seeds -> results.md, outputs/ here
#   SPLIT=valid bash examples/long_range/run.sh  # the same on the validation split (sizing, pilots)
#   SMOKE=1 bash examples/long_range/run.sh      # a few updates of everything (tests/test_long_range.py)
#   DATA_ONLY=1 OUT=DIR bash examples/long_range/run.sh   # the data alone, in DIR (to carry to a GPU: gpu_pilot.sh)
#
# Variants (lsg_text/synthetic/, --holdout: test (colour, animal) pairs never occur in training):
#   retrieval  2-3 key sentences ("The red fox visited Paris on Monday."), restated in order.
#   binding    per key, "The silver moose is called Nora." and >= 1,024 words later "Nora visited
#              Tokyo on Monday." -> "The silver moose visited Tokyo on Monday."; decoys "Nora avoided
#              Lima on Friday." and a bound name that only avoids.
# Rows: examples/long_context/common.sh's arch_flags, the tiny shape, plus local_8: LED's layers
# with a +-4-token window and no global token, an encoder that cannot mix beyond 4 tokens.
# Recipe: examples/long_context's, unchanged (not tuned on this task): U_SHORT updates on 150-250-word
# documents at lr 3e-3, then U_LONG on 3,200-3,550-word ones at lr 1e-3; greedy decoding of the
# N_TEST documents of SPLIT. Raw hypotheses go to outputs/ next to the table: report.py re-scores them.
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-work_dirs/long_range}
# shellcheck source=examples/long_context/common.sh
source examples/long_context/common.sh  # VENV/PATH, USER_DIR, device flags, quiet, arch_flags, synthetic_set, train
LR_HERE=examples/long_range
SMOKE=${SMOKE:-0}
one_of SMOKE 0 1
if [ "$SMOKE" = 1 ]; then
    N_SHORT=${N_SHORT:-40} N_LONG=${N_LONG:-8} N_TEST=${N_TEST:-4} U_SHORT=${U_SHORT:-3} U_LONG=${U_LONG:-2}
    SEEDS=${SEEDS:-"1 2"} REPORT_DIR=${REPORT_DIR:-$OUT/report}
fi
VARIANTS=${VARIANTS:-"retrieval binding"}
ROWS=${ROWS:-"local_8 bart_1024 full_4096 lsg_norm led locost"}
SEEDS=${SEEDS:-"1 2 3"}
MIN_KEYS=${MIN_KEYS:-2} MAX_KEYS=${MAX_KEYS:-3}  # keys per document
N_SHORT=${N_SHORT:-6000}   # short training documents per variant
N_LONG=${N_LONG:-1500}     # long training documents per variant
N_TEST=${N_TEST:-50}       # long documents scored, per seed (the same documents for every seed)
U_SHORT=${U_SHORT:-500}
U_LONG=${U_LONG:-400}
SPLIT=${SPLIT:-test}
MODEL_FLAGS=${MODEL_FLAGS:-}  # appended to every row's arch_flags, e.g. "--decoder-layers 1"
DATA_FLAGS=${DATA_FLAGS:-}    # appended to the generator's flags, e.g. "--decoy-names 4 --even-mentions"
JOBS=${JOBS:-2}            # trainings at once, each with THREADS / JOBS threads
THREADS=$(threads)
REPORT_DIR=${REPORT_DIR:-$LR_HERE}
# every knob checked before the data: a word, 0 or an unknown row would stop the run hours in
# (fairseq-train reads --max-update 0 as "no limit")
whole_numbers N_SHORT N_LONG N_TEST U_SHORT U_LONG MIN_KEYS MAX_KEYS JOBS
(( MIN_KEYS <= MAX_KEYS )) || die "MIN_KEYS=$MIN_KEYS is above MAX_KEYS=$MAX_KEYS"
case $SPLIT in test|valid) ;; *) die "SPLIT must be test or valid, got '$SPLIT'" ;; esac
[ -n "${VARIANTS// /}" ] && [ -n "${ROWS// /}" ] && [ -n "${SEEDS// /}" ] || die "VARIANTS, ROWS and SEEDS need a word each"
for v in $VARIANTS; do
    case $v in retrieval|binding|count|order) ;; *) die "VARIANTS: unknown variant '$v' (variants: retrieval binding count order)" ;; esac
done
for row in $ROWS; do arch_flags "$row" > /dev/null; done
for seed in $SEEDS; do is_whole "$seed" 0 || die "SEEDS: '$seed' is not a whole number"; done
writable_folder REPORT_DIR
export OMP_NUM_THREADS=$(( THREADS / JOBS > 0 ? THREADS / JOBS : 1 ))
start=$(date +%s)
load_start=$(cut -d' ' -f1-3 /proc/loadavg)
mkdir -p "$OUT"

for v in $VARIANTS; do
    # shellcheck disable=SC2206  # DATA_FLAGS: words on purpose
    long=(--variant "$v" --holdout --min-gap 1024 --min-keys "$MIN_KEYS" --max-keys "$MAX_KEYS" --min-tokens 3200
          --max-tokens 3550 --seed 11 $DATA_FLAGS)
    if [ -z "${DATA_ONLY:-}" ]; then  # the outputs' data flags, for report.py; no outputs, no file
        mkdir -p "$REPORT_DIR/outputs/$v"
        printf '{"flags": [%s]}\n' "$(printf '"%s", ' "${long[@]}" | sed 's/, $//')" > "$REPORT_DIR/outputs/$v/data.json"
    fi
    # The data is a function of these settings and the generator's code: kept when they are unchanged
    # (so that it can be made here and carried to a GPU machine), made again otherwise.
    stamp="${long[*]} N_LONG=$N_LONG N_TEST=$N_TEST N_SHORT=$N_SHORT $(cat lsg_text/synthetic/*.py \
        scripts/make_synthetic_data.py examples/long_context/common.sh | sha1sum | cut -c1-12)"
    if [ -f "$OUT/$v/data.stamp" ] && [ "$(cat "$OUT/$v/data.stamp")" = "$stamp" ]; then
        step "$v data: kept ($OUT/$v/data.stamp matches)"
        continue
    fi
    step "$v data: $N_SHORT short + $N_LONG long training documents, $N_TEST $SPLIT documents"
    rm -f "$OUT/$v/data.stamp"
    N_VALID=$N_TEST synthetic_set "$OUT/$v/long" "$OUT/$v/long" "${long[@]}" --train "$N_LONG" --test "$N_TEST"
    # shellcheck disable=SC2086
    synthetic_set "$OUT/$v/short" "$OUT/$v/long" --variant "$v" --holdout --min-gap 0 --min-keys "$MIN_KEYS" \
        --max-keys "$MAX_KEYS" --min-tokens 150 --max-tokens 250 --train "$N_SHORT" --test 10 --seed 12 $DATA_FLAGS
    echo "$stamp" > "$OUT/$v/data.stamp"
done
if [ -n "${DATA_ONLY:-}" ]; then step "data only: done"; exit 0; fi

run_one() {  # run_one VARIANT ROW SEED: both stages, then greedy decoding of SPLIT -> hypotheses
    local v=$1 row=$2 seed=$3 flags max_src name="$1.$2.s$3"
    flags="$(arch_flags "$row") $MODEL_FLAGS"
    max_src=$(max_source "$row")
    local resume=()  # RESUME=1: the short stage goes on from an earlier run's, optimizer and data order kept
    if [ -n "${RESUME:-}" ] && [ -f "$OUT/runs/$name.short/checkpoint_last.pt" ]; then
        rm -rf "$OUT/runs/$name.short.prev"
        mv "$OUT/runs/$name.short" "$OUT/runs/$name.short.prev"
        resume=(--restore-file "$OUT/runs/$name.short.prev/checkpoint_last.pt")
    fi
    # shellcheck disable=SC2086
    train "$name.short" "$OUT/$v/short/bin" "$U_SHORT" --lr 3e-3 $flags --seed "$seed" "${resume[@]}"
    # shellcheck disable=SC2086
    train "$name" "$OUT/$v/long/bin" "$U_LONG" --lr 1e-3 $flags --seed "$seed" \
        --finetune-from-model "$OUT/runs/$name.short/checkpoint_last.pt"
    greedy_generate "$OUT/$v/long/bin" "$OUT/runs/$name/checkpoint_last.pt" "$SPLIT" "$max_src" \
        "$OUT/$v/long/spm/spm.model" "$OUT/runs/$name/generate.out"
    # one hypothesis per line, in document order: what report.py scores
    python "$LR_HERE/report.py" extract "$OUT/runs/$name/generate.out" "$N_TEST" "$OUT/runs/$name/hypotheses.txt"
    step "$name: $(wc -l < "$OUT/runs/$name/hypotheses.txt") hypotheses, train $(cut -d' ' -f1 "$OUT/runs/$name/time") s"
}

# JOBS runs at once. A run that fails has said why (train and greedy_generate name their logs); no
# run starts after it, the ones under way finish, and the script stops before the report.
running=0 failures=0
for seed in $SEEDS; do
    for v in $VARIANTS; do
        for row in $ROWS; do
            [ "$failures" -eq 0 ] || break 3
            run_one "$v" "$row" "$seed" &
            running=$(( running + 1 ))
            if [ "$running" -ge "$JOBS" ]; then
                wait -n || failures=$(( failures + 1 ))
                running=$(( running - 1 ))
            fi
        done
    done
done
for (( ; running > 0; running-- )); do wait -n || failures=$(( failures + 1 )); done
[ "$failures" -eq 0 ] || die "$failures run(s) failed (above); no report written"

step "report -> $REPORT_DIR"
for v in $VARIANTS; do
    for row in $ROWS; do
        for seed in $SEEDS; do
            cp "$OUT/runs/$v.$row.s$seed/hypotheses.txt" "$REPORT_DIR/outputs/$v/$row.seed$seed.txt"
        done
    done
done
# shellcheck disable=SC2086  # VARIANTS, ROWS, SEEDS: lists
python "$LR_HERE/report.py" --outputs "$REPORT_DIR/outputs" --report-dir "$REPORT_DIR" --split "$SPLIT" \
    --n-docs "$N_TEST" --n-train "$N_LONG" --variants $VARIANTS --rows $ROWS --seeds $SEEDS \
    --command "bash $LR_HERE/run.sh" --wall "$(( $(date +%s) - start ))" \
    --load "$load_start -> $(cut -d' ' -f1-3 /proc/loadavg)" \
    --settings "SPLIT=$SPLIT VARIANTS=\"$VARIANTS\" ROWS=\"$ROWS\" SEEDS=\"$SEEDS\" MIN_KEYS=$MIN_KEYS MAX_KEYS=$MAX_KEYS N_SHORT=$N_SHORT N_LONG=$N_LONG N_TEST=$N_TEST U_SHORT=$U_SHORT U_LONG=$U_LONG${MODEL_FLAGS:+ MODEL_FLAGS=\"$MODEL_FLAGS\"}${DATA_FLAGS:+ DATA_FLAGS=\"$DATA_FLAGS\"}${RESUME:+ RESUME=$RESUME} MAX_TOKENS=$MAX_TOKENS DEVICE=$DEVICE PRECISION=$PRECISION JOBS=$JOBS THREADS=$THREADS"
step "done"
