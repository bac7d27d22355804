"""Shared fixtures: paths to ../shared, and a tiny word-level binarized summarization set."""
import json
import os
import subprocess
import sys

import pytest

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHARED = os.path.join(REPO_ROOT, "..", "shared")
SHARED_DATA = os.path.join(SHARED, "data")
FIXTURES = os.path.join(SHARED, "fixtures")
BIN = os.path.dirname(sys.executable)


def fairseq_cli(name: str) -> str:
    """Path of a fairseq console script of the running interpreter's environment."""
    return os.path.join(BIN, name)


def read_jsonl(path, limit=None):
    out = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            out.append(json.loads(line))
            if limit is not None and len(out) >= limit:
                break
    return out


def write_word_split(dest, split, examples):
    """One example per line, lower-cased whitespace words (no BPE needed)."""
    for side, key in (("source", "document"), ("target", "summary")):
        with open(os.path.join(dest, f"{split}.{side}"), "w", encoding="utf-8") as f:
            for ex in examples:
                f.write(" ".join(ex[key].lower().split()) + "\n")


@pytest.fixture(scope="session")
def word_data(tmp_path_factory):
    """SumPubMed (12 train / 4 valid documents), word-level, binarized with a joined dictionary."""
    root = tmp_path_factory.mktemp("word_data")
    raw, binarized = root / "raw", root / "bin"
    raw.mkdir()
    src = os.path.join(SHARED_DATA, "sumpubmed")
    write_word_split(raw, "train", read_jsonl(os.path.join(src, "train.jsonl"), 12))
    write_word_split(raw, "valid", read_jsonl(os.path.join(src, "valid.jsonl"), 4))
    subprocess.run(
        [fairseq_cli("fairseq-preprocess"), "--source-lang", "source", "--target-lang", "target",
         "--trainpref", str(raw / "train"), "--validpref", str(raw / "valid"),
         "--destdir", str(binarized), "--joined-dictionary", "--nwordssrc", "2000", "--workers", "1"],
        check=True, capture_output=True,
    )
    return binarized
