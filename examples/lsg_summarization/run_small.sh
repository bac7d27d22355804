#!/usr/bin/env bash
# LSG-BART long-document summarization, small scale on CPU (see README.md for what it shows).
#
#   bash examples/lsg_summarization/run_small.sh                 # both parts, ~25 min on 2 busy cores (part A: 85 s quiet)
#   PART=rouge bash examples/lsg_summarization/run_small.sh      # part A only
#   PART=convert bash examples/lsg_summarization/run_small.sh    # part B only
#
# Part A (numbers): lsg_bart_tiny trained from scratch with sentencepiece on a SumPubMed subset at
#   4,096 source positions (paper block/sparsity: block 128, norm sparsity, factor 4), beam 5,
#   length penalty 2.0, ROUGE on the test subset, next to lead-N baselines on the same documents.
# Part B (mechanics): the paper's path from a pretrained BART, on the tiny random HF BART fixture
#   (vocab 500, byte-level BPE): convert to LSG 4,096 -> fine-tune -> convert to 16,384 with 64
#   global tokens -> global-only tuning -> beam search. Its outputs are meaningless (random
#   weights, a few updates); it shows that the commands run, and how fast, at 16,384 tokens.
#
# Knobs (environment): OUT, DATA, PART, N_TRAIN/N_VALID/N_TEST (documents), VOCAB, MAX_SRC,
# MAX_TGT, MAX_UPDATE, LR, MAX_LEN_B, NO_REPEAT, BART_HF (HF BART folder for part B; default: the
# fixture in tests/data), B_UPDATES, THREADS. DATA: the full SumPubMed set (../shared/data/sumpubmed
# by default; not in the repository).
set -euo pipefail
cd "$(dirname "$0")/../.."
export PATH="$PWD/${VENV:-.venv}/bin:$PATH"
# shellcheck source=scripts/device_flags.sh
source scripts/device_flags.sh  # DEVICE=auto|cpu|cuda, PRECISION=fp32|bf16|fp16 -> *_DEVICE_FLAGS
OUT=${OUT:-${TMPDIR:-/tmp}/lsg_summarization_small}
DATA=${DATA:-../shared/data/sumpubmed}
PART=${PART:-all}
N_TRAIN=${N_TRAIN:-350}
N_VALID=${N_VALID:-10}
N_TEST=${N_TEST:-5}
VOCAB=${VOCAB:-4000}
MAX_SRC=${MAX_SRC:-4096}
MAX_TGT=${MAX_TGT:-512}
MAX_UPDATE=${MAX_UPDATE:-60}
LR=${LR:-2e-3}
MAX_LEN_B=${MAX_LEN_B:-512}
NO_REPEAT=${NO_REPEAT:-3}
BART_HF=${BART_HF:-tests/data/fixtures/lsg/bart_plain/hf}
B_UPDATES=${B_UPDATES:-6}
one_of PART all rouge convert  # every setting before any work
whole_numbers N_TRAIN N_VALID N_TEST VOCAB MAX_SRC MAX_TGT MAX_UPDATE MAX_LEN_B B_UPDATES
whole_numbers --min 0 NO_REPEAT
# shellcheck source=scripts/need_data.sh
source scripts/need_data.sh
need_data DATA "$DATA"/{train,valid,test}.jsonl  # both parts read it
need_data BART_HF "$BART_HF/config.json"
OMP_NUM_THREADS=$(threads); export OMP_NUM_THREADS
USER_DIR=$(lsg-fairseq-user-dir)
start=$(date +%s)
echo "load before: $(uptime)"
mkdir -p "$OUT"

