"""The GSG data path end to end: raw text -> scripts/gsg_preprocess.py -> on-the-fly dataset ->
``fairseq-train --task gap_sentence_generation`` (then fine-tuning with the summarization task)."""

import contextlib
import io
import json
import logging
import os
import shutil

import numpy as np
import pytest
import torch
from fairseq.data import Dictionary
from rouge_score import rouge_scorer

import lsg_fairseq  # noqa: F401  (registers the tasks)
from lsg_fairseq.data.gsg_dataset import GapSentenceDataset, GSGCorpus, corpus_prefix
from lsg_fairseq.tasks.gap_sentence_generation import GapSentenceGenerationConfig, validate_gsg_config
from lsg_text import gsg
from lsg_text.documents import chunk_sentences, document_sentences, get_sentence_splitter, read_documents

from conftest import DOCUMENTS, FIXTURES, TINY_DIMS, load_script

GUTENBERG = os.path.join(DOCUMENTS, "gutenberg")
TINY_BART = ["--arch", "bart_base", *TINY_DIMS]


# In-process: a subprocess per call would re-import torch and fairseq (~8 s each here).
GSG_PREPROCESS = load_script("scripts/gsg_preprocess.py", "gsg_preprocess")


def run_script(*args):
    """(exit status, stderr) of scripts/gsg_preprocess.py."""
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        try:
            status = GSG_PREPROCESS.main(list(args))
        except SystemExit as e:  # argparse refusing a flag value
            status = e.code
    return status, err.getvalue()


def fairseq_train(argv):
    """fairseq-train in this process (plugin already imported from the same path: fine)."""
    from fairseq import options
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf
    from fairseq_cli import train

    args = options.parse_args_and_arch(options.get_training_parser(), argv)
    train.main(convert_namespace_to_omegaconf(args))


@pytest.fixture(scope="module")
def corpus_dir(tmp_path_factory):
    """Blake's poems (train) and the start of Macbeth (valid), ~300-word pseudo-documents."""
    out = tmp_path_factory.mktemp("gsg")
    status, err = run_script(
        "--format",
        "file",
        "--chunk-words",
        "300",
        "--max-documents",
        "12",
        "--input",
        f"train={GUTENBERG}/blake-poems.txt",
        "--input",
        f"valid={GUTENBERG}/shakespeare-macbeth.txt",
        "--output-dir",
        str(out),
        "--nwords",
        "1500",
    )
    assert status == 0, err
    return out


def load(corpus_dir, split="train", **overrides):
    d = Dictionary.load(str(corpus_dir / "dict.txt"))
    mask = d.add_symbol("<mask>")
    options = dict(
        ratio=0.2,
        ratio_max=None,
        strategy="ind_orig",
        score_noise=0.0,
        mask_probs=(1, 0, 0, 0),
        seed=1,
        max_source_positions=1024,
        max_target_positions=512,
    )
    options.update(overrides)
    ds = GapSentenceDataset(GSGCorpus(corpus_prefix(str(corpus_dir), split)), d, mask_token=mask, **options)
    return ds, d, mask


# ----------------------------------------------------------------------------- raw text


def test_document_formats(tmp_path):
    (tmp_path / "lines.txt").write_text("One doc. Two sentences.\n\nSecond doc here.\n")
    (tmp_path / "blank.txt").write_text("First doc, line\nwrapped. Next one.\n\n\nDoc two.\n")
    (tmp_path / "d.jsonl").write_text(json.dumps({"document": "Para one. Yes.\nPara two", "summary": "x"}) + "\n")
    assert list(read_documents(str(tmp_path / "lines.txt"), "lines")) == [
        ["One doc. Two sentences."],
        ["Second doc here."],
    ]
    assert list(read_documents(str(tmp_path / "blank.txt"), "blank")) == [
        ["First doc, line wrapped. Next one."],
        ["Doc two."],
    ]
    assert list(read_documents(str(tmp_path / "blank.txt"), "file")) == [
        ["First doc, line wrapped. Next one.", "Doc two."]
    ]
    assert list(read_documents(str(tmp_path / "d.jsonl"), "jsonl")) == [["Para one. Yes.", "Para two"]]
    assert document_sentences(["Para one. Yes.", "Para two"], 200) == ["Para one.", "Yes.", "Para two"]
    assert document_sentences(["a b c d e"], 2) == ["a b", "c d", "e"]
    lower = ["the gene is expressed. in particular, it binds dna."]
    assert len(document_sentences(lower, 200)) == 1  # the regex splitter wants a capital
    assert document_sentences(lower, 200, get_sentence_splitter("pysbd")) == [
        "the gene is expressed.",
        "in particular, it binds dna.",
    ]


