#!/usr/bin/env bash
# Order by position, or by relation? Re-score trained order checkpoints on documents whose arrivals are
# placed anywhere (--min-gap 0), not 1,024+ words apart. With 3 arrivals 1,024+ words apart in 3.3K words,
# where an arrival lies almost gives its rank (first third: first; last third: last); with --min-gap 0 it
# does not, so a model that only knows roughly where each arrival lies falls back, one that compares the
# arrivals keeps its score. No training; the documents are the validation split of a new draw.
#
#   bash examples/long_range/regap.sh SET_DIR REPORT_DIR ROW=CHECKPOINT...
#     SET_DIR     run.sh's $OUT/order/long (its spm model and dictionary encode the new documents)
#     REPORT_DIR  gets outputs/order/{data.json,ROW.seed1.txt} and report.py's results.md
#   WORK=DIR keeps the encoded documents there (default: a temporary folder, removed at the end)
#   FIT_DATA=run.sh's REPORT_DIR/outputs/order/data.json: the position-only row's thresholds are fitted on
#     the training documents the checkpoints learned from (default: these documents' own train split);
#     N_TRAIN: how many of them (run.sh's N_LONG; default 1500); its --min-keys..--max-keys must hold KEYS
#   KEYS=arrivals per new document (default 3: the order3 run's; 2 for run.sh's MIN_KEYS=MAX_KEYS=2 run)
#   N=how many new documents (default 40)
#   e.g. bash examples/long_range/regap.sh work_dirs/lr_order3/order/long /tmp/regap \
#            locost=work_dirs/lr_order3/runs/order.locost.s1/checkpoint_last.pt
set -euo pipefail
cd "$(dirname "$0")/../.."
if [ $# -lt 3 ]; then echo "regap.sh: error: usage: regap.sh SET_DIR REPORT_DIR ROW=CHECKPOINT..." >&2; exit 2; fi
SET=$1 REPORT_DIR=$2; shift 2
OUT=${WORK:-$(mktemp -d)}  # the new documents, encoded; removed at the end unless WORK is given
[ -n "${WORK:-}" ] || trap 'rm -rf "$OUT"' EXIT
# shellcheck source=examples/long_context/common.sh
source examples/long_context/common.sh
N=${N:-40}
KEYS=${KEYS:-3}
if [ -n "${FIT_DATA:-}" ]; then  # before any decoding: the position-only row has no thresholds for KEYS
    python - "$FIT_DATA" "$KEYS" <<'EOF'
import json, sys
path, keys = sys.argv[1], sys.argv[2]
try:
    with open(path, encoding="utf-8") as f:
        flags = json.load(f)["flags"]
    lo, hi = (int(flags[flags.index(name) + 1]) for name in ("--min-keys", "--max-keys"))
except (OSError, ValueError, KeyError, TypeError, IndexError) as e:
    sys.exit(print(f"regap.sh: error: FIT_DATA={path}: not run.sh's data.json with --min-keys/--max-keys ({e})",
                   file=sys.stderr) or 2)
if not keys.isdigit():
    sys.exit(print(f"regap.sh: error: KEYS={keys}: expected a number of arrivals", file=sys.stderr) or 2)
if not lo <= int(keys) <= hi:
    sys.exit(print(f"regap.sh: error: KEYS={keys}, but FIT_DATA={path} was drawn with {lo}-{hi} arrivals: its "
                   f"position-only rule has no thresholds for KEYS (set KEYS={lo}, or the data.json of a "
                   f"{keys}-arrival run)", file=sys.stderr) or 2)
EOF
fi
whole_numbers N  # KEYS: with FIT_DATA above, else by the generator
for f in spm/spm.model spm/dict.txt; do [ -f "$SET/$f" ] || die "SET_DIR=$SET: no $f (run.sh's \$OUT/order/long)"; done
for spec in "$@"; do
    [[ $spec == ?*=?* ]] || die "$spec: expected ROW=CHECKPOINT"
    [ -f "${spec#*=}" ] || die "$spec: no such checkpoint"
done
writable_folder REPORT_DIR
flags=(--variant order --holdout --min-gap 0 --min-keys "$KEYS" --max-keys "$KEYS" --min-tokens 3200
       --max-tokens 3550 --seed 21)
N_VALID=$N synthetic_set "$OUT" "$SET" "${flags[@]}" --train 1 --test 1
mkdir -p "$REPORT_DIR/outputs/order"
printf '{"flags": [%s]}\n' "$(printf '"%s", ' "${flags[@]}" | sed 's/, $//')" > "$REPORT_DIR/outputs/order/data.json"
rows=()
for spec in "$@"; do
    row=${spec%%=*} ckpt=${spec#*=}
    greedy_generate "$OUT/bin" "$ckpt" valid 4096 "$SET/spm/spm.model" "$OUT/$row.generate.out"
    python examples/long_range/report.py extract "$OUT/$row.generate.out" "$N" "$REPORT_DIR/outputs/order/$row.seed1.txt"
    rows+=("$row")
done
python examples/long_range/report.py --outputs "$REPORT_DIR/outputs" --report-dir "$REPORT_DIR" --split valid \
    --n-docs "$N" --variants order --rows "${rows[@]}" --seeds 1 ${FIT_DATA:+--fit-data "$FIT_DATA"} \
    ${N_TRAIN:+--n-train "$N_TRAIN"} \
    --command "bash examples/long_range/regap.sh $SET $REPORT_DIR $*" --settings "N=$N KEYS=$KEYS"
