# shellcheck shell=bash
# Sourced by the examples that read the full data sets. Those live outside the repository
# (../shared/data beside it by default; tests/data holds only the small part the tests read), so
# an example that does not find one stops before any work: one line naming the missing path and
# the variable that points there, exit 2.
#
#   need_data DATA "$DATA"/{train,valid,test}.jsonl
need_data() {
    local var=$1 path where
    shift
    for path in "$@"; do
        [ -e "$path" ] && continue
        # a folder knob (DATA) names where the file is, not the file: DATA=/x/train.jsonl would look in it
        if [ "$path" = "${!var}" ]; then where="$var=/path/to/it"; else where="$var to the folder that holds $(basename "$path")"; fi
        echo "${prog:-$(basename "$0")}: error: $(realpath -m "$path") not found: this example reads it" \
            "(tests/data has only the tests' part of the full data sets); put it there or set $where" >&2
        exit 2
    done
}