def test_a_document_line_that_is_not_json_is_named(tmp_path):
    from lsg_text.fileio import DataError

    for text, problem in (('{"document": "a",', "Expecting"), ('{"document": ' + "[" * 100_000, "nested too deeply")):
        (tmp_path / "d.jsonl").write_text(json.dumps({"document": "fine"}) + "\n" + text + "\n")
        with pytest.raises(DataError, match=f"d.jsonl:2: not valid JSON \\({problem}"):
            list(read_documents(str(tmp_path / "d.jsonl"), "jsonl"))


def test_chunking_respects_word_budget():
    sentences = [" ".join(["w"] * n) for n in (3, 4, 2, 6, 1, 9)]
    chunks = list(chunk_sentences(sentences, 7))
    assert [s for c in chunks for s in c] == sentences  # nothing lost, order kept
    assert [sum(len(s.split()) for s in c) for c in chunks] == [7, 2, 7, 9]  # greedy; 9 > 7 alone
    assert list(chunk_sentences(sentences, 0)) == [sentences]


def test_script_jsonl_and_errors(tmp_path):
    src = os.path.join(DOCUMENTS, "sumpubmed", "valid.jsonl")
    sentences = {}
    for splitter in ("regex", "pysbd"):
        status, err = run_script(
            "--format",
            "jsonl",
            "--input",
            f"train={src}",
            "--max-documents",
            "3",
            "--sentence-splitter",
            splitter,
            "--output-dir",
            str(tmp_path / splitter),
        )
        assert status == 0, err
        corpus = GSGCorpus(corpus_prefix(str(tmp_path / splitter), "train"))
        assert len(corpus) == 3 and (corpus.doc_tokens > 500).all()
        sentences[splitter] = int(corpus.doc_offsets[-1])
    # SumPubMed is lower-cased: pysbd finds ~2.7x more sentences (713 vs 262) than the regex splitter
    assert sentences["pysbd"] > 2 * sentences["regex"]
    status, err = run_script(
        "--format", "jsonl", "--input", f"train={tmp_path}/missing.jsonl", "--output-dir", str(tmp_path)
    )
    assert status == 2 and "file not found" in err
    status, err = run_script(
        "--format", "lines", "--input", f"train={src}", "--min-sentences", "0", "--output-dir", str(tmp_path)
    )
    assert status == 2 and "argument --min-sentences: must be an integer >= 1, got '0'" in err
    for split in ("../x", "a/b", ".hidden"):  # ../x wrote x.gsg.*.npy beside --output-dir
        status, err = run_script(
            "--format", "lines", "--input", f"{split}={src}", "--output-dir", str(tmp_path / "out")
        )
        assert status == 2 and f"--input: split {split!r} is not a split name" in err
    assert not (tmp_path / "out").exists() and not list(tmp_path.glob("x.gsg.*"))


def _first_documents(out_dir):
    """The stored corpus and the sentences of its first pseudo-document (Blake, 300 words)."""
    corpus = GSGCorpus(corpus_prefix(str(out_dir), "train"))
    book = next(read_documents(os.path.join(GUTENBERG, "blake-poems.txt"), "file"))
    first = next(chunk_sentences(document_sentences(book, 200), 300))
    return corpus, first