part_a() {
    step "A1 JSONL -> parallel text ($N_TRAIN/$N_VALID/$N_TEST documents of $DATA)"
    python scripts/jsonl_to_parallel.py --input-dir "$DATA" --output-dir "$OUT/raw-$N_TRAIN" --splits train
    python scripts/jsonl_to_parallel.py --input-dir "$DATA" --output-dir "$OUT/raw" --splits valid test \
        --max-examples $(( N_VALID > N_TEST ? N_VALID : N_TEST ))
    head -n "$N_TRAIN" "$OUT/raw-$N_TRAIN/train.source" > "$OUT/raw/train.source"
    head -n "$N_TRAIN" "$OUT/raw-$N_TRAIN/train.target" > "$OUT/raw/train.target"
    for side in source target; do  # the first N_VALID / N_TEST documents
        head -n "$N_VALID" "$OUT/raw/valid.$side" > "$OUT/raw/valid.$side.tmp"
        mv "$OUT/raw/valid.$side.tmp" "$OUT/raw/valid.$side"
        head -n "$N_TEST" "$OUT/raw/test.$side" > "$OUT/raw/test.$side.tmp"
        mv "$OUT/raw/test.$side.tmp" "$OUT/raw/test.$side"
    done

    step "A2-A3 sentencepiece ($VOCAB pieces) + encode + binarize"
    bash scripts/spm_binarize.sh --raw-dir "$OUT/raw" --out-dir "$OUT" --vocab-size "$VOCAB"
    awk '{ n += NF } END { printf "train source: %.0f pieces/document on average\n", n / NR }' \
        "$OUT/spm-enc/train.source"

    # The paper's fine-tuning schedule (linear decay, 10 % warmup, dropout 0.1) with a from-scratch
    # learning rate: 8e-5 is for a pretrained BART; a random tiny model barely moves at 8e-5.
    WARMUP=$(( MAX_UPDATE / 10 ))
    step "A4 train lsg_bart_tiny from scratch: $MAX_UPDATE updates, lr $LR, warmup $WARMUP"
    rm -rf "$OUT/ck-a"
    fairseq-train "$OUT/bin" --user-dir "$USER_DIR" --task long_document_summarization \
        --arch lsg_bart_tiny --max-source-positions "$MAX_SRC" --max-target-positions "$MAX_TGT" \
        --truncate-target --block-size 128 --sparse-block-size 128 --sparsity-factor 4 --sparsity-type norm \
        --criterion label_smoothed_cross_entropy --label-smoothing 0.1 \
        --optimizer adam --adam-betas "(0.9, 0.999)" --adam-eps 1e-8 --lr "$LR" \
        --lr-scheduler polynomial_decay --warmup-updates "$WARMUP" --total-num-update "$MAX_UPDATE" \
        --dropout 0.1 --attention-dropout 0.1 --clip-norm 1.0 \
        --max-tokens $(( MAX_SRC + MAX_TGT + 16 )) --max-update "$MAX_UPDATE" \
        --validate-interval-updates "$MAX_UPDATE" --save-interval-updates "$MAX_UPDATE" \
        --no-epoch-checkpoints --keep-interval-updates 1 --save-dir "$OUT/ck-a" \
        "${TRAIN_DEVICE_FLAGS[@]}" --num-workers 0 --seed 1 --log-format simple --log-interval 25 2>&1 | quiet | tee "$OUT/train-a.log"

    step "A5 generate: beam 5, length penalty 2.0, max length $MAX_LEN_B, no-repeat $NO_REPEAT"
    fairseq-generate "$OUT/bin" --user-dir "$USER_DIR" --task long_document_summarization \
        --path "$OUT/ck-a/checkpoint_last.pt" --gen-subset test \
        --max-source-positions "$MAX_SRC" --max-target-positions "$MAX_TGT" --truncate-target \
        --beam 5 --lenpen 2.0 --max-len-b "$MAX_LEN_B" --no-repeat-ngram-size "$NO_REPEAT" \
        --bpe sentencepiece --sentencepiece-model "$OUT/spm/spm.model" \
        --batch-size 5 "${GENERATE_DEVICE_FLAGS[@]}" > "$OUT/generate-a.out" 2> "$OUT/generate-a.err" \
        || failed "fairseq-generate" "$OUT/generate-a.err"

    step "A6 ROUGE (model) and lead-N baselines on the same $N_TEST test documents"
    # lead-K baselines: the first K words of each document (K around the mean summary length)
    python scripts/generate_to_rouge.py --generate-output "$OUT/generate-a.out" \
        --ref-file "$OUT/raw/test.target" --output-dir "$OUT/eval-a" \
        --source-file "$OUT/raw/test.source" --lead-words 100 256 --name lsg_bart_tiny --table
    grep "valid on 'valid'" "$OUT/train-a.log" | tail -1 || true
}

