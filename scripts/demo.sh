#!/usr/bin/env bash
# The main job end to end. `make demo` runs it after setting up .venv.
#
#   bash scripts/demo.sh                                  # long-range synthetic set (default, 6-16 min on CPU, by CPU)
#   DATA=../shared/data/sumpubmed bash scripts/demo.sh    # any dir with {train,valid,test}.jsonl
#   DEVICE=cuda PRECISION=bf16 bash scripts/demo.sh       # on a GPU (default DEVICE=auto: the GPU when
#                                                         # torch sees one); PRECISION fp32|bf16|fp16
#
# Default: does a long-input model read past token 1,024? examples/long_context/run.sh with two of
# its rows, LSG-BART (tiny) at 4,096 tokens and plain BART truncated to 1,024, trained the same way
# (short documents, then 4K-token ones whose one key sentence sits anywhere), then greedy
# generation on 40 test documents, key recall by position, ROUGE. Prints the recall of the keys
# beyond token 1,024 for both, and one test document whose far keys the LSG model got right.
# Either way the trained model ends as a folder, OUT/model, that lsg-fairseq-summarize reads
# (scripts/model_folder.sh), and summarizes the first test document.
#
# With DATA: sentencepiece -> binarize -> lsg_bart_tiny (ROUGE in validation) -> beam search ->
# ROUGE. Knobs (environment): OUT (work dir, default demo_out), THREADS (default: OMP_NUM_THREADS,
# else every core), VENV (default .venv), DEVICE, PRECISION; by default also N_SHORT, N_LONG,
# N_TEST (examples/long_context/run.sh's set sizes); with DATA also MAX_UPDATE, MAX_SRC (max source
# positions), MAX_TGT, MAX_LEN_B (generated length), MAX_TOKENS, VOCAB (sentencepiece size), BEAM.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
export PATH="$PWD/$VENV/bin:$PATH"
OUT=${OUT:-demo_out}
DATA=${DATA:-}
MAX_SRC=${MAX_SRC:-4096}
MAX_TGT=${MAX_TGT:-128}
MAX_UPDATE=${MAX_UPDATE:-400}
BEAM=${BEAM:-4}
VOCAB=${VOCAB:-4000}
MAX_LEN_B=${MAX_LEN_B:-$MAX_TGT}
MAX_TOKENS=${MAX_TOKENS:-4200}
N_SHORT=${N_SHORT:-3000} N_LONG=${N_LONG:-1000} N_TEST=${N_TEST:-40}  # the default job's set sizes
USER_DIR="$PWD/lsg_fairseq"
prog=demo.sh
# shellcheck source=scripts/device_flags.sh
source scripts/device_flags.sh  # DEVICE, PRECISION -> TRAIN_DEVICE_FLAGS, GENERATE_DEVICE_FLAGS
export DEVICE PRECISION  # run.sh (the default job) reads them too
whole_numbers MAX_SRC MAX_TGT MAX_UPDATE BEAM VOCAB MAX_LEN_B MAX_TOKENS N_SHORT N_LONG N_TEST  # before any work
THREADS=$(threads)
export OMP_NUM_THREADS=$THREADS
start=$(date +%s)

mkdir -p "$OUT"
if [ -z "$DATA" ]; then
    step "long-range synthetic set: LSG-BART at 4,096 vs BART truncated to 1,024 ($DEVICE, $PRECISION; log: $OUT/run.log)"
    report="$OUT/report"
    ARCHS="bart_1024 lsg_norm" EXTRAPOLATION=0 OUT="$OUT" REPORT_DIR="$report" \
        N_SHORT=$N_SHORT N_LONG=$N_LONG N_TEST=$N_TEST \
        bash examples/long_context/run.sh > "$OUT/run.log"
    python examples/long_context/summary.py "$OUT"
    rm -rf "$OUT/model"
    bash scripts/model_folder.sh "$OUT/runs/lsg_norm/checkpoint_last.pt" "$OUT/long/spm" "$OUT/model" \
        "$OUT/long/raw/test.source"
    step "done: tables in $OUT/report/results.md, plot $OUT/report/recall_vs_position.png, tensorboard logs in $OUT/tensorboard, the LSG-BART model in $OUT/model"
    exit 0
