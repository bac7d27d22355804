"""long_document_summarization: truncation, padding side, special tokens, ROUGE, beam-size regression."""

import os

import pytest
import torch

from conftest import build_from_flags
from lsg_text.rouge import rouge_example

TINY_BART = [
    "--arch",
    "bart_base",
    "--encoder-layers",
    "1",
    "--decoder-layers",
    "1",
    "--encoder-embed-dim",
    "32",
    "--decoder-embed-dim",
    "32",
    "--encoder-ffn-embed-dim",
    "64",
    "--decoder-ffn-embed-dim",
    "64",
    "--encoder-attention-heads",
    "2",
    "--decoder-attention-heads",
    "2",
    "--dropout",
    "0",
    "--attention-dropout",
    "0",
]


def build(data, *extra, arch=TINY_BART):
    cfg, task, model = build_from_flags(
        [str(data), "--task", "long_document_summarization", "--criterion", "cross_entropy", "--optimizer", "adam"]
        + ["--cpu", *arch, *extra]
    )
    return task, model, task.build_criterion(cfg.criterion)


def batch(task, split, n, start=0):
    ds = task.dataset(split)
    return ds.collater([ds[i] for i in range(start, start + n)])


def test_sources_truncated_and_counted_not_skipped(word_data):
    task, _, _ = build(word_data, "--max-source-positions", "64")
    task.load_dataset("train")
    ds = task.dataset("train")
    assert len(ds) == 12  # nothing skipped
    raw = [line.split() for line in open(os.path.join(word_data, "..", "raw", "train.source"))]
    expected = sum(1 for words in raw if len(words) + 1 > 63)  # +eos, -1 for the prepended <s>
    assert expected > 0
    assert task.truncation_counts["train"]["source"] == expected
    for i in range(len(ds)):
        src = ds[i]["source"]
        assert len(src) <= 64
        assert src[0].item() == task.src_dict.bos() and src[-1].item() == task.src_dict.eos()
        assert ds.src_sizes[i] == len(src)


def test_target_truncation_flag(word_data):
    task, _, _ = build(word_data, "--max-target-positions", "20", "--truncate-target")
    task.load_dataset("valid")
    assert task.truncation_counts["valid"]["target"] == 4
    assert all(len(task.dataset("valid")[i]["target"]) == 20 for i in range(4))


def test_source_right_padded_and_decoder_input_like_hf(word_data):
    task, _, _ = build(word_data)
    task.load_dataset("valid")
    b = batch(task, "valid", 4)
    src = b["net_input"]["src_tokens"]
    pad = task.src_dict.pad()
    lengths = b["net_input"]["src_lengths"]
    for row, n in zip(src, lengths):
        assert (row[:n] != pad).all() and (row[n:] == pad).all()  # padding only on the right
    # HF BART: source "<s> ... </s>", decoder input "</s> <s> y ...", target "<s> y ... </s>"
    assert (src[:, 0] == task.src_dict.bos()).all()
    prev = b["net_input"]["prev_output_tokens"]
    assert (prev[:, 0] == task.tgt_dict.eos()).all() and (prev[:, 1] == task.tgt_dict.bos()).all()
    assert (b["target"][:, 0] == task.tgt_dict.bos()).all()


def test_mask_symbol_added(word_data):
    task, _, _ = build(word_data)
    assert task.src_dict.index("<mask>") != task.src_dict.unk()


def test_empty_source_refused_with_index(tmp_path):
    import subprocess
    from conftest import fairseq_cli

    raw = tmp_path / "raw"
    raw.mkdir()
    (raw / "train.source").write_text("a b c\n\nd e f\n")
    (raw / "train.target").write_text("a\nb\nc\n")
    subprocess.run(
        [
            fairseq_cli("fairseq-preprocess"),
            "-s",
            "source",
            "-t",
            "target",
            "--trainpref",
            str(raw / "train"),
            "--destdir",
            str(tmp_path / "bin"),
            "--joined-dictionary",
            "--workers",
            "1",
        ],
        check=True,
        capture_output=True,
    )
    task, _, _ = build(tmp_path / "bin")
    with pytest.raises(ValueError, match=r"train\.source-target\.source: 1 empty source line\(s\) at example index 1"):
        task.load_dataset("train")


def test_missing_data_dir_refused(tmp_path):
    """Named as fairseq's commands take it, their first argument: it read "--data", no such flag."""
    with pytest.raises(FileNotFoundError) as e:
        build(tmp_path / "nope")
    nope = str(tmp_path / "nope")
    assert str(e.value) == f"data directory {nope!r} does not exist (DATA, the command's first argument)"