def test_script_gpt2_tokenizer(tmp_path):
    """GPT-2 BPE (a converted BART folder's files): every stored sentence decodes back to itself."""
    from fairseq.data.encoders.gpt2_bpe_utils import get_encoder

    hf = os.path.join(FIXTURES, "lsg", "bart_plain", "hf")
    # The converter's identity dict.txt: GPT-2 id i is dictionary index i (fairseq_notes §3).
    dict_txt = tmp_path / "dict.txt"
    dict_txt.write_text("".join(f"{i} 1\n" for i in range(4, 499)))
    status, err = run_script(
        "--format",
        "file",
        "--chunk-words",
        "300",
        "--max-documents",
        "2",
        "--input",
        f"train={GUTENBERG}/blake-poems.txt",
        "--output-dir",
        str(tmp_path / "out"),
        "--gpt2-encoder-json",
        f"{hf}/vocab.json",
        "--gpt2-vocab-bpe",
        f"{hf}/merges.txt",
        "--dict",
        str(dict_txt),
    )
    assert status == 0, err
    corpus, sentences = _first_documents(tmp_path / "out")
    bpe = get_encoder(f"{hf}/vocab.json", f"{hf}/merges.txt")
    tokens, _ = corpus.document(0)
    assert len(tokens) == len(sentences)
    for toks, sentence in zip(tokens, sentences):
        assert bpe.decode(toks.tolist()) == " " + sentence  # leading space: sentences join cleanly
    status, err = run_script(
        "--format",
        "file",
        "--input",
        f"train={GUTENBERG}/blake-poems.txt",
        "--output-dir",
        str(tmp_path / "out2"),
        "--gpt2-encoder-json",
        f"{hf}/vocab.json",
        "--gpt2-vocab-bpe",
        f"{hf}/merges.txt",
    )
    assert status == 2 and "--dict is required" in err


def test_script_sentencepiece_tokenizer(tmp_path):
    """Sentencepiece from scripts/spm_train.py: dict.txt copied, stored ids decode to the text."""
    import sentencepiece as spm

    status = load_script("scripts/spm_train.py", "spm_train").main(
        [
            "--inputs",
            os.path.join(GUTENBERG, "blake-poems.txt"),
            "--model-prefix",
            str(tmp_path / "spm" / "spm"),
            "--vocab-size",
            "300",
            "--soft-vocab-limit",
        ]
    )
    assert status == 0
    status, err = run_script(
        "--format",
        "file",
        "--chunk-words",
        "300",
        "--max-documents",
        "2",
        "--input",
        f"train={GUTENBERG}/blake-poems.txt",
        "--output-dir",
        str(tmp_path / "out"),
        "--spm-model",
        str(tmp_path / "spm" / "spm.model"),
    )
    assert status == 0, err
    assert (tmp_path / "out" / "dict.txt").read_text() == (tmp_path / "spm" / "dict.txt").read_text()
    corpus, sentences = _first_documents(tmp_path / "out")
    sp = spm.SentencePieceProcessor(model_file=str(tmp_path / "spm" / "spm.model"))
    tokens, _ = corpus.document(0)
    assert len(tokens) == len(sentences)
    for toks, sentence in zip(tokens, sentences):
        # dictionary index == piece id (spm_train.py's convention), nmt_nfkc normalisation aside
        assert sp.decode(toks.tolist()) == sp.decode(sp.encode(sentence))


def test_corpus_round_trip(corpus_dir):
    """Stored sentences decode to the text's words, and ROUGE word ids follow rouge_tokenize."""
    ds, d, _ = load(corpus_dir)
    docs = []
    for paragraphs in read_documents(os.path.join(GUTENBERG, "blake-poems.txt"), "file"):
        docs.extend(c for c in chunk_sentences(document_sentences(paragraphs, 200), 300) if len(c) >= 2)
    assert len(ds) == 12
    for i in (0, 7):
        tokens, words = ds.corpus.document(i)
        assert len(tokens) == len(docs[i])
        for toks, w, sentence in zip(tokens, words, docs[i]):
            expected = [t if d.index(t) != d.unk() else "<unk>" for t in sentence.split()]
            assert d.string(torch.as_tensor(toks)).split() == expected
            assert len(w) == len(gsg.rouge_tokenize(sentence))


