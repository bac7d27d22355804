# Sourced by the shell scripts here (scripts/, benchmarks/, scripts/device_flags.sh): the one error
# exit they share. $prog names the script in the message (its basename when unset), and every
# refusal exits 2, as argparse does for the Python commands, so callers see one shape of error.
die() { echo "${prog:-$(basename "$0")}: error: $*" >&2; exit 2; }
