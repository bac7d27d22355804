# shellcheck shell=bash
# Sourced by the shell scripts (scripts/, benchmarks/, examples/; through scripts/device_flags.sh by
# most): what they share.
#
# die MESSAGE: the one error exit. $prog names the script in the message (its basename when unset),
# and every refusal exits 2, as argparse does for the Python commands, so callers see one shape of error.
die() { echo "${prog:-$(basename "$0")}: error: $*" >&2; exit 2; }

# failed STEP LOG: die saying STEP failed, with the last lines of LOG, where its messages went. A
# step whose output goes to a log would otherwise end a `set -e` script with no word at all. GNU
# time -v's report, whose lines begin with a tab, is left out: it follows the step's own error.
failed() {
    local tail_lines
    tail_lines=$({ grep -v $'^\t' "$2" 2> /dev/null || true; } | tail -n 6 | sed 's/^/  | /')
    die "$1 failed; the end of $2:"$'\n'"${tail_lines:-  (nothing there)}"
}

# is_whole VALUE [MIN]: whether VALUE is a whole number >= MIN (default 1), written without leading
# zeros: bash's arithmetic, where the scripts use their knobs, reads 010 as octal and refuses 08.
is_whole() { [[ $1 =~ ^(0|[1-9][0-9]*)$ ]] && (( $1 >= ${2:-1} )); }

# whole_numbers [--min N] KNOB...: each named variable holds a whole number >= N (default 1), else die
# naming it. Scripts check their numeric knobs so before any work: a word fails deep inside bash's
# arithmetic or a tool's usage text, and fairseq reads --max-update 0 as "no limit".
whole_numbers() {
    local min=1 knob
    if [ "${1:-}" = --min ]; then min=$2; shift 2; fi
    for knob in "$@"; do
        is_whole "${!knob-}" "$min" || die "$knob=${!knob-}: expected a whole number >= $min"
    done
}

# one_of KNOB VALUE...: the named variable holds one of the VALUEs, else die naming them.
one_of() {
    local knob=$1; shift
    local value
    for value in "$@"; do [ "${!knob-}" = "$value" ] && return 0; done
    die "$knob=${!knob-}: expected one of: $*"
}

# words_of KNOB VALUE...: the named variable holds one or more words, each one of the VALUEs, else die
# naming the first that is not (a list knob such as ROWS: checked before the first row runs). The
# variable is left as its words joined by single spaces, so that " $KNOB " == *" word "* finds them.
words_of() {
    local knob=$1; shift
    local words word value
    read -ra words <<< "${!knob-}"  # split on blanks, no glob: ROWS='*' is a word, not the folder's files
    [ ${#words[@]} -gt 0 ] || die "$knob is empty: expected one or more of: $*"
    for word in "${words[@]}"; do
        for value in "$@"; do [ "$word" = "$value" ] && continue 2; done
        die "$knob: unknown '$word' (expected one or more of: $*)"
    done
    printf -v "$knob" '%s' "${words[*]}"
}

# known_arch KNOB: the named variable is a model architecture (--arch) that fairseq knows with this
# plugin, else die with the closest name. One python start (fairseq's import, a few seconds), paid
# before a pipeline's data work rather than at its first fairseq-train.
known_arch() {
    local hint rc=0
    hint=$(python -c 'import difflib, sys
import lsg_fairseq  # registers the plugin
from fairseq.models import ARCH_MODEL_REGISTRY
if sys.argv[1] not in ARCH_MODEL_REGISTRY:
    close = difflib.get_close_matches(sys.argv[1], list(ARCH_MODEL_REGISTRY), 1)
    print(f"; did you mean {close[0]}?" if close else "")
    sys.exit(3)' "${!1-}" 2> /dev/null) || rc=$?
    [ "$rc" -ne 3 ] || die "$1=${!1-}: not a model architecture (--arch) of fairseq or lsg-fairseq$hint"
    [ "$rc" -eq 0 ] || die "$1: could not check it: python -c 'import lsg_fairseq, fairseq' fails here"
}

# writable_folder KNOB: the folder the named variable holds exists or can be made (its nearest
# existing parent is a writable folder), checked before the work whose results end up there.
writable_folder() {
    local path=${!1-} parent
    [ -n "$path" ] || die "$1 is empty: expected a folder"
    [ ! -e "$path" ] || [ -d "$path" ] || die "$1=$path: not a folder"
    parent=$path
    while [ ! -e "$parent" ]; do parent=$(dirname "$parent"); done
    [ -d "$parent" ] && [ -w "$parent" ] || die "$1=$path: $parent is not a writable folder"
}

# text_checks ARGS...: lsg_text/text_checks.py, the checks of the data scripts' files before they
# write anything; with this repository on the path, so that it runs whatever $PYTHON is.
text_checks() {
    PYTHONPATH="$(dirname "${BASH_SOURCE[0]}")/..${PYTHONPATH:+:$PYTHONPATH}" "${PYTHON:-python}" -m lsg_text.text_checks "$@"
}

# threads: how many threads the script's commands take: $THREADS, else $OMP_NUM_THREADS, else every core.
# Called as an assignment (n=$(threads)), so that its refusal stops the script under set -e.
threads() {
    local n=${THREADS:-${OMP_NUM_THREADS:-$(nproc)}}
    is_whole "$n" || die "threads '$n' (THREADS, else OMP_NUM_THREADS): expected a whole number >= 1"
    echo "$n"
}

# step MESSAGE: a progress line, with the seconds since $start (which the script sets when it begins).
step() { echo >&2; echo "== [$(( $(date +%s) - ${start:-$(date +%s)} ))s] $*" >&2; }

# quiet: a filter that keeps fairseq's and torch's noise out of a command's output (its warnings and
# their source lines, blank lines, hydra's and tensorboardX's notices), and never fails.
quiet() {
    grep --line-buffered -v -E \
        "UserWarning|deprecat|warnings.warn|^\s*$|tensorboardX|See https|Please specify|Will assume|version_base|self.delegate|^  " \
        || true
}
