#!/usr/bin/env bash
# Does a model trained with the plugin read past token 1,024? One command, seeded:
#
#   bash examples/long_context/run.sh            # ~35 min on 2 cores; results -> $OUT, table + plot -> here
#   DEVICE=cuda PRECISION=bf16 bash examples/long_context/run.sh   # on a GPU (DEVICE=auto by default)
#   SMOKE=1 bash examples/long_context/run.sh    # a few updates of everything (a smoke run; CI runs its own sizes)
#   DATA=only ... then DATA=reuse ...              # the data sets once (CPU), the models later (GPU time is short)
#
# 1. Data (lsg_text/synthetic/retrieval.py): SHORT documents (50-150 words), MID ones (600-880 words,
#    so every key lies before token 1,024) and LONG ones (3,200-3,550 words = 3.6K-4K pieces); each
#    hides KEYS key sentences ("The red fox visited Paris on Monday.") at uniformly random places,
#    and its summary restates them. One sentencepiece model (800 pieces) for all.
# 2. Every architecture, same budget: U_SHORT updates on SHORT at lr 3e-3 (a curriculum: a small
#    model first learns to retrieve where the haystack is short), then U_LONG updates on LONG at
#    lr 1e-3; bart_1024 sees LONG truncated to 1,024 tokens. Wall time and peak RSS per stage from /usr/bin/time.
# 3. Test (N_TEST LONG documents): exact recall of each key fact vs the key's position
#    (scripts/key_recall.py, bins of 512 tokens), ROUGE, and where the decoder's cross-attention
#    looks (attention_probe.py).
# 4. The LSG paper's extrapolation claim at small scale: bart_1024 after SHORT, then U_LONG updates
#    on MID (a model trained at 1,024 tokens on keys within 1,024), evaluated on LONG (a) truncated, (b) with its position table tiled to 4,096, (c) converted to LSG (no
#    training), (d) (c) + U_EXTRA updates of --train-global-only, (e) (c) + U_EXTRA full updates.
# 5. report.py writes results.md, results.json and recall_vs_position.png next to this script, and
#    each row's hypotheses (fairseq-generate's H-/D- lines) under outputs/ so that they can be re-scored.
set -euo pipefail
cd "$(dirname "$0")/../.."
# shellcheck source=examples/long_context/common.sh
source examples/long_context/common.sh  # HERE, VENV/PATH, OUT, quiet, train: shared with control.sh
SMOKE=${SMOKE:-0}
one_of SMOKE 0 1
if [ "$SMOKE" = 1 ]; then
    N_SHORT=${N_SHORT:-40} N_MID=${N_MID:-8} N_LONG=${N_LONG:-8} N_TEST=${N_TEST:-4} U_SHORT=${U_SHORT:-3} U_LONG=${U_LONG:-2}
    U_EXTRA=${U_EXTRA:-2} REPORT_DIR=${REPORT_DIR:-$OUT/report}
fi
N_SHORT=${N_SHORT:-8000}   # short training documents
N_MID=${N_MID:-1500}       # mid-length training documents (the extrapolation's base model)
N_LONG=${N_LONG:-1500}     # long training documents
N_TEST=${N_TEST:-120}      # long test documents
KEYS=${KEYS:-1}            # key sentences per document (more: the summary lists them in document order)
U_SHORT=${U_SHORT:-500}    # updates on short documents, lr 3e-3
U_LONG=${U_LONG:-800}      # then updates on long (or mid) documents, lr 1e-3
U_EXTRA=${U_EXTRA:-300}    # extrapolation rows (d) and (e)
U_BASE=${U_BASE:-$U_LONG}  # the extrapolation's base model: updates on mid documents
ARCHS=${ARCHS:-"local_8 bart_1024 full_4096 lsg_norm lsg_none led locost"}  # local_8: the control (common.sh)
EXTRAPOLATION=${EXTRAPOLATION:-1}  # 0: skip step 4
REPORT_DIR=${REPORT_DIR:-$HERE}
DATA=${DATA:-make}  # make | only (make the data sets, then stop) | reuse (the sets DATA=only made in $OUT)
case $DATA in make|only|reuse) ;; *) die "DATA=$DATA: expected make, only or reuse" ;; esac
# every knob checked before the data: a word, 0 or an unknown row would stop the run hours in
# (fairseq-train reads --max-update 0 as "no limit")
whole_numbers N_SHORT N_MID N_LONG N_TEST KEYS U_SHORT U_LONG U_EXTRA U_BASE
one_of EXTRAPOLATION 0 1
for row in $ARCHS; do arch_flags "$row" > /dev/null; done
[ -n "${ARCHS// /}" ] || die "ARCHS is empty: expected rows, e.g. ARCHS=\"bart_1024 lsg_norm\""
writable_folder REPORT_DIR
THREADS=$(threads)
export OMP_NUM_THREADS=$THREADS
start=$(date +%s)
device_name() { [ "$DEVICE" = cuda ] && python -c "import torch; print(' on', torch.cuda.get_device_name())" 2>/dev/null || true; }
load_start=$(cut -d' ' -f1-3 /proc/loadavg)

