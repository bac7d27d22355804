"""Gap-sentence generation (GSG): sentence selection and masking, the PEGASUS pretraining objective.

Glossary (Zhang et al., "PEGASUS", ICML 2020, §3.1; google-research/pegasus
``ops/sentence_selection.cc`` and ``pretrain_parsing_ops.cc``):

- ``n``: sentences in the document, ``m``: sentences selected ("gap sentences"),
  ``ratio``: the gap-sentence ratio (GSR), ``m = min(max(floor(n * ratio), 1), n)``.
- ``ind_orig`` ("Ind-Orig", PEGASUS ``rouge``): every sentence scored independently by ROUGE-1 F1
  against the rest of the document; the ``m`` best are taken.
- ``seq`` ("Seq-Orig", ``greedy_rouge``): greedily add the sentence that most increases ROUGE-1 F1
  between the selected set and the rest of the document.
- ``random`` / ``lead``: ``m`` random sentences / the first ``m``.
- ``score_noise`` (sigma): scores become ``score * (1 + sigma * N(0, 1))`` (PEGASUS ``dynamic_rouge``).
- Mask actions, drawn independently per selected sentence: ``MASK`` (one mask-sentence token),
  ``REMOVE`` (LOCOST's pseudo-source), ``KEEP`` (left intact) or ``RANDOM`` (replaced by another
  sentence of the same document).

Everything works on *word ids*: any hashable token per word, in practice the integer ids of
:func:`rouge_tokenize` words, so that ROUGE-1 here is the ``rouge-score`` package's ROUGE-1 (no
stemming) computed with counts instead of one scorer call per sentence pair (a book-length
document has thousands of pairs). ``tests/test_gsg.py`` checks it against ``rouge-score``.
No torch, no fairseq: numpy only.
"""

import math
import re
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

SELECTION_STRATEGIES = ("ind_orig", "seq", "random", "lead")

# Mask actions, in the order of the probabilities given to :func:`draw_mask_actions`.
MASK, REMOVE, KEEP, RANDOM = 0, 1, 2, 3

# rouge-score's DefaultTokenizer (tokenize.py): lower-case, every run of characters other than
# [a-z0-9] is a separator. Non-ASCII letters are separators too; that is what the package does.
_NON_ALPHANUM = re.compile(r"[^a-z0-9]+")


def rouge_tokenize(text: str) -> List[str]:
    """Words as ``rouge_score.tokenize`` yields them with ``use_stemmer=False``."""
    return _NON_ALPHANUM.sub(" ", text.lower()).split()


def num_gap_sentences(n: int, ratio: float) -> int:
    """``m = min(max(floor(n * ratio), 1), n)``: at least one gap sentence, never more than ``n``."""
    if n <= 0:
        return 0
    # The epsilon keeps floor(10 * 0.3) == 3 despite 10 * 0.3 == 2.9999999999999996.
    return min(max(int(math.floor(n * ratio + 1e-9)), 1), n)


class _DocumentCounts:
    """Per-sentence unigram counts of a document in a compact, vectorised form.

    ``pair_sent``/``pair_word``/``pair_count``: one row per distinct (sentence, word) pair.
    ``total``: count of each (document-local) word in the whole document; ``sent_len``: words per
    sentence.
    """

    def __init__(self, sentences_words: Sequence[Sequence[int]]):
        lengths = np.fromiter((len(s) for s in sentences_words), dtype=np.int64, count=len(sentences_words))
        self.n = len(lengths)
        self.sent_len = lengths
        self.doc_len = int(lengths.sum())
        if self.doc_len == 0:
            self.pair_sent = self.pair_word = self.pair_count = np.zeros(0, dtype=np.int64)
            self.total = np.zeros(0, dtype=np.int64)
            return
        flat = np.concatenate([np.asarray(s, dtype=np.int64).reshape(-1) for s in sentences_words])
        _, local = np.unique(flat, return_inverse=True)  # word ids -> 0..V-1 (document-local)
        vocab = int(local.max()) + 1
        sent_of_token = np.repeat(np.arange(self.n, dtype=np.int64), lengths)
        keys, counts = np.unique(sent_of_token * vocab + local, return_counts=True)
        self.pair_sent = keys // vocab
        self.pair_word = keys % vocab
        self.pair_count = counts
        self.total = np.bincount(local, minlength=vocab)


