#!/usr/bin/env bash
# Gap-sentence (GSG) pretraining on the Gutenberg books, then summarization fine-tuning, compared
# with the same fine-tuning from scratch. CPU-sized by default; see README.md for the numbers.
#
#   bash examples/gsg_pretraining/run.sh
#   ARCH=locost_tiny FT_DATA=../shared/data/sumpubmed bash examples/gsg_pretraining/run.sh
#
# Knobs (environment): OUT (work dir), ARCH, VOCAB, CHUNK_WORDS (words per pseudo-document),
# MAX_SRC / MAX_TGT (positions), GSG_UPDATES, FT_UPDATES, MAX_TOKENS, FT_DATA, THREADS, DEVICE
# (auto|cpu|cuda, default auto) and PRECISION (fp32|bf16|fp16), see scripts/device_flags.sh.
# FT_DATA and GUTENBERG are full data sets (../shared/data by default; not in the repository).
set -euo pipefail
cd "$(dirname "$0")/../.."
export PATH="$PWD/${VENV:-.venv}/bin:$PATH"
OUT=${OUT:-${TMPDIR:-/tmp}/lsg_gsg_example}
ARCH=${ARCH:-lsg_bart_tiny}
VOCAB=${VOCAB:-8000}
CHUNK_WORDS=${CHUNK_WORDS:-3000}
MAX_SRC=${MAX_SRC:-1024}
MAX_TGT=${MAX_TGT:-128}
GSG_UPDATES=${GSG_UPDATES:-60}
FT_UPDATES=${FT_UPDATES:-40}
MAX_TOKENS=${MAX_TOKENS:-8192}
FT_DATA=${FT_DATA:-../shared/data/squality}
GUTENBERG=${GUTENBERG:-../shared/data/gutenberg}
USER_DIR="$PWD/lsg_fairseq"
# shellcheck source=scripts/device_flags.sh
source scripts/device_flags.sh  # DEVICE, PRECISION -> TRAIN_DEVICE_FLAGS, GENERATE_DEVICE_FLAGS; lib.sh
whole_numbers VOCAB CHUNK_WORDS MAX_SRC MAX_TGT GSG_UPDATES FT_UPDATES MAX_TOKENS  # before any work
known_arch ARCH
OMP_NUM_THREADS=$(threads); export OMP_NUM_THREADS
start=$(date +%s)