# ------------------------------------------------------------------------------------------ data
mkdir -p "$OUT"
if [ "$DATA" = reuse ]; then
    for set in long short mid; do
        [ -f "$OUT/$set/bin/dict.source.txt" ] || die "DATA=reuse: no $OUT/$set/bin (make it with DATA=only)"
    done
    step "data: reusing $OUT/{long,short,mid} (made by DATA=only with the same N_* and KEYS)"
else
    step "data: $N_SHORT short + $N_MID mid + $N_LONG long training documents, $N_TEST long test documents"
    synthetic_set "$OUT/long" "$OUT/long" --train "$N_LONG" --test "$N_TEST" --min-tokens 3200 --max-tokens 3550 \
        --seed 1 --min-keys "$KEYS" --max-keys "$KEYS"
    synthetic_set "$OUT/short" "$OUT/long" --train "$N_SHORT" --test 10 --min-tokens 50 --max-tokens 150 --seed 2 \
        --min-keys "$KEYS" --max-keys "$KEYS"
    synthetic_set "$OUT/mid" "$OUT/long" --train "$N_MID" --test 10 --min-tokens 600 --max-tokens 880 --seed 3 \
        --min-keys "$KEYS" --max-keys "$KEYS"
    [ "$DATA" = only ] && { step "data only: done"; exit 0; }
fi

# ------------------------------------------------------------------------------------ the models
for row in $ARCHS; do
    flags=$(arch_flags "$row")
    bos=""; [ "$row" = locost ] && bos="--no-bos"
    max_src=$(max_source "$row")
    step "$row: $U_SHORT updates on short documents, then $U_LONG on long ones"
    # shellcheck disable=SC2086
    train "$row.short" "$OUT/short/bin" "$U_SHORT" --lr 3e-3 $flags
    # shellcheck disable=SC2086
    train "$row" "$OUT/long/bin" "$U_LONG" --lr 1e-3 $flags --finetune-from-model "$OUT/runs/$row.short/checkpoint_last.pt"
    evaluate "$row" "$OUT/runs/$row/checkpoint_last.pt" "$max_src" $bos
done

# --------------------------------------------------------------------------- extrapolation (a-e)
if [ "$EXTRAPOLATION" = 1 ] && [[ " $ARCHS " == *" bart_1024 "* ]]; then
    step "extrapolation: bart_1024 after short, then mid documents (all keys within 1,024), on 4K documents"
    # shellcheck disable=SC2046  # arch_flags: words on purpose
    train x_base "$OUT/mid/bin" "$U_BASE" --lr 1e-3 $(arch_flags bart_1024) \
        --finetune-from-model "$OUT/runs/bart_1024.short/checkpoint_last.pt"
    base="$OUT/runs/x_base"
    cp "$OUT/long/spm/dict.txt" "$base/dict.txt"
    LSG="--block-size 32 --sparse-block-size 32 --sparsity-factor 2 --sparsity-type norm --num-global-tokens 1"
    evaluate x_a_truncated "$base/checkpoint_last.pt" 1024
    rm -rf "$OUT/runs/x_b" "$OUT/runs/x_c"
    lsg-fairseq-convert "$base/checkpoint_last.pt" "$OUT/runs/x_b" --to bart --max-source-positions 4096 > /dev/null
    evaluate x_b_tiled_full "$OUT/runs/x_b/model.pt" 4096
    # shellcheck disable=SC2086
    lsg-fairseq-convert "$base/checkpoint_last.pt" "$OUT/runs/x_c" --to lsg_bart --max-source-positions 4096 \
        --max-target-positions 128 $LSG > /dev/null
    evaluate x_c_lsg "$OUT/runs/x_c/model.pt" 4096
    # shellcheck disable=SC2086
    train x_d "$OUT/long/bin" "$U_EXTRA" --lr 1e-3 --arch lsg_bart_tiny --max-source-positions 4096 $LSG \
        --train-global-only --finetune-from-model "$OUT/runs/x_c/model.pt"
    evaluate x_d_lsg_global_tuned "$OUT/runs/x_d/checkpoint_last.pt" 4096
    # shellcheck disable=SC2086
    train x_e "$OUT/long/bin" "$U_EXTRA" --lr 1e-3 --arch lsg_bart_tiny --max-source-positions 4096 $LSG \
        --finetune-from-model "$OUT/runs/x_c/model.pt"
    evaluate x_e_lsg_fine_tuned "$OUT/runs/x_e/checkpoint_last.pt" 4096
fi

step "attention probe of ${#PROBE_CHECKPOINTS[@]} rows"
probe_queued
step "report -> $REPORT_DIR"
# shellcheck disable=SC2086  # ARCHS: a list
python "$HERE/report.py" --out "$OUT" --report-dir "$REPORT_DIR" --archs $ARCHS \
    --command "bash $HERE/run.sh" --settings "KEYS=$KEYS N_SHORT=$N_SHORT N_MID=$N_MID N_LONG=$N_LONG N_TEST=$N_TEST U_SHORT=$U_SHORT U_LONG=$U_LONG U_EXTRA=$U_EXTRA U_BASE=$U_BASE THREADS=$THREADS DEVICE=$DEVICE PRECISION=$PRECISION$(device_name)" \
    --wall "$(( $(date +%s) - start ))" --load "$load_start -> $(cut -d' ' -f1-3 /proc/loadavg)"
step "done"