fi
# shellcheck source=scripts/need_data.sh
source scripts/need_data.sh
need_data DATA "$DATA"/{train,valid,test}.jsonl
step "1/6 using $DATA"

step "2/6 JSONL -> parallel text"
python scripts/jsonl_to_parallel.py --input-dir "$DATA" --output-dir "$OUT/raw"
step "3/6 sentencepiece ($VOCAB pieces) + encode + binarize"
bash scripts/spm_binarize.sh --raw-dir "$OUT/raw" --out-dir "$OUT" --vocab-size "$VOCAB" --workers 2 \
    -- --soft-vocab-limit

step "4/6 train lsg_bart_tiny ($MAX_UPDATE updates, max source positions $MAX_SRC; ROUGE in validation)"
rm -rf "$OUT/checkpoints"
fairseq-train "$OUT/bin" --user-dir "$USER_DIR" \
    --task long_document_summarization --arch lsg_bart_tiny \
    --max-source-positions "$MAX_SRC" --max-target-positions "$MAX_TGT" --truncate-target \
    --criterion label_smoothed_cross_entropy --label-smoothing 0.1 \
    --optimizer adam --adam-betas "(0.9, 0.98)" --lr 3e-3 --lr-scheduler inverse_sqrt --warmup-updates 30 \
    --clip-norm 1.0 --dropout 0.0 --attention-dropout 0.0 \
    --max-tokens "$MAX_TOKENS" --max-update "$MAX_UPDATE" --validate-interval-updates "$MAX_UPDATE" \
    --save-interval-updates "$MAX_UPDATE" --no-epoch-checkpoints --keep-last-epochs 1 \
    --eval-rouge --eval-rouge-bpe sentencepiece \
    --eval-rouge-args "{\"beam\": 1, \"max_len_b\": $MAX_LEN_B}" \
    --best-checkpoint-metric rougeL --maximize-best-checkpoint-metric \
    --save-dir "$OUT/checkpoints" --tensorboard-logdir "$OUT/tensorboard" \
    "${TRAIN_DEVICE_FLAGS[@]}" --num-workers 0 --log-format simple --log-interval 25 --seed 1 2>&1 \
    | quiet | tee "$OUT/train.log"

step "5/6 generate (beam $BEAM) on the test split"
fairseq-generate "$OUT/bin" --user-dir "$USER_DIR" --task long_document_summarization \
    --path "$OUT/checkpoints/checkpoint_best.pt" --gen-subset test \
    --max-source-positions "$MAX_SRC" --max-target-positions "$MAX_TGT" --truncate-target \
    --beam "$BEAM" --lenpen 1.0 --max-len-b "$MAX_LEN_B" --no-repeat-ngram-size 0 \
    --bpe sentencepiece --sentencepiece-model "$OUT/spm/spm.model" \
    --batch-size 4 "${GENERATE_DEVICE_FLAGS[@]}" > "$OUT/generate.out" 2> "$OUT/generate.err" \
    || failed "fairseq-generate" "$OUT/generate.err"

step "6/6 ROUGE"
python scripts/generate_to_rouge.py --generate-output "$OUT/generate.out" --ref-file "$OUT/raw/test.target" \
    --output-dir "$OUT/eval" > /dev/null
python - "$OUT" <<'EOF'
import json, sys
out = sys.argv[1]
scores = json.load(open(f"{out}/eval/rouge.json"))
print("ROUGE (F1 x100) on", scores["n"], "test documents:",
      " ".join(f"{k}={scores[k]:.2f}" for k in ("rouge1", "rouge2", "rougeL", "rougeLsum")))
hyp = open(f"{out}/eval/hyp.txt").readline().strip()
ref = open(f"{out}/eval/ref.txt").readline().strip()
print("example reference:", ref)
print("example summary:  ", hyp)
EOF
rm -rf "$OUT/model"
bash scripts/model_folder.sh "$OUT/checkpoints/checkpoint_best.pt" "$OUT/spm" "$OUT/model" "$OUT/raw/test.source"
step "done: scores in $OUT/eval/rouge.json, the model in $OUT/model, tensorboard logs in $OUT/tensorboard"
