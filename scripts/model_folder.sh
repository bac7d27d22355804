#!/usr/bin/env bash
# A trained checkpoint as a model folder that lsg-fairseq-summarize and the hub read (model.pt,
# dict.txt, spm.model), tried on the first document of a one-document-per-line file: make demo's
# last step.
#
# usage: bash scripts/model_folder.sh CHECKPOINT SPM_DIR MODEL_DIR DOCS
#
# SPM_DIR: what spm_binarize.sh wrote as OUT/spm (dict.txt, spm.model); MODEL_DIR: absent or empty.
set -euo pipefail
# shellcheck source=scripts/lib.sh
source "$(dirname "$0")/lib.sh"  # die
prog=model_folder.sh
if [ "${1:-}" = "--help" ] || [ "${1:-}" = "-h" ]; then
    sed -n '2,8p' "$0" | sed 's/^# \{0,1\}//'
    exit 0
fi
[ $# -eq 4 ] || die "usage: model_folder.sh CHECKPOINT SPM_DIR MODEL_DIR DOCS (got $# arguments)"
ckpt=$1 spm=$2 model=$3 docs=$4
for f in "$ckpt" "$spm/dict.txt" "$spm/spm.model" "$docs"; do
    [ -f "$f" ] || die "$f: no such file"
done
if [ -e "$model" ] && [ -n "$(ls -A "$model" 2>/dev/null || echo file)" ]; then
    die "MODEL_DIR $model: exists and is not an empty folder (remove it, or name another)"
fi
mkdir -p "$model"
cp "$ckpt" "$model/model.pt"
cp "$spm/dict.txt" "$spm/spm.model" "$model/"
echo >&2
echo "The model as a folder, $model: 'lsg-fairseq-summarize $model FILE...' summarizes the document of each" >&2
echo "FILE. The first document of $docs ($(head -1 "$docs" | wc -w) words), summarized so:" >&2
head -1 "$docs" | lsg-fairseq-summarize "$model" --quiet