# Held out as GSG validation (the data README's suggestion); every other book is training text.
VALID_BOOK=chesterton-thursday.txt
# shellcheck source=scripts/need_data.sh
source scripts/need_data.sh
need_data GUTENBERG "$GUTENBERG/$VALID_BOOK"
need_data FT_DATA "$FT_DATA"/{train,valid}.jsonl
TRAIN_BOOKS=""
for book in "$GUTENBERG"/*.txt; do
    [ "$(basename "$book")" = "$VALID_BOOK" ] || TRAIN_BOOKS+="${TRAIN_BOOKS:+,}$book"
done

step "1/6 summarization JSONL ($FT_DATA) -> parallel text"
python scripts/jsonl_to_parallel.py --input-dir "$FT_DATA" --output-dir "$OUT/ft-raw" --splits train valid

step "2/6 sentencepiece ($VOCAB pieces) on the books + the fine-tuning train split: one vocabulary for both"
python scripts/spm_train.py --inputs "$GUTENBERG"/*.txt "$OUT/ft-raw/train.source" "$OUT/ft-raw/train.target" \
    --model-prefix "$OUT/spm/spm" --vocab-size "$VOCAB" --force  # a re-run re-encodes everything below

step "3/6 GSG corpus: books -> ~$CHUNK_WORDS-word documents -> sentences -> pieces"
python scripts/gsg_preprocess.py --format file --chunk-words "$CHUNK_WORDS" \
    --input "train=$TRAIN_BOOKS" --input "valid=$GUTENBERG/$VALID_BOOK" \
    --spm-model "$OUT/spm/spm.model" --output-dir "$OUT/gsg-bin" --force  # a re-run replaces the corpus
cp "$OUT/spm/spm.model" "$OUT/gsg-bin/spm.model"
python examples/gsg_pretraining/throughput.py --data "$OUT/gsg-bin" --max-source-positions "$MAX_SRC" \
    --max-target-positions "$MAX_TGT" 2>&1 | quiet | tee "$OUT/throughput.txt"

step "4/6 fine-tuning data: sentencepiece + binarize with the same dict.txt"
for split in train valid; do
    python scripts/spm_encode.py --model "$OUT/spm/spm.model" \
        --inputs "$OUT/ft-raw/$split.source" "$OUT/ft-raw/$split.target" \
        --outputs "$OUT/ft-bpe/$split.source" "$OUT/ft-bpe/$split.target"
done
rm -rf "$OUT/ft-bin"
bash scripts/preprocess.sh --trainpref "$OUT/ft-bpe/train" --validpref "$OUT/ft-bpe/valid" \
    --destdir "$OUT/ft-bin" --dict "$OUT/spm/dict.txt" >/dev/null
cp "$OUT/spm/spm.model" "$OUT/ft-bin/spm.model"

COMMON=(--user-dir "$USER_DIR" --arch "$ARCH" "${TRAIN_DEVICE_FLAGS[@]}" --num-workers 0 --seed 1
        --max-source-positions "$MAX_SRC" --max-target-positions "$MAX_TGT" --max-tokens "$MAX_TOKENS"
        --criterion label_smoothed_cross_entropy --label-smoothing 0.1
        --optimizer adam --adam-betas "(0.9, 0.98)" --lr 3e-3 --lr-scheduler inverse_sqrt
        --clip-norm 1.0 --dropout 0.0 --attention-dropout 0.0 --required-batch-size-multiple 1
        --no-epoch-checkpoints --log-format simple --log-interval 5
        # validate (and save) once, after the last update: validation with generation costs
        # minutes on a shared CPU
        --validate-interval 1000 --save-interval 1000)

step "5/6 GSG pretraining: $ARCH, $GSG_UPDATES updates"
rm -rf "$OUT/ck-gsg"
fairseq-train "$OUT/gsg-bin" --task gap_sentence_generation "${COMMON[@]}" \
    --warmup-updates 10 --max-update "$GSG_UPDATES" --save-dir "$OUT/ck-gsg" 2>&1 | quiet | tee "$OUT/gsg.log"

# The same fine-tuning twice: from random weights ("before pretraining") and from the GSG
# checkpoint ("after"). ROUGE (rouge-score, stemmed) of greedy summaries of the valid split.
for init in scratch gsg; do
    step "6/6 fine-tune ($init) with long_document_summarization: $FT_UPDATES updates"
    restore=()
    if [ "$init" = gsg ]; then
        restore=(--restore-file "$OUT/ck-gsg/checkpoint_last.pt" --reset-optimizer --reset-dataloader
                 --reset-meters --reset-lr-scheduler)
    fi
    rm -rf "$OUT/ck-ft-$init"
    fairseq-train "$OUT/ft-bin" --task long_document_summarization --truncate-target "${COMMON[@]}" \
        "${restore[@]}" --warmup-updates 10 --max-update "$FT_UPDATES" \
        --eval-rouge --eval-rouge-bpe sentencepiece \
        --eval-rouge-args "{\"beam\": 1, \"max_len_b\": $MAX_TGT, \"no_repeat_ngram_size\": 3}" \
        --save-dir "$OUT/ck-ft-$init" 2>&1 | quiet | tee "$OUT/ft-$init.log"
done

step "done"
echo "GSG valid:"; grep "valid on 'valid'" "$OUT/gsg.log" | tail -1
for init in scratch gsg; do echo "fine-tune from $init:"; grep "valid on 'valid'" "$OUT/ft-$init.log" | tail -1; done
