#!/usr/bin/env bash
# LOCOST long-document summarization, small scale on CPU (see README.md for what it shows).
#
#   bash examples/locost/run_small.sh                 # fine-tune + ROUGE, then a whole book (2 min on 2 quiet cores, 17 busy)
#   PART=rouge bash examples/locost/run_small.sh      # fine-tune + ROUGE only
#   PART=book bash examples/locost/run_small.sh       # the book only (needs the PART=rouge model)
#
# Part A: locost_tiny trained from scratch with sentencepiece on QMSum meeting transcripts
#   (sources truncated to MAX_SRC pieces for training), constant learning rate, dropout 0.1,
#   greedy generation on the test meetings at their FULL length (no truncation: LOCOST has no
#   position table), ROUGE next to lead-N baselines on the same meetings.
# Part B: the same model summarizes a whole Gutenberg book in one encoder pass with
#   lsg-fairseq-summarize; prints the input length in pieces, the wall time and peak memory.
#
# Knobs (environment): OUT, DATA, PART, N_TEST (test meetings), VOCAB, MAX_SRC, MAX_TGT,
# MAX_UPDATE, LR, MAX_LEN_B, NO_REPEAT, BOOK, THREADS. DATA (QMSum) and BOOK come from the full data
# sets (../shared/data by default; not in the repository).
set -euo pipefail
cd "$(dirname "$0")/../.."
export PATH="$PWD/${VENV:-.venv}/bin:$PATH"
# shellcheck source=scripts/device_flags.sh
source scripts/device_flags.sh  # DEVICE=auto|cpu|cuda, PRECISION=fp32|bf16|fp16 -> *_DEVICE_FLAGS
OUT=${OUT:-${TMPDIR:-/tmp}/locost_small}
DATA=${DATA:-../shared/data/qmsum}
PART=${PART:-all}
N_TEST=${N_TEST:-20}
VOCAB=${VOCAB:-4000}
MAX_SRC=${MAX_SRC:-4096}
MAX_TGT=${MAX_TGT:-256}
MAX_UPDATE=${MAX_UPDATE:-60}
LR=${LR:-2e-3}
MAX_LEN_B=${MAX_LEN_B:-256}
NO_REPEAT=${NO_REPEAT:-3}
BOOK=${BOOK:-../shared/data/gutenberg/melville-moby_dick.txt}
one_of PART all rouge book  # every setting before any work
whole_numbers N_TEST VOCAB MAX_SRC MAX_TGT MAX_UPDATE MAX_LEN_B
whole_numbers --min 0 NO_REPEAT
# shellcheck source=scripts/need_data.sh
source scripts/need_data.sh
case $PART in all|rouge) need_data DATA "$DATA"/{train,valid,test}.jsonl ;; esac
case $PART in all|book) need_data BOOK "$BOOK" ;; esac
OMP_NUM_THREADS=$(threads); export OMP_NUM_THREADS
USER_DIR=$(lsg-fairseq-user-dir)
start=$(date +%s)
echo "load before: $(uptime)"
mkdir -p "$OUT"
FULL=1000000  # source length limit at inference: larger than any input here (the model has no positions)