def _f1_vector(overlap: np.ndarray, len_a: np.ndarray, len_b: np.ndarray) -> np.ndarray:
    """ROUGE-1 F1 from clipped unigram overlaps and the two lengths, in ``rouge-score``'s order of
    operations (precision and recall divide by ``max(len, 1)``; F1 is 0 when both are 0), so the
    floats are bit-identical to the package's."""
    precision = overlap / np.maximum(len_a, 1)
    recall = overlap / np.maximum(len_b, 1)
    denom = precision + recall
    return np.where(denom > 0, 2 * precision * recall / np.where(denom > 0, denom, 1), 0.0)


def ind_orig_scores(sentences_words: Sequence[Sequence[int]]) -> np.ndarray:
    """ROUGE-1 F1 of each sentence against the rest of the document (the document without it)."""
    d = _DocumentCounts(sentences_words)
    if d.n == 0:
        return np.zeros(0)
    # A word occurring c times in the sentence and T times in the document occurs T - c times in
    # the rest: the clipped overlap is min(c, T - c).
    rest_count = d.total[d.pair_word] - d.pair_count
    overlap = np.bincount(d.pair_sent, weights=np.minimum(d.pair_count, rest_count), minlength=d.n)
    return _f1_vector(overlap, d.sent_len, d.doc_len - d.sent_len)


def top_m(scores: Sequence[float], m: int) -> List[int]:
    """Indices of the ``m`` highest scores (ties: earlier sentence first), in document order."""
    order = sorted(range(len(scores)), key=lambda i: (-scores[i], i))
    return sorted(order[:m])


def select_seq(sentences_words: Sequence[Sequence[int]], m: int) -> List[int]:
    """Seq-Orig: greedily add the sentence maximising ROUGE-1 F1(selected, rest of the document).

    The overlap is updated incrementally: adding sentence i changes, for each word w of i, the
    clipped count from min(a_w, T_w - a_w) to min(a_w + c_iw, T_w - a_w - c_iw), where a is the
    selected set's count. Ties go to the earlier sentence.
    """
    d = _DocumentCounts(sentences_words)
    selected: List[int] = []
    if d.n == 0 or m <= 0:
        return selected
    sel_count = np.zeros_like(d.total)  # a_w
    sel_overlap, sel_len = 0.0, 0
    available = np.ones(d.n, dtype=bool)
    for _ in range(min(m, d.n)):
        a = sel_count[d.pair_word]
        t = d.total[d.pair_word]
        gain = np.minimum(a + d.pair_count, t - a - d.pair_count) - np.minimum(a, t - a)
        overlap = sel_overlap + np.bincount(d.pair_sent, weights=gain, minlength=d.n)
        len_sel = sel_len + d.sent_len
        f1 = _f1_vector(overlap, len_sel, d.doc_len - len_sel)
        f1[~available] = -np.inf
        best = int(np.argmax(f1))  # argmax returns the first maximum: earlier sentence wins
        selected.append(best)
        available[best] = False
        rows = d.pair_sent == best
        sel_count[d.pair_word[rows]] += d.pair_count[rows]
        sel_overlap, sel_len = float(overlap[best]), int(len_sel[best])
    return sorted(selected)


def select_gap_sentences(
    sentences_words: Sequence[Sequence[int]],
    ratio: float,
    strategy: str = "ind_orig",
    score_noise: float = 0.0,
    rng: Optional[np.random.Generator] = None,
) -> List[int]:
    """Indices (document order) of the gap sentences of one document."""
    if strategy not in SELECTION_STRATEGIES:
        raise ValueError(f"unknown GSG selection {strategy!r}; choose from {SELECTION_STRATEGIES}")
    if score_noise < 0:
        raise ValueError(f"score noise must be >= 0, got {score_noise}")
    if score_noise > 0 and strategy != "ind_orig":
        raise ValueError(
            f"score noise is defined for ind_orig selection only (PEGASUS dynamic_rouge), not {strategy!r}"
        )
    if (strategy == "random" or score_noise > 0) and rng is None:
        raise ValueError(f"GSG selection {strategy!r} with score_noise={score_noise} needs an rng")
    n = len(sentences_words)
    m = num_gap_sentences(n, ratio)
    if strategy == "lead":
        return list(range(m))
    if strategy == "random":
        assert rng is not None  # refused above
        return sorted(rng.choice(n, size=m, replace=False).tolist()) if m else []
    if strategy == "seq":
        return select_seq(sentences_words, m)
    scores = ind_orig_scores(sentences_words)
    if score_noise > 0:
        assert rng is not None  # refused above
        scores = scores * (1.0 + score_noise * rng.standard_normal(n))
    return top_m(scores.tolist(), m)


