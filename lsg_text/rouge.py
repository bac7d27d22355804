"""ROUGE as reported in the LSG/LOCOST papers: rouge-score F1, Porter stemming, Lsum on sentences.

ROUGE-Lsum treats newlines as sentence boundaries, so both hypothesis and reference are
sentence-split (:func:`split_sentences`) and joined with newlines first. Everything returned is
a plain Python float (numpy scalars in fairseq meters end up in checkpoints and break
``weights_only`` loading, fairseq#5603).
"""

from typing import Dict, Iterable, List

from lsg_text.sentences import split_sentences

ROUGE_KEYS = ("rouge1", "rouge2", "rougeL", "rougeLsum")

_scorer = None


def _get_scorer():
    global _scorer
    if _scorer is None:
        from rouge_score import rouge_scorer

        _scorer = rouge_scorer.RougeScorer(list(ROUGE_KEYS), use_stemmer=True)
    return _scorer


def _lsum_text(text: str) -> str:
    return "\n".join(split_sentences(text))


def rouge_example(hypothesis: str, reference: str) -> Dict[str, float]:
    """F1 of each ROUGE key for one pair, in [0, 1]."""
    scores = _get_scorer().score(_lsum_text(reference), _lsum_text(hypothesis))
    return {k: float(scores[k].fmeasure) for k in ROUGE_KEYS}


def rouge_corpus(hypotheses: Iterable[str], references: Iterable[str]) -> Dict[str, float]:
    """Mean F1 over pairs (x100, the papers' scale) plus the pair count ``n``."""
    hyps: List[str] = list(hypotheses)
    refs: List[str] = list(references)
    if len(hyps) != len(refs):
        raise ValueError(f"{len(hyps)} hypotheses but {len(refs)} references: counts must match")
    totals = {k: 0.0 for k in ROUGE_KEYS}
    for h, r in zip(hyps, refs):
        for k, v in rouge_example(h, r).items():
            totals[k] += v
    n = len(hyps)
    out = {k: (100.0 * totals[k] / n if n else 0.0) for k in ROUGE_KEYS}
    out["n"] = n
    return out
