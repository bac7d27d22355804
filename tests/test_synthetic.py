"""The synthetic long-range set: determinism, lengths, key placement, summary = f(keys)."""

import json
import os
import subprocess
import sys
from collections import Counter

import pytest

from lsg_text.synthetic import (
    ANIMALS,
    CITIES,
    COLOURS,
    KEY_TOKENS,
    WEEKDAYS,
    SyntheticConfig,
    find_key_sentences,
    make_split,
    summary_from_facts,
)

from conftest import load_script

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(REPO_ROOT, "scripts", "make_synthetic_data.py")


def load_main():
    return load_script("scripts/make_synthetic_data.py", "script_make_synthetic_data").main


@pytest.fixture(scope="module")
def train_examples():
    return list(make_split("train", 60, seed=1, cfg=SyntheticConfig()))


def test_script_is_deterministic(tmp_path):
    args = ["--train", "3", "--valid", "2", "--test", "1", "--min-tokens", "300", "--max-tokens", "600"]
    subprocess.run(
        [sys.executable, SCRIPT, "--output-dir", str(tmp_path / "a"), *args], check=True, capture_output=True
    )
    assert load_main()(["--output-dir", str(tmp_path / "b"), *args]) == 0
    assert load_main()(["--output-dir", str(tmp_path / "c"), *args, "--seed", "2"]) == 0
    for split, n in (("train", 3), ("valid", 2), ("test", 1)):
        a = (tmp_path / "a" / f"{split}.jsonl").read_bytes()
        assert a == (tmp_path / "b" / f"{split}.jsonl").read_bytes()  # same seed: same bytes
        assert a != (tmp_path / "c" / f"{split}.jsonl").read_bytes()  # other seed: other data
        assert len(a.decode().splitlines()) == n
    # Splits differ from each other even with one seed.
    first = lambda split: json.loads((tmp_path / "a" / f"{split}.jsonl").read_text().splitlines()[0])["document"]  # noqa: E731
    assert first("train") != first("valid") != first("test")


def test_lengths_and_format(train_examples):
    cfg = SyntheticConfig()
    for ex in train_examples:
        assert set(ex) == {"id", "document", "summary", "keys"}
        n = len(ex["document"].split())
        assert cfg.min_tokens <= n <= cfg.max_tokens
        assert "\n" in ex["document"]  # one paragraph per line, like shared/data
        assert cfg.min_keys <= len(ex["keys"]) <= cfg.max_keys


def test_summary_is_the_key_sentences_in_document_order(train_examples):
    for ex in train_examples:
        found = find_key_sentences(ex["document"])
        assert [offset for offset, _ in found] == sorted(k["token_offset"] for k in ex["keys"])
        assert ex["summary"] == summary_from_facts([fact for _, fact in found])
        assert len({f["animal"] for _, f in found}) == len(found)  # unambiguous keys


def test_key_words_occur_only_in_key_sentences(train_examples):
    key_words = set(COLOURS) | set(ANIMALS) | set(CITIES) | {w + "." for w in WEEKDAYS} | {"visited"}
    for ex in train_examples:
        tokens = ex["document"].split()
        inside = set()
        for offset, _ in find_key_sentences(ex["document"]):
            inside.update(range(offset, offset + KEY_TOKENS))
        assert not [t for i, t in enumerate(tokens) if i not in inside and t in key_words]


def test_keys_are_long_range(train_examples):
    """A reader of the first 1024 tokens misses most keys: the task needs a long-input encoder."""
    offsets = [k["token_offset"] for ex in train_examples for k in ex["keys"]]
    beyond = sum(o >= 1024 for o in offsets) / len(offsets)
    assert beyond > 0.6  # expected about 0.75 for 2K-8K documents with uniform placement
    # Documents a 1K-prefix model could summarize completely: few.
    solvable = sum(all(k["token_offset"] + KEY_TOKENS <= 1024 for k in ex["keys"]) for ex in train_examples)
    assert solvable / len(train_examples) < 0.15
    # Placement is spread over the whole document, not clustered at one end.
    rel = [k["token_offset"] / len(ex["document"].split()) for ex in train_examples for k in ex["keys"]]
    assert min(rel) < 0.2 and max(rel) > 0.8 and 0.35 < sum(rel) / len(rel) < 0.65


def test_small_vocabulary(train_examples):
    types = Counter(t for ex in train_examples for t in (ex["document"] + " " + ex["summary"]).split())
    assert len(types) < 400


def test_bad_sizes_are_rejected(tmp_path, capsys):
    assert load_main()(["--output-dir", str(tmp_path / "o"), "--min-tokens", "500", "--max-tokens", "400"]) == 2
    assert "--max-tokens" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize(
    "keys,decoys,even,gap", [(1, 4, True, 0), (3, 1, False, 0), (2, 3, False, 50), (1, 2, True, 300)]
)
def test_binding_sizes_that_validate_generate(keys, decoys, even, gap):
    # validate() is the only guard before make_binding_example draws positions: a size it lets through
    # must never end in randint's "empty range" (1 key, 4 even decoy names at 120 words once did)
    import random

    from lsg_text.synthetic import make_binding_example

    def config(min_tokens):
        return SyntheticConfig(
            min_tokens=min_tokens,
            max_tokens=min_tokens + 20,
            min_keys=1,
            max_keys=keys,
            variant="binding",
            min_gap=gap,
            decoy_names=decoys,
            even_mentions=even,
        )

    lowest = next(n for n in range(20, 2000) if _valid(config(n)))
    assert not _valid(config(lowest - 1))
    for seed in range(400):  # at the lowest size that validates, where the filler's shortfall bites
        ex = make_binding_example(random.Random(seed), config(lowest), f"x{seed}", "train")
        assert all(k["token_offset"] - k["bind_offset"] >= gap for k in ex["keys"])


def _valid(cfg):
    try:
        cfg.validate()
    except ValueError:
        return False
    return True


def test_existing_set_is_replaced_only_with_force(tmp_path, capsys):
    """A re-run replaced {train,valid,test}.jsonl without asking (--output-dir data/ would lose a real set)."""
    out = tmp_path / "set"
    out.mkdir()
    (out / "valid.jsonl").write_text("the user's own data\n")
    args = ["--output-dir", str(out), "--train", "2", "--valid", "1", "--test", "1", "--min-tokens", "200"]
    args += ["--max-tokens", "300"]
    assert load_main()(args) == 2
    err = capsys.readouterr().err.strip()
    assert err.splitlines() == [err] and err.startswith(f"make_synthetic_data.py: error: {out / 'valid.jsonl'}: exists")
    assert "--force" in err and sorted(os.listdir(out)) == ["valid.jsonl"]
    assert (out / "valid.jsonl").read_text() == "the user's own data\n"
    assert load_main()(args + ["--force"]) == 0
    assert sorted(os.listdir(out)) == ["test.jsonl", "train.jsonl", "valid.jsonl"]
    assert len((out / "valid.jsonl").read_text().splitlines()) == 1 and "user" not in (out / "valid.jsonl").read_text()


def test_every_split_zero_is_refused(tmp_path, capsys):
    """--train 0 --valid 0 --test 0 printed "wrote  to OUT" and exited 0 with nothing written."""
    out = tmp_path / "set"
    assert load_main()(["--output-dir", str(out), "--train", "0", "--valid", "0", "--test", "0"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (
        "make_synthetic_data.py: error: --train, --valid and --test are all 0: nothing to write (give one of them "
        "1 or more)"
    )
    assert not out.exists()
