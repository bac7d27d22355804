#!/usr/bin/env bash
# Interleaved A/B of two commits: benchmarks/run.py from each commit's own checkout, alternating
# A B, B A, A B ..., then each arch's time as a ratio to `linear` per run and on average.
#
#   bash benchmarks/ab_commits.sh OLD NEW [ROUNDS]      # -> benchmarks/results/ab_<old>_<new>.md
#   RUN_ARGS="--modes enc --arch lsg_norm led locost linear --lengths 16384" bash benchmarks/ab_commits.sh ...
#
# Each commit is checked out (git worktree) under $WORK and imported from there (PYTHONPATH), so
# both run in this venv with the same torch; run it with nothing else on the machine. VENV (default
# .venv), OUTPUT (default benchmarks/results/ab_<old>_<new>.md), RUN_ARGS (run.py's flags).
set -euo pipefail
cd "$(dirname "$0")/.."
prog=ab_commits.sh
# shellcheck source=scripts/lib.sh
source scripts/lib.sh  # die
[ $# -ge 2 ] || die "usage: $prog OLD NEW [ROUNDS]"
VENV=${VENV:-.venv}
case $VENV in /*) ;; *) VENV="$PWD/$VENV" ;; esac
PY="$VENV/bin/python"
old=$(git rev-parse --short "$1") || die "$1: not a commit"
new=$(git rev-parse --short "$2") || die "$2: not a commit"
ROUNDS=${3:-2}
RUN_ARGS=${RUN_ARGS:-"--modes enc --arch lsg_norm led locost linear --lengths 16384"}
WORK=${WORK:-${TMPDIR:-/tmp}/lsg_ab}
OUTPUT=${OUTPUT:-benchmarks/results/ab_${old}_${new}.md}
whole_numbers ROUNDS  # every setting before the worktrees and the rounds
[ -x "$PY" ] || die "VENV=$VENV: no bin/python there"
[ -d "$(dirname "$OUTPUT")" ] || die "OUTPUT=$OUTPUT: no folder $(dirname "$OUTPUT")"
mkdir -p "$WORK"
for c in "$old" "$new"; do
    [ -d "$WORK/$c" ] || git worktree add --detach "$WORK/$c" "$c" > /dev/null
done
start=$(date +%s)
load_start=$(cut -d' ' -f1-3 /proc/loadavg)
cpu=$(grep -m1 "model name" /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//')
for r in $(seq 1 "$ROUNDS"); do
    # which commit runs first alternates (A B, B A, A B, ...): the second run of a round measured
    # faster rows at the end of a run, whichever commit it was (ab_0e46e34_f02d37f_reversed.md)
    order="$old $new"
    [ $((r % 2)) -eq 0 ] && order="$new $old"
    for c in $order; do
        echo "== round $r: $c" >&2
        # shellcheck disable=SC2086
        (cd "$WORK/$c" && PYTHONPATH="$WORK/$c" "$PY" benchmarks/run.py $RUN_ARGS --no-plots \
            --out "$WORK/results/$c" --tag "round$r") | grep -E "^ +[0-9]+ " >&2
    done
done
"$PY" benchmarks/ab_report.py "$WORK/results" "$old" "$new" "$ROUNDS" "$(( $(date +%s) - start ))" "$load_start" \
    "$(cut -d' ' -f1-3 /proc/loadavg)" "$RUN_ARGS" "$cpu, $(nproc) cores" > "$OUTPUT.part"
mv "$OUTPUT.part" "$OUTPUT"  # whole or not at all
echo "wrote $OUTPUT" >&2
