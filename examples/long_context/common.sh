# shellcheck shell=bash
# Sourced by this folder's scripts and ../long_range's (from the repository root): one home for the paths and for the
# training recipe, so that the control runs train exactly as the experiment does.
HERE=examples/long_context
VENV=${VENV:-.venv}
case $VENV in /*) ;; *) VENV="$PWD/$VENV" ;; esac  # absolute or relative to the repo
export PATH="$VENV/bin:$PATH"
OUT=${OUT:-work_dirs/long_context}
USER_DIR="$PWD/lsg_fairseq"
# shellcheck source=scripts/device_flags.sh
source scripts/device_flags.sh  # DEVICE=auto|cpu|cuda, PRECISION=fp32|bf16|fp16 -> *_DEVICE_FLAGS

synthetic_set() {  # synthetic_set DIR SPM_DIR [make_synthetic_data.py flags...]: DIR/{jsonl,raw,bin}
    # Sentencepiece: SPM_DIR=DIR trains DIR/spm (800 pieces, DIR/bin from spm_binarize.sh); another
    # set's DIR encodes with that set's model and dictionary, so that every set shares one vocabulary.
    local dir=$1 spm_dir=$2; shift 2
    python scripts/make_synthetic_data.py --output-dir "$dir/jsonl" --force --valid "${N_VALID:-10}" "$@" > /dev/null
    python scripts/jsonl_to_parallel.py --input-dir "$dir/jsonl" --output-dir "$dir/raw" > "$dir/jsonl_to_parallel.log" 2>&1 \
        || failed "jsonl_to_parallel.py on $dir/jsonl" "$dir/jsonl_to_parallel.log"
    if [ "$spm_dir" = "$dir" ]; then
        bash scripts/spm_binarize.sh --raw-dir "$dir/raw" --out-dir "$dir" --vocab-size 800 --workers 2 \
            -- --soft-vocab-limit > "$dir/spm_binarize.log" 2>&1 || failed "spm_binarize.sh on $dir/raw" "$dir/spm_binarize.log"
        return
    fi
    mkdir -p "$dir/spm-enc"
    for split in train valid test; do
        python scripts/spm_encode.py --model "$spm_dir/spm/spm.model" \
            --inputs "$dir/raw/$split.source" "$dir/raw/$split.target" \
            --outputs "$dir/spm-enc/$split.source" "$dir/spm-enc/$split.target" 2> "$dir/spm-enc/$split.log" \
            || failed "spm_encode.py on $dir/raw/$split" "$dir/spm-enc/$split.log"
    done
    bash scripts/preprocess.sh --trainpref "$dir/spm-enc/train" --validpref "$dir/spm-enc/valid" \
        --testpref "$dir/spm-enc/test" --destdir "$dir/bin" --dict "$spm_dir/spm/dict.txt" \
        > "$dir/preprocess.log" 2>&1 || failed "preprocess.sh of $dir" "$dir/preprocess.log"
    cp "$spm_dir/spm/spm.model" "$dir/bin/"
}

# The rows, NAME|model flags: the tiny shape (d 64, 2+2 layers), fan_in init. arch_flags ROW reads
# them; ARCHS (run.sh) and ROWS (long_range/run.sh) name them.
ARCH_ROWS=(
    "bart_1024|--arch bart_tiny --max-source-positions 1024"
    "full_4096|--arch bart_tiny --max-source-positions 4096"
    "lsg_norm|--arch lsg_bart_tiny --max-source-positions 4096 --sparsity-type norm"
    "lsg_none|--arch lsg_bart_tiny --max-source-positions 4096 --sparsity-type none"
    # LSG whose one layer reaches all 4,096 tokens (128 sparse keys each side, each of 32 tokens):
    # lsg_norm's reaches 127 (examples/long_range/reach.md), short of the binding variant's gap
    "lsg_wide|--arch lsg_bart_tiny --max-source-positions 4096 --sparsity-type norm --sparse-block-size 128 --sparsity-factor 32"
    "led|--arch led_tiny --max-source-positions 4096"
    "locost|--arch locost_tiny --max-source-positions 4096"
    # the control that cannot mix: each token sees +-4 tokens, no global ones (LED's layers)
    "local_8|--arch led_tiny --max-source-positions 4096 --attention-window 8 --global-attention none"
)

arch_flags() {  # arch_flags ROW: the row's model flags, from ARCH_ROWS
    local row
    for row in "${ARCH_ROWS[@]}"; do
        [ "${row%%|*}" = "$1" ] && { echo "${row#*|}"; return 0; }
    done
    die "ARCHS/ROWS: unknown row '$1' (rows: ${ARCH_ROWS[*]%%|*})"
}

max_source() {  # max_source ROW: the row's --max-source-positions, from arch_flags
    arch_flags "$1" | grep -oE "max-source-positions [0-9]+" | cut -d' ' -f2
}

greedy_generate() {  # greedy_generate DATA_BIN CHECKPOINT SUBSET MAX_SRC SPM_MODEL OUT.out: fairseq-generate's output
    # to OUT.out, its messages to OUT.err
    fairseq-generate "$1" --user-dir "$USER_DIR" --task long_document_summarization --path "$2" --gen-subset "$3" \
        --max-source-positions "$4" --max-target-positions 128 --truncate-target --beam 1 --max-len-b 80 \
        --bpe sentencepiece --sentencepiece-model "$5" --batch-size 8 "${GENERATE_DEVICE_FLAGS[@]}" > "$6" \
        2> "${6%.out}.err" || failed "generating with $2" "${6%.out}.err"
}

PROBE_CHECKPOINTS=() PROBE_OUTPUTS=()
evaluate() {  # evaluate NAME CHECKPOINT MAX_SRC [--no-bos]: generate on the long test split, score; probe_queued probes
    local name=$1 ckpt=$2 max_src=$3 bos=${4:-}
    local dir="$OUT/eval/$name" SPM="$OUT/long/spm/spm.model"
    mkdir -p "$dir"
    rm -f "$dir/probe.json"
    fairseq-generate "$OUT/long/bin" --user-dir "$USER_DIR" --task long_document_summarization \
        --path "$ckpt" --gen-subset test --max-source-positions "$max_src" --max-target-positions 128 \
        --truncate-target --beam 1 --max-len-b 60 --bpe sentencepiece --sentencepiece-model "$SPM" \
        --batch-size 8 "${GENERATE_DEVICE_FLAGS[@]}" > "$dir/generate.out" 2> "$dir/generate.err" \
        || failed "generating with $ckpt" "$dir/generate.err"
    grep -E "^[HD]-" "$dir/generate.out" > "$dir/hypotheses.out" || true  # small: what report.py commits
    # shellcheck disable=SC2086  # bos: a flag or nothing
    python scripts/key_recall.py --jsonl "$OUT/long/jsonl/test.jsonl" --generate-output "$dir/generate.out" \
        --spm-model "$SPM" $bos --name "$name" --json "$dir/recall.json" | sed 's/^/   /' >&2
    python scripts/generate_to_rouge.py --generate-output "$dir/generate.out" \
        --ref-file "$OUT/long/raw/test.target" --output-dir "$dir" > /dev/null
    PROBE_CHECKPOINTS+=("$ckpt") PROBE_OUTPUTS+=("$dir/probe.json")
}

probe_queued() {  # the attention probe of every row evaluate() scored since the last call, in one process
    [ ${#PROBE_CHECKPOINTS[@]} -gt 0 ] || return 0
    python "$HERE/attention_probe.py" "${PROBE_CHECKPOINTS[@]}" "$OUT/long/bin" --split test -n 16 \
        --out "${PROBE_OUTPUTS[@]}" 2> "$OUT/eval/probe.err" \
        || echo "   attention probe: a row failed, its reading is n/a ($OUT/eval/probe.err)" >&2
    local out
    for out in "${PROBE_OUTPUTS[@]}"; do [ -s "$out" ] || echo '{}' > "$out"; done  # the report reads {} as n/a
    PROBE_CHECKPOINTS=() PROBE_OUTPUTS=()
}

timed() {  # timed FILE CMD...: CMD's wall seconds and peak RSS (KiB) to FILE, "%e %M"; RSS 0 without GNU time
    local file=$1; shift
    if [ -x /usr/bin/time ]; then /usr/bin/time -f "%e %M" -o "$file" "$@"; return; fi
    local t0=$SECONDS rc=0
    "$@" || rc=$?
    echo "$(( SECONDS - t0 )) 0" > "$file"
    return $rc
}

MAX_TOKENS=${MAX_TOKENS:-4200}  # tokens per batch (a GPU takes more at the same cost per update)
whole_numbers MAX_TOKENS
train() {  # train NAME DATA UPDATES --lr LR [fairseq flags...]: checkpoint in $OUT/runs/NAME, time+RSS in NAME/time
    local name=$1 data=$2 updates=$3; shift 3
    local dir="$OUT/runs/$name"
    rm -rf "$dir"; mkdir -p "$dir"
    timed "$dir/time" fairseq-train "$data" --user-dir "$USER_DIR" \
        --task long_document_summarization --max-target-positions 128 --truncate-target \
        --criterion label_smoothed_cross_entropy --label-smoothing 0.1 \
        --optimizer adam --adam-betas "(0.9, 0.98)" --lr-scheduler fixed \
        --warmup-updates "$(( updates < 100 ? 1 : 100 ))" --clip-norm 1.0 --dropout 0.0 \
        --max-tokens "$MAX_TOKENS" --max-update "$updates" --disable-validation --no-epoch-checkpoints \
        --save-dir "$dir" --tensorboard-logdir "$OUT/tensorboard/$name" \
        "${TRAIN_DEVICE_FLAGS[@]}" --num-workers 0 --log-format simple --log-interval 100 --seed 1 \
        "$@" 2>&1 | quiet > "$dir/train.log" || failed "training $name" "$dir/train.log"
    { grep -E "\| train \|" "$dir/train.log" | tail -1 | grep -oE "(nll_loss|num_updates) [0-9.]+" \
        | paste -sd' ' | sed "s/^/   $name: /" >&2; } || true
}
