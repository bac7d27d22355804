"""The checks scripts/preprocess.sh and scripts/spm_binarize.sh run before they write anything, as
one command. fairseq-free, so it runs whatever ``$PYTHON`` is; every refusal names the flag and the
file. Without them fairseq-preprocess fails late or with a traceback (a ``--dict`` that is not a
dict.txt, non-UTF-8 text), or pairs the examples of files of different lengths wrongly.

    python -m lsg_text.text_checks output-folder FLAG DIR  dict FLAG DICT  pair FLAG PREFIX ...

Triples of a check, the script's flag it names and the path, checked in the order given
(the flags start with ``--``, so no argparse here): ``output-folder``: a folder or nothing yet, not
below a file; ``dict``: a fairseq dict.txt; ``pair``: PREFIX.source and PREFIX.target exist, are
UTF-8, have as many lines (as fairseq counts them) and at least one. Once everything passed,
prints ``PREFIX: N examples`` for each pair; else prints the first problem alone and exits 1 (2 for
a malformed call).
"""

import sys
from typing import List, Optional

from lsg_text.fileio import DataError, check_fairseq_dict, check_output_path, check_utf8, count_lines, require_file

SIDES = ("source", "target")


def check_pair(flag: str, prefix: str) -> int:
    """The number of examples of PREFIX.source / PREFIX.target, or a :class:`DataError`."""
    source, target = (f"{prefix}.{side}" for side in SIDES)
    for path in (source, target):
        require_file(path, flag)
    for path in (source, target):
        check_utf8(path, flag)
    ns, nt = count_lines(source), count_lines(target)
    if ns != nt:
        raise DataError(
            f"{flag}: line counts differ: {source} has {ns} lines, {target} has {nt} lines "
            "(one example per line in both; make them again, e.g. with scripts/jsonl_to_parallel.py)"
        )
    if ns == 0:
        raise DataError(f"{flag}: {source} and {target} are empty (give every split at least one example)")
    return ns


def check(kind: str, flag: str, path: str) -> Optional[int]:
    """One check of :data:`CHECKS`; the pair's number of examples, else None."""
    if kind == "output-folder":
        check_output_path(path, flag, folder=True)
    elif kind == "dict":
        check_fairseq_dict(require_file(path, flag), flag)
    else:
        return check_pair(flag, path)
    return None


CHECKS = ("output-folder", "dict", "pair")


def main(argv: Optional[List[str]] = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    triples = [argv[i : i + 3] for i in range(0, len(argv), 3)]
    if len(argv) % 3 or any(kind not in CHECKS for kind, _, _ in triples):
        print(f"usage: python -m lsg_text.text_checks ({'|'.join(CHECKS)}) FLAG PATH ...", file=sys.stderr)
        return 2
    try:
        counts = [(path, check(kind, flag, path)) for kind, flag, path in triples]
    except DataError as e:
        print(e, file=sys.stderr)
        return 1
    for prefix, n in counts:
        if n is not None:
            print(f"{prefix}: {n} examples")
    return 0


if __name__ == "__main__":
    sys.exit(main())
