# Sourced by run.sh and control.sh (from the repository root): one home for the paths and for the
# training recipe, so that the control runs train exactly as the experiment does.
HERE=examples/long_context
VENV=${VENV:-.venv}
case $VENV in /*) ;; *) VENV="$PWD/$VENV" ;; esac  # absolute or relative to the repo
export PATH="$VENV/bin:$PATH"
OUT=${OUT:-work_dirs/long_context}
USER_DIR="$PWD/lsg_fairseq"
# shellcheck source=scripts/device_flags.sh
source scripts/device_flags.sh  # DEVICE=auto|cpu|cuda, PRECISION=fp32|bf16|fp16 -> *_DEVICE_FLAGS
quiet() { grep --line-buffered -v -E "UserWarning|deprecat|warnings.warn|^\s*$|See https|Please specify|Will assume|version_base|self.delegate|^  " || true; }

train() {  # train NAME DATA UPDATES --lr LR [fairseq flags...]: checkpoint in $OUT/runs/NAME, time+RSS in NAME/time
    local name=$1 data=$2 updates=$3; shift 3
    local dir="$OUT/runs/$name"
    rm -rf "$dir"; mkdir -p "$dir"
    /usr/bin/time -f "%e %M" -o "$dir/time" fairseq-train "$data" --user-dir "$USER_DIR" \
        --task long_document_summarization --max-target-positions 128 --truncate-target \
        --criterion label_smoothed_cross_entropy --label-smoothing 0.1 \
        --optimizer adam --adam-betas "(0.9, 0.98)" --lr-scheduler fixed \
        --warmup-updates "$(( updates < 100 ? 1 : 100 ))" --clip-norm 1.0 --dropout 0.0 \
        --max-tokens 4200 --max-update "$updates" --disable-validation --no-epoch-checkpoints \
        --save-dir "$dir" --tensorboard-logdir "$OUT/tensorboard/$name" \
        "${TRAIN_DEVICE_FLAGS[@]}" --num-workers 0 --log-format simple --log-interval 100 --seed 1 \
        "$@" 2>&1 | quiet > "$dir/train.log"
    { grep -E "\| train \|" "$dir/train.log" | tail -1 | grep -oE "(nll_loss|num_updates) [0-9.]+" \
        | paste -sd' ' | sed "s/^/   $name: /" >&2; } || true
}
