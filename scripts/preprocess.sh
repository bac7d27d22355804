#!/usr/bin/env bash
# Binarize PREF.source / PREF.target pairs with fairseq-preprocess (one joined dictionary).
# Checks first that every file exists and that source and target of each split have the same
# number of lines (fairseq would otherwise fail late, or pair examples wrongly). Output appears in
# --destdir only when fairseq-preprocess succeeds (it runs in a temp folder beside it).
set -euo pipefail

prog=$(basename "$0")

usage() {
  cat <<EOF
usage: $prog --trainpref P [--validpref P[,P2...]] [--testpref P[,P2...]] --destdir DIR
             [--dict DICT] [--workers N] [-- EXTRA fairseq-preprocess ARGS]

Runs: fairseq-preprocess --source-lang source --target-lang target --trainpref P ...
      --destdir DIR --srcdict DICT --tgtdict DICT --workers N
Each prefix P names the files P.source and P.target (one example per line, already BPE/
sentencepiece-encoded: scripts/gpt2_encode.py or scripts/spm_encode.py).

  --dict DICT    joined dictionary (dict.txt from scripts/spm_train.py or a converted model);
                 without it a joined dictionary is built from the training data
                 (--joined-dictionary).
  --workers N    fairseq-preprocess workers (default: 1)
Files already in DIR are kept; those fairseq-preprocess writes are replaced. A rerun that
would leave splits in DIR beside a dictionary other than theirs is refused.
  -h, --help     this help

The fairseq-preprocess of the active environment is used; set PYTHON=/path/to/python to run
"\$PYTHON -m fairseq_cli.preprocess" instead.
EOF
}

# shellcheck source=scripts/lib.sh
source "$(dirname "$0")/lib.sh"  # die

trainpref="" validpref="" testpref="" destdir="" dict="" workers=1
extra=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    -h|--help) usage; exit 0 ;;
    --trainpref|--validpref|--testpref|--destdir|--dict|--workers)
      [[ $# -ge 2 ]] || die "$1 needs a value"
      case "$1" in
        --trainpref) trainpref=$2 ;; --validpref) validpref=$2 ;; --testpref) testpref=$2 ;;
        --destdir) destdir=$2 ;; --dict) dict=$2 ;; --workers) workers=$2 ;;
      esac
      shift 2 ;;
    --) shift; extra=("$@"); break ;;
    *) die "unknown argument '$1' (see --help; fairseq-preprocess options go after '--')" ;;
  esac
done

[[ -n "$trainpref" ]] || die "--trainpref is required"
[[ -n "$destdir" ]] || die "--destdir is required"
[[ "$workers" =~ ^[1-9][0-9]*$ ]] || die "--workers must be a positive integer, got '$workers'"
# Every file before any work, each refusal naming its flag and file (lsg_text/text_checks.py): the
# output folder's kind (mkdir would fail only after the binarizing), --dict a dict.txt, and each
# split's two files present, UTF-8, with as many lines (fairseq would fail late or with a traceback,
# or pair examples wrongly).
checks=(output-folder --destdir "$destdir")
if [[ -n "$dict" ]]; then checks+=(dict --dict "$dict"); fi
checks+=(pair --trainpref "$trainpref")
IFS=, read -r -a valids <<< "$validpref"
for p in "${valids[@]}"; do checks+=(pair --validpref "$p"); done
IFS=, read -r -a tests <<< "$testpref"
for p in "${tests[@]}"; do checks+=(pair --testpref "$p"); done
counts=$(text_checks "${checks[@]}" 2>&1) || die "$counts"
while IFS= read -r line; do echo "$prog: $line"; done <<< "$counts" >&2

if [[ -n "${PYTHON:-}" ]]; then
  cmd=("$PYTHON" -m fairseq_cli.preprocess)
elif command -v fairseq-preprocess >/dev/null; then
  cmd=(fairseq-preprocess)
else
  die "fairseq-preprocess not found on PATH (activate the environment or set PYTHON=/path/to/python)"
fi

args=(--source-lang source --target-lang target --trainpref "$trainpref" --workers "$workers")
[[ -n "$validpref" ]] && args+=(--validpref "$validpref")
[[ -n "$testpref" ]] && args+=(--testpref "$testpref")
if [[ -n "$dict" ]]; then
  args+=(--srcdict "$dict" --tgtdict "$dict")
else
  args+=(--joined-dictionary)
fi

parent=$(dirname "$destdir")
mkdir -p "$parent"
tmp=$(mktemp -d "$parent/.$(basename "$destdir").tmp.XXXXXX")
trap 'rm -rf "$tmp"' EXIT

"${cmd[@]}" "${args[@]}" --destdir "$tmp" ${extra[@]+"${extra[@]}"} \
  || die "fairseq-preprocess failed (nothing written to $destdir)"

# Binaries this run does not rewrite hold the indices of the dictionary they were made with: beside
# another dictionary they would read as other words, without an error (a rerun with --trainpref only
# and no --dict builds a new one).
if [[ -f "$destdir/dict.source.txt" ]] && ! cmp -s "$destdir/dict.source.txt" "$tmp/dict.source.txt"; then
  stale=$(cd "$destdir" && for f in *.source-target.*.idx; do
            [[ -e "$f" && ! -e "$tmp/$f" ]] && echo "${f%%.*}"; done | sort -u | paste -sd, -) || true
  [[ -z "$stale" ]] || die "--destdir $destdir: its split(s) $stale were binarized with another dictionary" \
    "than this run's; rerun with their prefixes too (--validpref, --testpref) or use another --destdir" \
    "(nothing written)"
fi
mkdir -p "$destdir"
for f in "$tmp"/* ; do mv -f "$f" "$destdir/"; done
echo "$prog: binarized data in $destdir" >&2
# Text never encoded with --dict's tokenizer binarizes without an error, mostly to <unk>; fairseq
# says so only in its log. Above 5% this says it on stderr (without --dict the dictionary is built
# from the text: no <unk>).
if [[ -n "$dict" ]]; then
  awk -v prog="$prog" -v limit=5 '/% replaced \(by <unk>\)/ {
      for (i = 1; i <= NF; i++) if ($i ~ /%$/ && $i + 0 > limit)
        printf "%s: warning: %s: %s of the tokens are not in --dict (<unk>): was the text encoded with its tokenizer (scripts/spm_encode.py, scripts/gpt2_encode.py)?\n", prog, substr($2, 1, length($2) - 1), $i
    }' "$destdir/preprocess.log" >&2
fi
