#!/usr/bin/env bash
# RAW/{train,valid,test}.{source,target} -> sentencepiece model, encoded text, fairseq binaries:
# the data steps every summarization pipeline here runs (scripts/demo.sh, examples/*/run_small.sh).
set -euo pipefail

prog=$(basename "$0")
here=$(cd "$(dirname "$0")" && pwd)

usage() {
  cat <<EOF
usage: $prog --raw-dir RAW --out-dir OUT --vocab-size N [--workers N] [-- EXTRA spm_train.py ARGS]

  1. scripts/spm_train.py on RAW/train.source + RAW/train.target -> OUT/spm/spm.model, OUT/spm/dict.txt
  2. scripts/spm_encode.py for train, valid, test          -> OUT/spm-enc/{split}.{source,target}
  3. scripts/preprocess.sh with that dict.txt             -> OUT/bin (replaced), log OUT/preprocess.log
  4. OUT/spm/spm.model copied into OUT/bin (what --sentencepiece-model and the hub read)

Every RAW file is checked first (present, UTF-8, as many lines in each .source as in its .target),
before anything is written. A rerun replaces what an earlier one wrote in OUT (spm_train.py
--force). EXTRA args go to spm_train.py (e.g. --soft-vocab-limit).
Python: \$PYTHON if set, else python.
  -h, --help     this help
EOF
}

# shellcheck source=scripts/lib.sh
source "$here/lib.sh"  # die, is_whole, text_checks, failed

raw="" out="" vocab="" workers=1
spm_args=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    -h|--help) usage; exit 0 ;;
    --raw-dir|--out-dir|--vocab-size|--workers)
      [[ $# -ge 2 ]] || die "$1 needs a value"
      case "$1" in
        --raw-dir) raw=$2 ;; --out-dir) out=$2 ;; --vocab-size) vocab=$2 ;; --workers) workers=$2 ;;
      esac
      shift 2 ;;
    --) shift; spm_args=("$@"); break ;;
    *) die "unknown argument $1 (see --help)" ;;
  esac
done
[[ -n "$raw" ]] || die "--raw-dir is required"
[[ -n "$out" ]] || die "--out-dir is required"
[[ -n "$vocab" ]] || die "--vocab-size is required"
# the numbers too: spm_train.py's usage text after nothing, or preprocess.sh's refusal after the model
# and the encodings are written
is_whole "$vocab" || die "--vocab-size $vocab: expected a whole number >= 1"
is_whole "$workers" || die "--workers $workers: expected a whole number >= 1"
# Before anything is written (lsg_text/text_checks.py): OUT's kind, and each split's two RAW files
# present, UTF-8, with as many lines. Else a mismatch surfaced only in step 3, naming OUT/spm-enc
# files, after spm/ and spm-enc/ were written.
checks=(output-folder --out-dir "$out")
for split in train valid test; do checks+=(pair --raw-dir "$raw/$split"); done
problem=$(text_checks "${checks[@]}" 2>&1) || die "$problem"
py=${PYTHON:-python}

# --force: a rerun replaces OUT's model, and its encodings and binaries with it (below)
"$py" "$here/spm_train.py" --inputs "$raw/train.source" "$raw/train.target" \
  --model-prefix "$out/spm/spm" --vocab-size "$vocab" --force ${spm_args[@]+"${spm_args[@]}"}
for split in train valid test; do
  "$py" "$here/spm_encode.py" --model "$out/spm/spm.model" \
    --inputs "$raw/$split.source" "$raw/$split.target" \
    --outputs "$out/spm-enc/$split.source" "$out/spm-enc/$split.target"
done
rm -rf "${out:?}/bin"
bash "$here/preprocess.sh" --trainpref "$out/spm-enc/train" --validpref "$out/spm-enc/valid" \
  --testpref "$out/spm-enc/test" --destdir "$out/bin" --dict "$out/spm/dict.txt" --workers "$workers" \
  > "$out/preprocess.log" 2>&1 || failed "preprocess.sh" "$out/preprocess.log"
cp "$out/spm/spm.model" "$out/bin/spm.model"
