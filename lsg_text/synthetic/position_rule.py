"""The ``order`` variant's no-model reference: each arrival ranked by its own word offset alone.

An ``order`` summary names the arriving animals in order of arrival. A reader that knows only
*roughly where* each arrival lies (not which came before which) can still get many documents right,
since arrivals are spread through the document: the i-th arrival tends to lie in the i-th part. This
rule is that reader, fitted: per number of arrivals n, the n - 1 word offsets t_1 < ... < t_(n-1)
that cut a document into n bands so that the most training documents have their i-th arrival in
band i. A model row of ``examples/long_range`` that scores no higher than this rule cannot be told
from a reader of positions (``examples/long_range/report.py``'s ``position_only`` row).
"""

import bisect
from typing import Dict, List, Tuple

from lsg_text.errors import ConfigError


def band(position: int, thresholds) -> int:
    """The rank (0 = first) that the position-only rule gives an arrival at ``position``."""
    return bisect.bisect_right(thresholds, position)


def _fit_level(docs, i: int) -> Tuple[int, List[int]]:
    """(documents right, thresholds t_i..t_last) for the arrivals i-1, i, ... of ``docs`` (position
    tuples, all of one length, each already right before arrival i): t_i must lie in
    (docs[i-1], docs[i]] for a document to stay right. Exact search: a candidate t_i is one of the
    docs[i] (moving t_i up to the next of them loses no document), and candidates are tried in order of
    how many documents they keep, so that a branch that cannot beat the best found is skipped."""
    lows = sorted(d[i - 1] for d in docs)
    highs = sorted(d[i] for d in docs)
    # kept(t) = #{d: d[i-1] < t <= d[i]} = #{d[i] >= t} - #{d[i-1] >= t}, since d[i-1] < d[i]
    kept = {t: (len(highs) - bisect.bisect_left(highs, t)) - (len(lows) - bisect.bisect_left(lows, t)) for t in highs}
    best: Tuple[int, List[int]] = (0, [])
    for t in sorted(kept, key=lambda t: (-kept[t], t)):
        if kept[t] <= best[0]:
            break
        sub = [d for d in docs if d[i - 1] < t <= d[i]]
        right, rest = (len(sub), []) if i == len(docs[0]) - 1 else _fit_level(sub, i + 1)
        if right > best[0]:
            best = (right, [t] + rest)
    return best


def fit_position_rule(examples) -> dict:
    """The position-only rule of the ``order`` variant, fitted: per number of arrivals n, the n - 1
    word offsets t_1 < ... < t_(n-1) that cut a document into n bands such that the most ``examples``
    have their i-th arrival in band i (an arrival before t_1 is called first, one at or past t_(n-1)
    last). Each arrival is ranked by where it lies alone, never against another arrival.
    Returns ``{n: {"thresholds": [...], "train_exact": fraction right, "n_docs": documents}}``."""
    by_n: Dict[int, List[Tuple[int, ...]]] = {}
    for ex in examples:
        by_n.setdefault(len(ex["keys"]), []).append(tuple(k["token_offset"] for k in ex["keys"]))
    rule = {}
    for n, docs in sorted(by_n.items()):
        if n < 2:
            raise ConfigError(f"position-only rule: a document with {n} arrival has no order to rank")
        right, thresholds = _fit_level(docs, 1)
        if not thresholds:  # no threshold puts any document right: the first candidate, for a defined rule
            thresholds = [min(d[i] for d in docs) for i in range(1, n)]
        rule[n] = {"thresholds": thresholds, "train_exact": right / len(docs), "n_docs": len(docs)}
    return rule


def position_rule_scores(examples, rule: dict) -> list:
    """score_document's dicts for the position-only rule: slot i is right when the i-th arrival lies in
    band i. Two arrivals in one band leave the rule without an order between them: those slots count
    as wrong (no coin flip)."""
    scores = []
    for ex in examples:
        n = len(ex["keys"])
        if n not in rule:
            raise ConfigError(
                f"position-only rule: no training document has {n} arrivals "
                f"(fitted for {sorted(rule)}; see --fit-data and --n-train)"
            )
        hits = [band(k["token_offset"], rule[n]["thresholds"]) == i for i, k in enumerate(ex["keys"])]
        scores.append({"exact": float(all(hits)), "slots": hits, "far": hits})
    return scores
