"""Gap-sentence selection and masking (lsg_text/gsg.py) against slow references."""

import itertools
import random

import numpy as np
import pytest
from rouge_score import rouge_scorer, tokenize

from lsg_text import gsg
from lsg_text.gsg import KEEP, MASK, RANDOM, REMOVE

SCORER = rouge_scorer.RougeScorer(["rouge1"], use_stemmer=False)
WORDS = "the cat sat on a mat dog ran far away The Cat, sat! under 42 ate fish".split()


def random_document(rng: random.Random, n_sentences: int):
    sentences = []
    for _ in range(n_sentences):
        # Empty sentences ("***" has no rouge word) and repeats exercise the edge cases.
        k = rng.choice([0, 1, 2, 3, 5, 8])
        sentences.append(" ".join(rng.choice(WORDS) for _ in range(k)) or "***")
    return sentences


def word_ids(sentences):
    vocab = {}
    return [[vocab.setdefault(w, len(vocab)) for w in gsg.rouge_tokenize(s)] for s in sentences]


def brute_force_scores(sentences):
    """Ind-Orig exactly as described: rouge-score ROUGE-1 F1 of s_i vs. the document without s_i."""
    out = []
    for i, s in enumerate(sentences):
        rest = " ".join(sentences[:i] + sentences[i + 1 :])
        out.append(SCORER.score(rest, s)["rouge1"].fmeasure)
    return out


def brute_force_seq(sentences, m):
    """Seq-Orig by brute force: rescore every candidate set with rouge-score at each step."""
    selected = []
    for _ in range(m):
        best, best_score = None, -1.0
        for i in range(len(sentences)):
            if i in selected:
                continue
            chosen = sorted(selected + [i])
            sel = " ".join(sentences[j] for j in chosen)
            rest = " ".join(sentences[j] for j in range(len(sentences)) if j not in chosen)
            score = SCORER.score(rest, sel)["rouge1"].fmeasure
            if score > best_score:  # strict: ties keep the earlier sentence
                best, best_score = i, score
        selected.append(best)
    return sorted(selected)


def test_tokenizer_matches_rouge_score():
    for text in ["Hello, World! It's 3.5 o'clock", "naïve café — déjà vu", "  A\tB\nc  ", ""]:
        assert gsg.rouge_tokenize(text) == tokenize.tokenize(text, None)


@pytest.mark.parametrize("seed", range(30))
def test_ind_orig_scores_equal_rouge_score(seed):
    rng = random.Random(seed)
    sentences = random_document(rng, rng.randint(1, 9))
    ours = gsg.ind_orig_scores(word_ids(sentences))
    ref = brute_force_scores(sentences)
    # Same integer counts, same formula: equal to the last bit, not just close.
    assert ours.tolist() == ref


@pytest.mark.parametrize("seed", range(30))
def test_ind_orig_selection_equals_brute_force(seed):
    rng = random.Random(1000 + seed)
    sentences = random_document(rng, rng.randint(1, 12))
    ratio = rng.choice([0.1, 0.2, 0.3, 0.5, 0.99])
    m = gsg.num_gap_sentences(len(sentences), ratio)
    ref_scores = brute_force_scores(sentences)
    # Brute force over every m-subset: the chosen set maximises the summed rank order, i.e. it is
    # the lexicographically best set when sentences are ordered by (-score, index).
    key = lambda subset: sorted((-ref_scores[i], i) for i in subset)  # noqa: E731
    best = min(itertools.combinations(range(len(sentences)), m), key=key)
    assert gsg.select_gap_sentences(word_ids(sentences), ratio) == list(best)


@pytest.mark.parametrize("seed", range(20))
def test_seq_selection_equals_brute_force(seed):
    rng = random.Random(2000 + seed)
    sentences = random_document(rng, rng.randint(1, 9))
    m = gsg.num_gap_sentences(len(sentences), 0.4)
    assert gsg.select_seq(word_ids(sentences), m) == brute_force_seq(sentences, m)


def test_ties_prefer_earlier_sentences():
    # Four identical sentences: identical scores, so the first m win.
    sentences = ["a b c"] * 4 + ["x y z"]
    assert gsg.select_gap_sentences(word_ids(sentences), 0.4) == [0, 1]


@pytest.mark.parametrize(
    "n,ratio,expected",
    [
        (1, 0.2, 1),
        (4, 0.2, 1),
        (5, 0.2, 1),
        (10, 0.2, 2),
        (10, 0.3, 3),
        (7, 0.5, 3),
        (3, 1.0, 3),
        (3, 0.0, 1),
        (0, 0.2, 0),
    ],
)
def test_ratio_and_minimum(n, ratio, expected):
    assert gsg.num_gap_sentences(n, ratio) == expected
    sentences = [[i, 100 + i] for i in range(n)]
    rng = np.random.default_rng(0)
    for strategy in gsg.SELECTION_STRATEGIES:
        chosen = gsg.select_gap_sentences(sentences, ratio, strategy, rng=rng)
        assert len(chosen) == expected and chosen == sorted(set(chosen))