def validate_mask_probs(probs: Sequence[float]) -> Tuple[float, float, float, float]:
    if len(probs) != 4:
        raise ValueError(f"need 4 mask-action probabilities (mask, remove, keep, random), got {probs}")
    if any(not 0 <= p <= 1 for p in probs):  # NaN too: it fails every comparison
        raise ValueError(f"mask-action probabilities must be in [0, 1], got {list(probs)}")
    if abs(sum(probs) - 1.0) > 1e-6:
        raise ValueError(
            f"mask-action probabilities (mask, remove, keep, random) must sum to 1, got "
            f"{list(probs)} (sum {sum(probs)})"
        )
    return float(probs[0]), float(probs[1]), float(probs[2]), float(probs[3])


def draw_mask_actions(m: int, probs: Sequence[float], rng: Optional[np.random.Generator]) -> List[int]:
    """One action (MASK/REMOVE/KEEP/RANDOM) per gap sentence, drawn independently."""
    probs = validate_mask_probs(probs)
    for action, p in enumerate(probs):
        if p == 1.0:  # deterministic: no rng needed, no random numbers consumed
            return [action] * m
    if rng is None:
        raise ValueError("stochastic mask-action probabilities need an rng")
    return rng.choice(4, size=m, p=np.asarray(probs) / sum(probs)).tolist()


def build_source_target(
    sentences_tokens: Sequence[Sequence[int]],
    selected: Sequence[int],
    actions: Sequence[int],
    mask_token: int,
    rng: Optional[np.random.Generator] = None,
) -> Tuple[List[int], List[int]]:
    """Source and target token lists (no BOS/EOS) from the model-vocabulary tokens of each sentence.

    Target = the selected sentences in document order. Source = the document where selected
    sentence ``selected[k]`` gets ``actions[k]``. RANDOM replaces with a uniformly drawn *other*
    sentence; a one-sentence document has none, so RANDOM falls back to MASK there.
    """
    if len(actions) != len(selected):
        raise ValueError(f"{len(actions)} mask actions for {len(selected)} selected sentences")
    n = len(sentences_tokens)
    action_of = dict(zip(selected, actions))
    # Pieces are concatenated once at the end: sentences may be numpy views of a memory map.
    source: List[Sequence[int]] = []
    for i, tokens in enumerate(sentences_tokens):
        action = action_of.get(i)
        if action is None or action == KEEP:
            source.append(tokens)
        elif action == MASK or (action == RANDOM and n < 2):
            source.append([mask_token])
        elif action == RANDOM:
            if rng is None:
                raise ValueError("the RANDOM mask action needs an rng")
            j = int(rng.integers(n - 1))
            source.append(sentences_tokens[j + (j >= i)])  # skip i itself
        elif action != REMOVE:
            raise ValueError(f"unknown mask action {action}")
    target = [sentences_tokens[i] for i in selected]
    return _flatten(source), _flatten(target)


def _flatten(pieces: Sequence[Sequence[int]]) -> List[int]:
    if not pieces:
        return []
    return np.concatenate([np.asarray(p, dtype=np.int64) for p in pieces]).tolist()


def gsg_example(
    sentences_words: Sequence[Sequence[int]],
    sentences_tokens: Sequence[Sequence[int]],
    *,
    ratio: float,
    mask_token: int,
    mask_probs: Sequence[float] = (1.0, 0.0, 0.0, 0.0),
    strategy: str = "ind_orig",
    score_noise: float = 0.0,
    ratio_max: Optional[float] = None,
    rng: Optional[np.random.Generator] = None,
) -> Dict[str, object]:
    """One GSG example from a document given as per-sentence word ids (for ROUGE) and model tokens.

    ``ratio_max`` turns the ratio stochastic: ``U(ratio, ratio_max)`` per document (PEGASUS
    Large used U(0.15, 0.45)). Returns ``source``/``target`` token lists, the ``selected`` indices
    and their ``actions``.
    """
    if len(sentences_words) != len(sentences_tokens):
        raise ValueError(f"{len(sentences_words)} word-id sentences but {len(sentences_tokens)} token sentences")
    if ratio_max is not None:
        if rng is None:
            raise ValueError("a stochastic ratio (ratio_max) needs an rng")
        ratio = float(rng.uniform(ratio, ratio_max))
    selected = select_gap_sentences(sentences_words, ratio, strategy, score_noise, rng)
    actions = draw_mask_actions(len(selected), mask_probs, rng)
    source, target = build_source_target(sentences_tokens, selected, actions, mask_token, rng)
    return {"source": source, "target": target, "selected": selected, "actions": actions}
