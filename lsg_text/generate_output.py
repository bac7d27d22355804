"""Parse the stdout of ``fairseq-generate`` (or ``--results-path``'s generate-*.txt).

fairseq prints, per example (``sample_id`` = line number in the test split)::

    S-{id}\\t{source}            T-{id}\\t{target, decoded}
    H-{id}\\t{score}\\t{hypothesis tokens}   D-{id}\\t{score}\\t{detokenized hypothesis}
    P-{id}\\t{positional scores}

in batch order, not id order, mixed with log lines; with ``--nbest k`` each id has k H/D lines,
best first. Hypotheses come from D- (decoded by ``--bpe``), falling back to H- when an id has no
D- line. Examples dropped by ``--skip-invalid-size-inputs-valid-test`` have no lines at all.
"""

import re
from dataclasses import dataclass
from typing import Dict, Iterable, List, Optional, Tuple

from lsg_text.fileio import DataError

_LINE = re.compile(r"^([STHD])-(\d+)\t(.*)$")


@dataclass
class GeneratedExample:
    id: int
    source: Optional[str] = None
    target: Optional[str] = None
    hypothesis: Optional[str] = None  # H-: tokens/BPE after --post-process
    detokenized: Optional[str] = None  # D-: after --bpe/--tokenizer decoding
    score: Optional[float] = None

    @property
    def best_hypothesis(self) -> Optional[str]:
        return self.detokenized if self.detokenized is not None else self.hypothesis


def parse_generate_output(lines: Iterable[str], path: str = "<generate output>") -> Dict[int, GeneratedExample]:
    """``{id: GeneratedExample}`` from fairseq-generate output; only the best (first) hypothesis
    of each id is kept. Raises :class:`DataError` naming ``path:line`` on a malformed H-/D- line."""
    examples: Dict[int, GeneratedExample] = {}
    for lineno, raw in enumerate(lines, start=1):
        m = _LINE.match(raw.rstrip("\n"))
        if not m:
            continue  # log lines, P-/A-/I- lines
        kind, idx, rest = m.group(1), int(m.group(2)), m.group(3)
        ex = examples.setdefault(idx, GeneratedExample(idx))
        if kind == "S":
            ex.source = rest
        elif kind == "T":
            ex.target = rest
        else:
            score_str, _, text = rest.partition("\t")
            try:
                score = float(score_str)
            except ValueError:
                raise DataError(f"{path}:{lineno}: {kind}-{idx} line has no score before its text") from None
            if kind == "H" and ex.hypothesis is None:
                ex.hypothesis, ex.score = text, score
            elif kind == "D" and ex.detokenized is None:
                ex.detokenized, ex.score = text, score
    if not any(ex.best_hypothesis is not None for ex in examples.values()):
        raise DataError(f"{path}: no H-/D- lines found; is this fairseq-generate output (without --quiet)?")
    return examples


def hypotheses_and_references(
    examples: Dict[int, GeneratedExample], references: Optional[List[str]] = None, path: str = "<generate output>"
) -> Tuple[List[int], List[str], List[str]]:
    """``(ids, hypotheses, references)`` sorted by id.

    References come from the T- lines, or from ``references[id]`` when given (the raw target
    file: T- lines are rebuilt from the binarized target, so unknown words show as ``<<unk>>``).
    """
    ids = sorted(examples)
    hyps = {i: h for i in ids if (h := examples[i].best_hypothesis) is not None}
    no_hyp = [i for i in ids if i not in hyps]
    if no_hyp:
        raise DataError(f"{path}: ids {_short(no_hyp)} have S-/T- lines but no H-/D- line")
    if references is None:
        targets = {i: t for i in ids if (t := examples[i].target) is not None}
        no_ref = [i for i in ids if i not in targets]
        if no_ref:
            raise DataError(f"{path}: ids {_short(no_ref)} have no T- line; pass the reference file instead")
        refs = [targets[i] for i in ids]
    else:
        too_big = [i for i in ids if i >= len(references)]
        if too_big:
            raise DataError(f"{path}: ids {_short(too_big)} exceed the {len(references)} lines of the reference file")
        refs = [references[i] for i in ids]
    return ids, [hyps[i] for i in ids], refs


def _short(ids: List[int], k: int = 10) -> str:
    return ", ".join(map(str, ids[:k])) + (f" ... ({len(ids)} in all)" if len(ids) > k else "")