def test_lead_and_random_selection():
    sentences = [[i] for i in range(20)]
    assert gsg.select_gap_sentences(sentences, 0.2, "lead") == [0, 1, 2, 3]
    draws = {tuple(gsg.select_gap_sentences(sentences, 0.2, "random", rng=np.random.default_rng(s))) for s in range(10)}
    assert len(draws) > 1  # actually random
    with pytest.raises(ValueError, match="needs an rng"):
        gsg.select_gap_sentences(sentences, 0.2, "random")


def test_score_noise_changes_selection_but_zero_noise_does_not():
    rng = random.Random(7)
    sentences = random_document(rng, 40)
    ids = word_ids(sentences)
    clean = gsg.select_gap_sentences(ids, 0.2)
    assert gsg.select_gap_sentences(ids, 0.2, score_noise=0.0, rng=np.random.default_rng(1)) == clean
    noisy = {
        tuple(gsg.select_gap_sentences(ids, 0.2, score_noise=0.5, rng=np.random.default_rng(s))) for s in range(10)
    }
    assert any(sel != tuple(clean) for sel in noisy)
    with pytest.raises(ValueError, match="ind_orig selection only"):
        gsg.select_gap_sentences(ids, 0.2, "seq", score_noise=0.1, rng=np.random.default_rng(0))


def _doc(n):
    # Sentence i has model tokens [10*i+1, 10*i+2] and word ids that make sentence 1 and 3 the
    # most repeated, hence the Ind-Orig choice.
    tokens = [[10 * i + 1, 10 * i + 2] for i in range(n)]
    words = [[i, 99, 98] if i in (1, 3) else [i] for i in range(n)]
    return words, tokens


@pytest.mark.parametrize(
    "probs,action", [((1, 0, 0, 0), MASK), ((0, 1, 0, 0), REMOVE), ((0, 0, 1, 0), KEEP), ((0, 0, 0, 1), RANDOM)]
)
def test_mask_options(probs, action):
    words, tokens = _doc(10)
    ex = gsg.gsg_example(words, tokens, ratio=0.2, mask_token=7, mask_probs=probs, rng=np.random.default_rng(0))
    assert ex["selected"] == [1, 3] and ex["actions"] == [action, action]
    assert ex["target"] == [11, 12, 31, 32]  # document order
    unselected = [t for i in range(10) if i not in (1, 3) for t in tokens[i]]
    src = ex["source"]
    if action == MASK:
        expected = tokens[0] + [7] + tokens[2] + [7] + [t for i in range(4, 10) for t in tokens[i]]
        assert src == expected
    elif action == REMOVE:
        assert src == unselected
    elif action == KEEP:
        assert src == [t for s in tokens for t in s]
    else:
        assert len(src) == 20 and 7 not in src
        # Positions of sentences 1 and 3 hold some *other* sentence of the document.
        for i in (1, 3):
            replacement = src[2 * i : 2 * i + 2]
            assert replacement in tokens and replacement != tokens[i]


def test_mask_option_frequencies():
    probs = (0.5, 0.2, 0.2, 0.1)
    actions = gsg.draw_mask_actions(20000, probs, np.random.default_rng(0))
    freq = np.bincount(actions, minlength=4) / len(actions)
    assert np.allclose(freq, probs, atol=0.015)


@pytest.mark.parametrize("bad", [(0.5, 0.5, 0.5, 0), (1.2, -0.2, 0, 0), (1, 0, 0)])
def test_bad_mask_probs_rejected(bad):
    with pytest.raises(ValueError, match="mask-action probabilities"):
        gsg.validate_mask_probs(bad)


def test_random_replacement_in_one_sentence_document_falls_back_to_mask():
    ex = gsg.gsg_example(
        [[1]], [[5, 6]], ratio=0.2, mask_token=7, mask_probs=(0, 0, 0, 1), rng=np.random.default_rng(0)
    )
    assert ex["source"] == [7] and ex["target"] == [5, 6]


def test_random_replacement_needs_an_rng():
    """A deterministic RANDOM action draws no action, but the replacement sentence needs the rng."""
    with pytest.raises(ValueError, match="RANDOM mask action needs an rng"):
        gsg.gsg_example([[1], [2]], [[5], [6]], ratio=0.5, mask_token=7, mask_probs=(0, 0, 0, 1))


def test_stochastic_ratio_range():
    words = [[i] for i in range(100)]
    tokens = [[i] for i in range(100)]
    counts = [
        len(
            gsg.gsg_example(words, tokens, ratio=0.15, ratio_max=0.45, mask_token=0, rng=np.random.default_rng(s))[
                "selected"
            ]
        )
        for s in range(50)
    ]
    assert min(counts) >= 15 and max(counts) <= 45 and len(set(counts)) > 5


def test_determinism_per_seed():
    rng = random.Random(3)
    sentences = random_document(rng, 50)
    ids = word_ids(sentences)
    tokens = [[hash(s) % 1000, i] for i, s in enumerate(sentences)]
    kwargs = dict(ratio=0.2, ratio_max=0.4, score_noise=0.3, mask_token=1, mask_probs=(0.4, 0.3, 0.2, 0.1))
    a = gsg.gsg_example(ids, tokens, rng=np.random.default_rng([5, 1]), **kwargs)
    b = gsg.gsg_example(ids, tokens, rng=np.random.default_rng([5, 1]), **kwargs)
    c = gsg.gsg_example(ids, tokens, rng=np.random.default_rng([5, 2]), **kwargs)
    assert a == b
    assert a != c
