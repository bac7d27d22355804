#!/usr/bin/env bash
# A row that run.sh trained, as a model folder (model.pt, dict.txt, spm.model) that
# lsg-fairseq-summarize and the hub read, tried on test document 0: make demo's last step.
#
#   bash examples/long_context/model_folder.sh OUT ROW MODEL_DIR   # OUT: run.sh's; ROW: e.g. lsg_norm
#
# MODEL_DIR is replaced (it is the demo's own folder under OUT); the model knows the synthetic task only.
set -euo pipefail
cd "$(dirname "$0")/../.."
# shellcheck source=scripts/lib.sh
source scripts/lib.sh  # die
prog=model_folder.sh
[ $# -eq 3 ] || die "usage: model_folder.sh OUT ROW MODEL_DIR (got $# arguments)"
out=$1 row=$2 model=$3
ckpt="$out/runs/$row/checkpoint_last.pt"
[ -f "$ckpt" ] || die "$ckpt: no such checkpoint (run examples/long_context/run.sh with ARCHS naming $row, OUT=$out)"
rm -rf "$model"
mkdir -p "$model"
cp "$ckpt" "$model/model.pt"
cp "$out/long/spm/dict.txt" "$out/long/spm/spm.model" "$model/"
doc="$out/test_document_0.txt"
sed -n 1p "$out/long/raw/test.source" > "$doc"
echo >&2
echo "$row as a model folder, $model: 'lsg-fairseq-summarize $model FILE...' summarizes the document of each FILE." >&2
echo "Test document 0 ($(wc -w < "$doc") words), summarized so:" >&2
lsg-fairseq-summarize "$model" "$doc" --quiet