part_b() {
    B="$OUT/convert"
    rm -rf "$B" && mkdir -p "$B"
    step "B1 lsg-fairseq-convert $BART_HF -> LSG 4,096 (block 128, sparsity factor 4, norm)"
    lsg-fairseq-convert "$BART_HF" "$B/lsg-4096" --max-source-positions 4096 --block-size 128 \
        --sparse-block-size 128 --sparsity-factor 4 --sparsity-type norm 2>&1 | quiet

    step "B2 GPT-2 BPE with the model's own encoder.json/vocab.bpe + binarize with its dict.txt"
    python scripts/jsonl_to_parallel.py --input-dir "$DATA" --output-dir "$B/raw" --max-examples 20
    for split in train valid test; do  # byte-level pieces: keep the first 600 characters of each summary
        cut -c1-600 "$B/raw/$split.target" > "$B/raw/$split.target.tmp" && mv "$B/raw/$split.target.tmp" "$B/raw/$split.target"
    done
    for split in train valid test; do
        python scripts/gpt2_encode.py --encoder-json "$B/lsg-4096/encoder.json" --vocab-bpe "$B/lsg-4096/vocab.bpe" \
            --inputs "$B/raw/$split.source" "$B/raw/$split.target" \
            --outputs "$B/bpe/$split.source" "$B/bpe/$split.target" --keep-empty
    done
    bash scripts/preprocess.sh --trainpref "$B/bpe/train" --validpref "$B/bpe/valid" --testpref "$B/bpe/test" \
        --destdir "$B/bin" --dict "$B/lsg-4096/dict.txt" > "$B/preprocess.log" 2>&1 || failed "preprocess.sh" "$B/preprocess.log"
    cp "$B/lsg-4096/encoder.json" "$B/lsg-4096/vocab.bpe" "$B/bin/"

    # fairseq-train builds the model from the command line, so the shape flags must match the
    # converted checkpoint: for facebook/bart-base `--arch lsg_bart_base` alone; the fixture is
    # smaller (d 64, 4 heads, FFN 128, 2+2 layers).
    SHAPE=(--arch lsg_bart_base --encoder-embed-dim 64 --decoder-embed-dim 64 --encoder-ffn-embed-dim 128
           --decoder-ffn-embed-dim 128 --encoder-layers 2 --decoder-layers 2 --encoder-attention-heads 4
           --decoder-attention-heads 4)
    COMMON=(--user-dir "$USER_DIR" --task long_document_summarization "${SHAPE[@]}"
            --criterion label_smoothed_cross_entropy --label-smoothing 0.1
            --optimizer adam --adam-betas "(0.9, 0.999)" --lr 8e-5 --lr-scheduler polynomial_decay
            --warmup-updates $(( B_UPDATES / 10 )) --total-num-update "$B_UPDATES" --max-update "$B_UPDATES"
            --dropout 0.1 --attention-dropout 0.1 --clip-norm 1.0 --disable-validation
            --no-epoch-checkpoints --save-interval-updates "$B_UPDATES"
            "${TRAIN_DEVICE_FLAGS[@]}" --num-workers 0 --seed 1 --log-format simple --log-interval 5)
    step "B3 fine-tune the converted LSG 4,096 model: $B_UPDATES updates"
    fairseq-train "$B/bin" "${COMMON[@]}" --finetune-from-model "$B/lsg-4096/model.pt" \
        --max-source-positions 4096 --max-target-positions 4096 --block-size 128 --sparse-block-size 128 \
        --sparsity-factor 4 --sparsity-type norm --max-tokens 8192 --save-dir "$B/ck-4096" 2>&1 | quiet \
        | tee "$B/train-4096.log" | grep -E "train_inner|done training" || true

    step "B4 lsg-fairseq-convert the fine-tuned checkpoint -> 16,384 positions, 64 global tokens"
    cp "$B/ck-4096/checkpoint_last.pt" "$B/ck-4096/model.pt"
    cp "$B/lsg-4096/dict.txt" "$B/lsg-4096/encoder.json" "$B/lsg-4096/vocab.bpe" "$B/ck-4096/"
    lsg-fairseq-convert "$B/ck-4096/model.pt" "$B/lsg-16384" --max-source-positions 16384 \
        --num-global-tokens 64 2>&1 | quiet

    step "B5 global-only tuning at 16,384 (--train-global-only: only the global embeddings train)"
    fairseq-train "$B/bin" "${COMMON[@]}" --finetune-from-model "$B/lsg-16384/model.pt" \
        --max-source-positions 16384 --max-target-positions 4096 --block-size 128 --sparse-block-size 128 \
        --sparsity-factor 4 --sparsity-type norm --num-global-tokens 64 --train-global-only \
        --max-tokens 20480 --save-dir "$B/ck-16384" 2>&1 | quiet \
        | tee "$B/train-16384.log" | grep -E "num. model params|train_inner|done training" || true

    step "B6 beam search (beam 5, length penalty 2.0) with the 16,384 model on the 20 test documents"
    fairseq-generate "$B/bin" --user-dir "$USER_DIR" --task long_document_summarization \
        --path "$B/ck-16384/checkpoint_last.pt" --gen-subset test --batch-size 5 \
        --max-source-positions 16384 --max-target-positions 4096 \
        --beam 5 --lenpen 2.0 --max-len-b 64 --bpe gpt2 --gpt2-encoder-json "$B/bin/encoder.json" \
        --gpt2-vocab-bpe "$B/bin/vocab.bpe" "${GENERATE_DEVICE_FLAGS[@]}" > "$B/generate.out" 2> "$B/generate.err" \
        || failed "fairseq-generate" "$B/generate.err"
    grep -c "^H-" "$B/generate.out" | sed 's/^/hypotheses: /'
    grep -E "Translated|Generate test" "$B/generate.err" | tail -1 || true
}

case "$PART" in
    all) part_a; part_b ;;
    rouge) part_a ;;
    convert) part_b ;;
esac
step "done ($(( $(date +%s) - start )) s wall); load after: $(uptime)"