def test_data_binarized_with_other_suffixes_names_the_language_flags(word_data, tmp_path):
    """fairseq-preprocess -s src -t tgt writes dict.src.txt / dict.tgt.txt: the refusal said to run
    scripts/preprocess.sh, while --source-lang/--target-lang were what was missing."""
    import shutil

    folder = tmp_path / "bin"
    folder.mkdir()
    for lang in ("src", "tgt"):
        shutil.copy(word_data / "dict.source.txt", folder / f"dict.{lang}.txt")
    with pytest.raises(FileNotFoundError) as e:
        build(folder)
    assert f"{folder} holds dict.src.txt and dict.tgt.txt: pass --source-lang and --target-lang" in str(e.value)


def test_rouge_hand_computed():
    # unigram overlap: hyp {the, cat, sat}, ref {the, cat, ran, away}: P=2/3, R=2/4, F=4/7
    s = rouge_example("the cat sat", "the cat ran away")
    assert s["rouge1"] == pytest.approx(4 / 7)
    # bigrams: hyp {the cat, cat sat}, ref {the cat, cat ran, ran away}: P=1/2, R=1/3, F=0.4
    assert s["rouge2"] == pytest.approx(0.4)
    # LCS "the cat" = 2: same as rouge1 here
    assert s["rougeL"] == pytest.approx(4 / 7)
    # stemming on: "running" ~ "runs"
    assert rouge_example("dogs running", "dog runs")["rouge1"] == pytest.approx(1.0)
    # Lsum is summary-level LCS over sentences: order of sentences does not matter
    assert rouge_example("B c d. A b c.", "A b c. B c d.")["rougeLsum"] == pytest.approx(1.0)
    assert rouge_example("B c d. A b c.", "A b c. B c d.")["rougeL"] < 1.0


def _loss(model, criterion, sample):
    model.eval()
    with torch.no_grad():
        return criterion(model, sample)[0].item()


@pytest.mark.parametrize("n", [2, 3])
def test_training_forward_after_rouge_validation_is_unchanged(word_data, n):
    """fairseq#3893: beam>1 generation used to leave cross-attention folded by beam.

    The reference loss comes from an identically seeded model that never built a generator:
    building one (at build_model time) is already enough to corrupt stock fairseq.
    """
    _, plain_model, plain_criterion = build(word_data)
    task, model, criterion = build(
        word_data,
        "--eval-rouge",
        "--eval-rouge-bpe",
        "none",
        "--eval-rouge-args",
        '{"beam": 2, "max_len_b": 8, "no_repeat_ngram_size": 3}',
    )
    task.load_dataset("valid")
    sample = batch(task, "valid", n)
    reference = _loss(plain_model, plain_criterion, sample)
    assert _loss(model, criterion, sample) == reference  # building the generator changed nothing
    model.eval()
    with torch.no_grad():
        _, _, log = task.valid_step(sample, model, criterion)
    assert log["_rouge_n"] == n
    assert _loss(model, criterion, sample) == reference  # nor did generating with beam 2


def test_rouge_metrics_logged_as_floats(word_data):
    from fairseq import metrics

    task, model, criterion = build(
        word_data, "--eval-rouge", "--eval-rouge-bpe", "none", "--eval-rouge-args", '{"beam": 1, "max_len_b": 5}'
    )
    task.load_dataset("valid")
    sample = batch(task, "valid", 2)
    model.eval()
    with torch.no_grad():
        _, _, log = task.valid_step(sample, model, criterion)
    with metrics.aggregate() as agg:
        task.reduce_metrics([log], criterion)
    values = agg.get_smoothed_values()
    for key in ("rouge1", "rouge2", "rougeL", "rougeLsum"):
        assert key in values and isinstance(values[key], float)
        assert 0.0 <= values[key] <= 100.0


def test_no_example_dropped_by_batch_size_multiple(word_data):
    """fairseq's batch_by_size drops n mod 8 examples with the default multiple of 8."""
    task, _, _ = build(word_data)
    task.load_dataset("valid")
    ds = task.dataset("valid")
    itr = task.get_batch_iterator(
        ds, max_tokens=None, max_sentences=3, max_positions=(100000, 100000), required_batch_size_multiple=8
    ).next_epoch_itr(shuffle=False)
    ids = sorted(i for b in itr for i in b["id"].tolist())
    assert ids == list(range(len(ds)))


def test_summarize_makes_summaries_as_validation_does():
    """lsg-fairseq-summarize's generation flags default to the task's --eval-rouge-args, one home
    (lsg_text.argtypes.GENERATION_DEFAULTS); neither can make an empty summary by default."""
    import json

    from lsg_fairseq.cli.summarize import build_parser
    from lsg_fairseq.tasks.eval_rouge import DEFAULT_EVAL_ROUGE_ARGS

    validation = json.loads(DEFAULT_EVAL_ROUGE_ARGS)
    args = build_parser().parse_args(["model_dir"])
    assert set(validation) == {"beam", "lenpen", "max_len_b", "min_len", "no_repeat_ngram_size"}
    assert {k: getattr(args, k) for k in validation} == validation
    assert validation["min_len"] >= 1