# ----------------------------------------------------------------------------- dataset


def test_examples_match_selection_and_masking(corpus_dir):
    ds, d, mask = load(corpus_dir)
    for i in range(len(ds)):
        tokens, words = ds.corpus.document(i)
        item = ds[i]
        selected = gsg.select_gap_sentences(words, 0.2)
        assert len(selected) == max(len(tokens) // 5, 1)
        src, tgt = item["source"].tolist(), item["target"].tolist()
        assert src[0] == d.bos() and src[-1] == d.eos() and tgt[0] == d.bos() and tgt[-1] == d.eos()
        assert tgt[1:-1] == [t for j in selected for t in tokens[j].tolist()]
        assert src.count(mask) == len(selected)
        kept = [t for j in range(len(tokens)) if j not in selected for t in tokens[j].tolist()]
        assert [t for t in src[1:-1] if t != mask] == kept


def test_remove_option_gives_pseudo_source(corpus_dir):
    ds, d, mask = load(corpus_dir, mask_probs=(0, 1, 0, 0))
    tokens, words = ds.corpus.document(3)
    selected = gsg.select_gap_sentences(words, 0.2)
    src = ds[3]["source"].tolist()
    assert mask not in src
    assert src[1:-1] == [t for j in range(len(tokens)) if j not in selected for t in tokens[j].tolist()]


def test_determinism_per_seed_and_epoch(corpus_dir):
    noisy = dict(ratio_max=0.5, score_noise=0.5, mask_probs=(0.4, 0.3, 0.2, 0.1))
    a, _, _ = load(corpus_dir, **noisy)
    b, _, _ = load(corpus_dir, **noisy)
    same = lambda x, y, i: all(torch.equal(x[i][k], y[i][k]) for k in ("source", "target"))  # noqa: E731
    assert all(same(a, b, i) for i in range(len(a)))
    b.set_epoch(2)
    assert not all(same(a, b, i) for i in range(len(a)))  # a new epoch draws new examples
    a.set_epoch(2)
    assert all(same(a, b, i) for i in range(len(a)))  # ... the same ones for the same epoch
    c, _, _ = load(corpus_dir, seed=2, **noisy)
    c.set_epoch(2)
    assert not all(same(a, c, i) for i in range(len(a)))
    # validation data ignores the epoch
    v1, _, _ = load(corpus_dir, "valid", fixed_epoch=1, **noisy)
    v2, _, _ = load(corpus_dir, "valid", fixed_epoch=1, **noisy)
    v2.set_epoch(5)
    assert all(same(v1, v2, i) for i in range(len(v1)))


def test_dataloader_workers_give_the_same_batches(corpus_dir):
    """Examples depend on (seed, epoch, index) only, not on which worker process builds them."""
    ds, _, _ = load(corpus_dir, ratio_max=0.4, score_noise=0.2, mask_probs=(0.5, 0.3, 0.1, 0.1))
    ds.set_epoch(3)
    loader = torch.utils.data.DataLoader(ds, batch_size=4, collate_fn=ds.collater, num_workers=2)
    in_workers = [b["net_input"]["src_tokens"] for b in loader]
    here = [
        ds.collater([ds[i] for i in range(j, min(j + 4, len(ds)))])["net_input"]["src_tokens"]
        for j in range(0, len(ds), 4)
    ]
    assert len(in_workers) == len(here) == 3
    assert all(torch.equal(a, b) for a, b in zip(in_workers, here))


def test_truncation_keeps_eos_and_is_counted(corpus_dir):
    ds, d, _ = load(corpus_dir, max_source_positions=64, max_target_positions=16)
    items = [ds[i] for i in range(len(ds))]
    assert all(len(x["source"]) <= 64 and len(x["target"]) <= 16 for x in items)
    assert all(x["source"][-1] == d.eos() and x["target"][-1] == d.eos() for x in items)
    batch = ds.collater(items)
    assert batch["gsg_source_truncated"] == sum(x["source_truncated"] for x in items) == len(ds)
    # right padding: every row starts with <s>
    assert (batch["net_input"]["src_tokens"][:, 0] == d.bos()).all()
    assert ds.src_sizes.max() <= 64 and (ds.num_tokens_vec(np.arange(len(ds))) <= 64).all()


@pytest.mark.parametrize(
    "field,value,message",
    [
        ("gsg_ratio", 0.0, "--gsg-ratio must be in"),
        ("gsg_ratio_max", 0.1, "--gsg-ratio-max must be in"),
        ("gsg_keep_prob", 0.5, "must sum to 1"),
        ("gsg_score_noise", -1.0, "--gsg-score-noise must be a finite number >= 0"),
        # NaN fails every comparison: the checks passed it (NaN noise ran with exit 0; a NaN mask
        # probability beside 0.5 and 0.5 failed in numpy's choice)
        ("gsg_score_noise", float("nan"), "--gsg-score-noise must be a finite number >= 0"),
        ("gsg_score_noise", float("inf"), "--gsg-score-noise must be a finite number >= 0"),
        ("gsg_mask_prob", float("nan"), "mask-action probabilities must be in \\[0, 1\\], got \\[nan"),
    ],
)
def test_config_validation(field, value, message):
    cfg = GapSentenceGenerationConfig(seed=1)
    setattr(cfg, field, value)
    with pytest.raises(ValueError, match=message):
        validate_gsg_config(cfg)


@pytest.mark.parametrize("strategy", ["ind_orig", "seq"])
def test_selection_work_per_example(corpus_dir, monkeypatch, strategy):
    """The cost of an example, counted rather than timed (speed lives in throughput.py and the
    README): one document count per example, ROUGE-1 computed as whole vectors (once for Ind-Orig,
    once per gap sentence for Seq-Orig) and never through the rouge-score package, so neither a
    per-pair scoring loop nor an extra pass over the document slips in."""
    calls = {"counts": 0, "f1": 0, "f1_rows": 0}
    counts, f1 = gsg._DocumentCounts, gsg._f1_vector

    def counted_counts(*a, **k):
        calls["counts"] += 1
        return counts(*a, **k)

    def counted_f1(overlap, len_a, len_b):
        calls["f1"] += 1
        calls["f1_rows"] += np.size(overlap)
        return f1(overlap, len_a, len_b)

    monkeypatch.setattr(gsg, "_DocumentCounts", counted_counts)
    monkeypatch.setattr(gsg, "_f1_vector", counted_f1)

    def no_package(*a, **k):
        raise AssertionError("the rouge-score package was called while building an example")

    monkeypatch.setattr(rouge_scorer.RougeScorer, "score", no_package)
    ds, _, _ = load(corpus_dir, strategy=strategy)
    expected_f1 = expected_rows = 0
    for i in range(len(ds)):
        ds[i]
        n = len(ds.corpus.document(i)[1])
        m = min(gsg.num_gap_sentences(n, 0.2), n)
        rounds = 1 if strategy == "ind_orig" else m
        expected_f1 += rounds
        expected_rows += rounds * n
    assert calls["counts"] == len(ds)
    assert (calls["f1"], calls["f1_rows"]) == (expected_f1, expected_rows)


def run_throughput(*args):
    """(exit status, stdout, stderr) of examples/gsg_pretraining/throughput.py, in this process."""
    script = load_script("examples/gsg_pretraining/throughput.py", "gsg_throughput", neighbours=False)
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            status = script.main([str(a) for a in args])
        except SystemExit as e:  # argparse refusing a flag value
            status = e.code
    return status, out.getvalue(), err.getvalue()


def test_throughput_script_runs_and_refuses_bad_input(corpus_dir, tmp_path):
    """The README's measurement prints a line per strategy; a wrong --data, --split, dict.txt or a
    count of 0 is one line naming it (they were tracebacks, or a ZeroDivisionError for 0)."""
    status, out, err = run_throughput("--data", corpus_dir, "--split", "valid", "--repeats", 1)
    assert status == 0, err
    assert [line.split()[0] for line in out.splitlines()[1:]] == list(gsg.SELECTION_STRATEGIES)

    damaged = tmp_path / "damaged"
    shutil.copytree(corpus_dir, damaged)
    (damaged / "dict.txt").write_text("the 12\nof\n")
    cases = {
        ("--data", tmp_path / "absent"): f"--data: directory not found: {tmp_path / 'absent'}",
        ("--data", tmp_path, "--split", "valid"): "not a scripts/gsg_preprocess.py folder",
        ("--data", corpus_dir, "--split", "tset"): "--split tset: no such split in --data",
        ("--data", damaged): f"{damaged / 'dict.txt'}: not a fairseq dict.txt (line 2",
        ("--data", corpus_dir, "--batch-size", 0): "argument --batch-size: must be an integer >= 1, got '0'",
        ("--data", corpus_dir, "--repeats", 0): "argument --repeats: must be an integer >= 1, got '0'",
    }
    for args, expected in cases.items():
        status, out, err = run_throughput(*args)
        assert status == 2 and out == "", (args, out, err)
        assert err.startswith("throughput.py: error: ") and err.count("\n") == 1, (args, err)
        assert expected in err, (args, err)
    assert "splits there: train, valid" in run_throughput("--data", corpus_dir, "--split", "tset")[2]


# ----------------------------------------------------------------------------- fairseq-train


def test_fairseq_train_then_finetune(corpus_dir, tmp_path, caplog):
    """A few GSG updates, then the checkpoint fine-tunes with long_document_summarization."""
    caplog.set_level(logging.INFO)
    common = [
        "--user-dir",
        lsg_fairseq.user_dir(),
        "--cpu",
        "--optimizer",
        "adam",
        "--lr",
        "1e-3",
        "--max-tokens",
        "2048",
        "--max-source-positions",
        "256",
        "--max-target-positions",
        "64",
        "--log-format",
        "json",
        "--log-interval",
        "1",
        "--num-workers",
        "0",
        "--no-epoch-checkpoints",
        # fairseq drops a last batch smaller than this multiple when it is the only one
        "--required-batch-size-multiple",
        "1",
        *TINY_BART,
    ]
    fairseq_train(
        [
            str(corpus_dir),
            "--task",
            "gap_sentence_generation",
            "--gsg-selection",
            "seq",
            "--gsg-mask-prob",
            "0.5",
            "--gsg-remove-prob",
            "0.5",
            "--max-update",
            "3",
            "--save-dir",
            str(tmp_path / "ck"),
            *common,
        ]
    )
    log = caplog.text
    valid = [
        json.loads(r.getMessage())
        for r in caplog.records
        if r.getMessage().startswith("{") and '"valid_loss"' in r.getMessage()
    ]
    assert valid and float(valid[-1]["valid_loss"]) > 0 and "gsg_src_trunc" in log
    state = torch.load(tmp_path / "ck" / "checkpoint_last.pt", weights_only=False)
    assert state["optimizer_history"][-1]["num_updates"] == 3
    assert state["cfg"]["task"]["_name"] == "gap_sentence_generation"

    # Fine-tuning: summarization data binarized with the GSG dictionary, restored from the GSG
    # checkpoint (embedding sizes only match if both tasks add <mask> the same way).
    raw, binarized = tmp_path / "raw", tmp_path / "bin"
    raw.mkdir()
    with open(os.path.join(DOCUMENTS, "squality", "train.jsonl")) as f:
        examples = [json.loads(next(f)) for _ in range(3)]
    for split, exs in (("train", examples[:2]), ("valid", examples[2:])):
        for side, key in (("source", "document"), ("target", "summary")):
            (raw / f"{split}.{side}").write_text("".join(" ".join(ex[key].split()) + "\n" for ex in exs))
    dict_txt = str(corpus_dir / "dict.txt")
    from fairseq import options
    from fairseq_cli import preprocess

    preprocess.main(
        options.get_preprocessing_parser().parse_args(
            [
                "--source-lang",
                "source",
                "--target-lang",
                "target",
                "--trainpref",
                str(raw / "train"),
                "--validpref",
                str(raw / "valid"),
                "--destdir",
                str(binarized),
                "--srcdict",
                dict_txt,
                "--tgtdict",
                dict_txt,
                "--workers",
                "1",
            ]
        )
    )
    caplog.clear()
    fairseq_train(
        [
            str(binarized),
            "--task",
            "long_document_summarization",
            "--truncate-target",
            "--restore-file",
            str(tmp_path / "ck" / "checkpoint_last.pt"),
            "--reset-optimizer",
            "--reset-dataloader",
            "--reset-meters",
            "--max-update",
            "2",
            "--save-dir",
            str(tmp_path / "ck2"),
            *common,
        ]
    )
    assert "Loaded checkpoint" in caplog.text
    tuned = torch.load(tmp_path / "ck2" / "checkpoint_last.pt", weights_only=False)
    assert tuned["optimizer_history"][-1]["num_updates"] == 2
    # started from the GSG weights: two small Adam steps stay close to them
    key = "encoder.embed_tokens.weight"
    assert tuned["model"][key].shape == state["model"][key].shape
    assert (tuned["model"][key] - state["model"][key]).abs().max() < 0.01


@pytest.mark.parametrize("arch", ["lsg_bart_tiny", "locost_tiny"])
def test_plugin_tiny_archs_train_on_gsg(corpus_dir, tmp_path, arch):
    """The task is architecture-agnostic: the plugin's long-input models pretrain on it."""
    fairseq_train(
        [
            str(corpus_dir),
            "--user-dir",
            lsg_fairseq.user_dir(),
            "--task",
            "gap_sentence_generation",
            "--arch",
            arch,
            "--cpu",
            "--optimizer",
            "adam",
            "--lr",
            "1e-3",
            "--max-tokens",
            "512",
            "--max-source-positions",
            "128",
            "--max-target-positions",
            "32",
            "--max-update",
            "1",
            "--gsg-remove-prob",
            "1",
            "--gsg-mask-prob",
            "0",
            "--num-workers",
            "0",
            "--required-batch-size-multiple",
            "1",
            "--no-epoch-checkpoints",
            "--disable-validation",
            "--save-dir",
            str(tmp_path),
        ]
    )
    state = torch.load(tmp_path / "checkpoint_last.pt", weights_only=False)
    assert state["optimizer_history"][-1]["num_updates"] == 1
    assert state["cfg"]["model"].arch == arch


def test_mask_symbol_must_be_in_dictionary(corpus_dir):
    from lsg_fairseq.tasks.gap_sentence_generation import GapSentenceGenerationTask

    d = GapSentenceGenerationTask.load_dictionary(str(corpus_dir / "dict.txt"))
    cfg = GapSentenceGenerationConfig(seed=1, data=str(corpus_dir), gsg_mask_symbol="<extra_id_0>")
    with pytest.raises(ValueError, match="--gsg-mask-symbol '<extra_id_0>' is not in the dictionary"):
        GapSentenceGenerationTask(cfg, d, d)
    sentinel = d.add_symbol("<extra_id_0>")  # e.g. a T5 vocabulary
    task = GapSentenceGenerationTask(cfg, d, d)
    assert task.mask_index == sentinel != d.index("<mask>")
    task.load_dataset("valid")
    assert sentinel in task.datasets["valid"][0]["source"].tolist()
    for special in ("<pad>", "</s>", "<s>", "<unk>"):  # <pad>: masking became removal, exit 0
        cfg = GapSentenceGenerationConfig(seed=1, data=str(corpus_dir), gsg_mask_symbol=special)
        with pytest.raises(ValueError, match=f"--gsg-mask-symbol {special}: one of the dictionary's special symbols"):
            GapSentenceGenerationTask(cfg, d, d)


def test_a_corpus_of_another_dictionary_is_named(corpus_dir, tmp_path):
    """An id past the dictionary: an IndexError in the embedding at the first batch holding one."""
    import shutil

    from lsg_fairseq.tasks.gap_sentence_generation import GapSentenceGenerationTask

    short = tmp_path / "short"
    shutil.copytree(corpus_dir, short)
    (short / "dict.txt").write_text("".join((corpus_dir / "dict.txt").read_text().splitlines(keepends=True)[:50]))
    d = GapSentenceGenerationTask.load_dictionary(str(short / "dict.txt"))
    task = GapSentenceGenerationTask(GapSentenceGenerationConfig(seed=1, data=str(short)), d, d)
    with pytest.raises(ValueError, match=r"valid.gsg.tokens.npy holds token id \d+, but .*dict.txt has 55 symbols"):
        task.load_dataset("valid")


def test_targets_above_the_model_name_no_flag_gsg_ignores(corpus_dir):
    """GSG cuts its targets to --max-target-positions itself: a generation with a model of fewer
    target positions is told to lower that flag, not to add --truncate-target (which GSG ignores)."""
    import numpy as np

    from lsg_fairseq.tasks.gap_sentence_generation import GapSentenceGenerationTask

    d = GapSentenceGenerationTask.load_dictionary(str(corpus_dir / "dict.txt"))
    task = GapSentenceGenerationTask(GapSentenceGenerationConfig(seed=1, data=str(corpus_dir)), d, d)
    task.load_dataset("valid")
    dataset = task.datasets["valid"]
    with pytest.raises(ValueError) as e:
        task.filter_indices_by_size(np.arange(len(dataset)), dataset, max_positions=(100_000, 4))
    assert str(e.value).endswith("the model accepts at most 4 target tokens; lower --max-target-positions to 4")


def test_missing_split_named(corpus_dir):
    """A split with no corpus file: one refusal naming the folder, the split and the flags."""
    from lsg_fairseq.tasks.gap_sentence_generation import GapSentenceGenerationTask
    from lsg_text.errors import MissingFileError

    d = GapSentenceGenerationTask.load_dictionary(str(corpus_dir / "dict.txt"))
    task = GapSentenceGenerationTask(GapSentenceGenerationConfig(seed=1, data=str(corpus_dir)), d, d)
    with pytest.raises(MissingFileError) as e:
        task.load_dataset("test")
    assert f"{corpus_dir}: no 'test' split (test.gsg.*.npy not found; splits there: train, valid)" in str(e.value)
    assert "--disable-validation" in str(e.value)


@pytest.mark.parametrize("part", ["tokens", "sentences"])
def test_damaged_corpus_file_named(corpus_dir, tmp_path, part):
    from lsg_text.fileio import DataError

    damaged = tmp_path / "damaged"
    shutil.copytree(corpus_dir, damaged)
    prefix = corpus_prefix(str(damaged), "train")
    data = open(f"{prefix}.{part}.npy", "rb").read()
    open(f"{prefix}.{part}.npy", "wb").write(data[: len(data) // 2])  # an interrupted copy
    with pytest.raises(DataError, match=rf"{part}\.npy: not a readable \.npy array|sentence sizes do not add up"):
        GSGCorpus(prefix)


def test_the_default_dictionary_beside_the_spm_model_is_named_as_such(tmp_path):
    """Without --dict the dict.txt beside --spm-model is read; a missing one was reported as
    '--dict: file not found' although no --dict was given."""
    (tmp_path / "spm").mkdir()
    (tmp_path / "spm" / "m.model").write_bytes(b"")
    (tmp_path / "g.txt").write_text("a first sentence. a second one here. and a third.\n")
    status, err = run_script(
        "--input", f"train={tmp_path / 'g.txt'}", "--format", "lines", "--output-dir", str(tmp_path / "out"),
        "--spm-model", str(tmp_path / "spm" / "m.model"),
    )  # fmt: skip
    assert status == 2 and "--dict:" not in err, err
    assert f"--spm-model's dict.txt (no --dict given): file not found: {tmp_path / 'spm' / 'dict.txt'}" in err, err