part_a() {
    step "A1 JSONL -> parallel text ($DATA: all train meetings, $N_TEST valid/test meetings)"
    python scripts/jsonl_to_parallel.py --input-dir "$DATA" --output-dir "$OUT/raw" --splits train
    python scripts/jsonl_to_parallel.py --input-dir "$DATA" --output-dir "$OUT/raw" --splits valid test \
        --max-examples "$N_TEST"

    step "A2-A3 sentencepiece ($VOCAB pieces) + encode + binarize"
    bash scripts/spm_binarize.sh --raw-dir "$OUT/raw" --out-dir "$OUT" --vocab-size "$VOCAB"
    awk '{ n += NF; if (NF > m) m = NF } END { printf "test source: %.0f pieces/meeting on average, max %d\n", n / NR, m }' \
        "$OUT/spm-enc/test.source"

    # The paper's fine-tuning recipe is a constant learning rate (5e-4 for the pretrained model),
    # dropout 0.1, AdamW without weight decay; from random weights the tiny model needs more.
    step "A4 train locost_tiny from scratch: $MAX_UPDATE updates, constant lr $LR, sources cut to $MAX_SRC"
    rm -rf "$OUT/ck"
    fairseq-train "$OUT/bin" --user-dir "$USER_DIR" --task long_document_summarization \
        --arch locost_tiny --max-source-positions "$MAX_SRC" --max-target-positions "$MAX_TGT" --truncate-target \
        --criterion cross_entropy --optimizer grouped_adam --adam-betas "(0.9, 0.999)" --weight-decay 0.0 \
        --lr "$LR" --lr-scheduler fixed --warmup-updates 10 --dropout 0.1 --clip-norm 1.0 \
        --max-tokens $(( MAX_SRC + MAX_TGT + 16 )) --max-update "$MAX_UPDATE" \
        --validate-interval-updates "$MAX_UPDATE" --save-interval-updates "$MAX_UPDATE" \
        --no-epoch-checkpoints --keep-interval-updates 1 --save-dir "$OUT/ck" \
        "${TRAIN_DEVICE_FLAGS[@]}" --num-workers 0 --seed 1 --log-format simple --log-interval 25 2>&1 | quiet | tee "$OUT/train.log"

    # Generation reads whole meetings: --max-source-positions for the task (no truncation) and the
    # same for the model through --model-overrides (its checkpoint says MAX_SRC).
    step "A5 greedy generation on $N_TEST test meetings at full length (max $MAX_LEN_B pieces, no-repeat $NO_REPEAT)"
    /usr/bin/time -v fairseq-generate "$OUT/bin" --user-dir "$USER_DIR" --task long_document_summarization \
        --path "$OUT/ck/checkpoint_last.pt" --gen-subset test \
        --max-source-positions "$FULL" --model-overrides "{'max_source_positions': $FULL}" \
        --max-target-positions "$MAX_TGT" --truncate-target \
        --beam 1 --max-len-b "$MAX_LEN_B" --no-repeat-ngram-size "$NO_REPEAT" \
        --bpe sentencepiece --sentencepiece-model "$OUT/spm/spm.model" \
        --batch-size 4 "${GENERATE_DEVICE_FLAGS[@]}" > "$OUT/generate.out" 2> "$OUT/generate.err" \
        || failed "fairseq-generate" "$OUT/generate.err"
    grep -E "Elapsed|Maximum resident" "$OUT/generate.err"

    step "A6 ROUGE (model) and lead-N baselines on the same $N_TEST test meetings"
    # lead-K baselines: the first K words of each transcript (K around the mean summary length)
    python scripts/generate_to_rouge.py --generate-output "$OUT/generate.out" \
        --ref-file "$OUT/raw/test.target" --output-dir "$OUT/eval" \
        --source-file "$OUT/raw/test.source" --lead-words 50 110 --name locost_tiny --table
    grep "valid on 'valid'" "$OUT/train.log" | tail -1 || true
}

part_b() {
    [ -f "$OUT/ck/checkpoint_last.pt" ] || die "no $OUT/ck/checkpoint_last.pt: run PART=rouge first"
    step "B1 model folder for lsg-fairseq-summarize (checkpoint + dict.txt + spm.model; length limit $FULL)"
    mkdir -p "$OUT/model"
    cp "$OUT/spm/dict.txt" "$OUT/spm/spm.model" "$OUT/model/"
    # LOCOST has no position table: --max-source-positions lets the summarizer read past the
    # training length (the hub batches without the training --max-tokens).
    cp "$OUT/ck/checkpoint_last.pt" "$OUT/model/model.pt"
    name=$(basename "$BOOK" .txt)
    (tr -s '[:space:]' ' ' < "$BOOK"; echo) > "$OUT/book-$name.line"  # what the summarizer reads: one line
    pieces=$(python scripts/spm_encode.py --model "$OUT/spm/spm.model" --inputs "$OUT/book-$name.line" \
        --outputs - 2> "$OUT/book-$name.spm.err" | wc -w) || failed "spm_encode.py on $BOOK" "$OUT/book-$name.spm.err"
    step "B2 lsg-fairseq-summarize $BOOK: $(wc -w < "$BOOK") words = $pieces pieces, one encoder pass, greedy"
    /usr/bin/time -v lsg-fairseq-summarize "$OUT/model" "$BOOK" --max-source-positions "$FULL" --beam 1 --max-len-b "$MAX_LEN_B" \
        --no-repeat-ngram-size "$NO_REPEAT" --output "$OUT/book-$name.summary.txt" 2> "$OUT/book-$name.err" \
        || failed "lsg-fairseq-summarize $BOOK" "$OUT/book-$name.err"
    grep -E "Elapsed|Maximum resident|truncat" "$OUT/book-$name.err" || true
    echo "summary ($(wc -w < "$OUT/book-$name.summary.txt") words): $(cut -c1-300 "$OUT/book-$name.summary.txt")..."
}

case "$PART" in
    all) part_a; part_b ;;
    rouge) part_a ;;
    book) part_b ;;
esac
step "done ($(( $(date +%s) - start )) s wall); load after: $(uptime)"
