# Sourced by the shell scripts (scripts/, benchmarks/, examples/; through scripts/device_flags.sh by
# most): what they share.
#
# die MESSAGE: the one error exit. $prog names the script in the message (its basename when unset),
# and every refusal exits 2, as argparse does for the Python commands, so callers see one shape of error.
die() { echo "${prog:-$(basename "$0")}: error: $*" >&2; exit 2; }

# text_checks ARGS...: lsg_text/text_checks.py, the checks of the data scripts' files before they
# write anything; with this repository on the path, so that it runs whatever $PYTHON is.
text_checks() {
    PYTHONPATH="$(dirname "${BASH_SOURCE[0]}")/..${PYTHONPATH:+:$PYTHONPATH}" "${PYTHON:-python}" -m lsg_text.text_checks "$@"
}

# threads: how many threads the script's commands take: $THREADS, else $OMP_NUM_THREADS, else every core.
threads() { echo "${THREADS:-${OMP_NUM_THREADS:-$(nproc)}}"; }

# step MESSAGE: a progress line, with the seconds since $start (which the script sets when it begins).
step() { echo >&2; echo "== [$(( $(date +%s) - ${start:-$(date +%s)} ))s] $*" >&2; }

# quiet: a filter that keeps fairseq's and torch's noise out of a command's output (its warnings and
# their source lines, blank lines, hydra's and tensorboardX's notices), and never fails.
quiet() {
    grep --line-buffered -v -E \
        "UserWarning|deprecat|warnings.warn|^\s*$|tensorboardX|See https|Please specify|Will assume|version_base|self.delegate|^  " \
        || true
}
