"""Bad-input matrix (issue 8): each bad input fails with a message naming the file, line or flag,
and leaves no half-written output. Cases tested elsewhere are listed in README "Bad inputs"; this
file holds the ones no other test covers.
"""

import io
import json
import logging
import os
import subprocess
import sys

import pytest

import lsg_fairseq
from test_scripts import files_in, load_script
from test_task import build as build_task

from conftest import FIXTURES, TINY_LOCOST, TINY_LSG_BART, training_config


def binarize(tmp_path, splits, name="bin"):
    """{split: (source lines, target lines)} -> fairseq-binarized folder (joined dictionary)."""
    raw = tmp_path / f"raw_{name}"
    raw.mkdir()
    args = []
    for split, (src, tgt) in splits.items():
        (raw / f"{split}.source").write_text("".join(line + "\n" for line in src))
        (raw / f"{split}.target").write_text("".join(line + "\n" for line in tgt))
        args += [f"--{'train' if split == 'train' else 'valid'}pref", str(raw / split)]
    # fairseq-preprocess's own main, in-process (a subprocess would pay the fairseq import again)
    from fairseq import options
    from fairseq_cli import preprocess

    preprocess.main(
        options.get_preprocessing_parser().parse_args(
            [
                "-s",
                "source",
                "-t",
                "target",
                *args,
                "--destdir",
                str(tmp_path / name),
                "--joined-dictionary",
                "--workers",
                "1",
            ]
        )
    )
    return tmp_path / name


# ----------------------------------------------------------------------------- binarized data
def test_empty_target_line_refused_with_file_and_index(tmp_path):
    data = binarize(tmp_path, {"train": (["a b c", "d e", "f g"], ["x y", "z", ""])})
    task, _, _ = build_task(data)
    with pytest.raises(ValueError, match=r"train\.source-target\.target: 1 empty target line\(s\) at example index 2"):
        task.load_dataset("train")


def test_mismatched_binarized_sides_named(tmp_path):
    """Sides binarized separately from files of different lengths (preprocess.sh checks raw files)."""
    data = binarize(tmp_path, {"train": (["a b c", "d e", "f g"], ["x y", "z", "w"])})
    short = binarize(tmp_path, {"train": (["a b", "c"], ["x", "y"])}, name="short")
    for ext in ("bin", "idx"):
        os.replace(short / f"train.source-target.target.{ext}", data / f"train.source-target.target.{ext}")
    task, _, _ = build_task(data)
    with pytest.raises(ValueError) as e:
        task.load_dataset("train")
    assert f"{data}/train.source-target.source has 3 examples but {data}/train.source-target.target has 2" in str(
        e.value
    )


def test_empty_binarized_split_named(tmp_path):
    data = binarize(tmp_path, {"train": (["a b"], ["x"]), "valid": ([], [])})
    task, _, _ = build_task(data)
    with pytest.raises(ValueError, match=r"valid\.source-target\.source\.idx: split 'valid' is empty"):
        task.load_dataset("valid")
    task.load_dataset("train")  # the check does not refuse good splits
    assert len(task.dataset("train")) == 1


# ----------------------------------------------------------------------------- raw data scripts
def test_non_utf8_jsonl_named_and_nothing_written(tmp_path, capsys):
    in_dir, out_dir = tmp_path / "in", tmp_path / "out"
    in_dir.mkdir()
    (in_dir / "train.jsonl").write_bytes(
        json.dumps({"document": "d", "summary": "s"}).encode() + b"\n" + b'{"document": "caf\xe9", "summary": "s"}\n'
    )
    rc = load_script("jsonl_to_parallel.py").main(
        ["--input-dir", str(in_dir), "--output-dir", str(out_dir), "--splits", "train"]
    )
    err = capsys.readouterr().err
    assert rc == 2 and f"{in_dir / 'train.jsonl'}:2: not UTF-8 text (byte 17 of the line" in err
    assert files_in(out_dir) == []


def test_empty_jsonl_split_named_and_nothing_written(tmp_path, capsys):
    in_dir, out_dir = tmp_path / "in", tmp_path / "out"
    in_dir.mkdir()
    (in_dir / "train.jsonl").write_text(json.dumps({"document": "d", "summary": "s"}) + "\n")
    (in_dir / "valid.jsonl").write_text("")
    rc = load_script("jsonl_to_parallel.py").main(
        ["--input-dir", str(in_dir), "--output-dir", str(out_dir), "--splits", "train", "valid"]
    )
    err = capsys.readouterr().err
    assert rc == 2 and f"{in_dir / 'valid.jsonl'}: no examples" in err
    assert files_in(out_dir) == []  # train was fine, yet not written alone


@pytest.fixture(scope="module")
def two_spm_models(tmp_path_factory):
    """Two sentencepiece models (and their dict.txt) trained on different text."""
    root = tmp_path_factory.mktemp("spm")
    train = load_script("spm_train.py")
    out = {}
    for name, words in (
        ("a", "alpha beta gamma delta epsilon zeta eta theta"),
        ("b", "one two three four five six seven eight nine ten"),
    ):
        text = root / f"{name}.txt"
        text.write_text("".join(f"{words} {i} {words[::-1]}\n" for i in range(200)))
        assert (
            train.main(
                [
                    "--inputs",
                    str(text),
                    "--model-prefix",
                    str(root / name / "spm"),
                    "--vocab-size",
                    "60",
                    "--soft-vocab-limit",
                ]
            )
            == 0
        )
        out[name] = root / name
    return out


def test_non_utf8_text_to_spm_encode_named_and_nothing_written(two_spm_models, tmp_path, capsys):
    src = tmp_path / "train.source"
    src.write_bytes(b"alpha beta\ncaf\xe9 gamma\n")
    dst = tmp_path / "enc" / "train.source"
    rc = load_script("spm_encode.py").main(
        ["--model", str(two_spm_models["a"] / "spm.model"), "--inputs", str(src), "--outputs", str(dst)]
    )
    err = capsys.readouterr().err
    assert rc == 2 and f"{src}: not UTF-8 text" in err
    assert files_in(tmp_path / "enc") == []


# ----------------------------------------------------------------------------- sentencepiece vs dictionary
def test_spm_model_not_matching_dictionary_refused_by_summarize(two_spm_models, tmp_path, capsys):
    from lsg_fairseq.cli import summarize

    model_dir = tmp_path / "model"
    model_dir.mkdir()
    (model_dir / "model.pt").write_bytes(b"never read: the tokenizer files are checked first")
    (model_dir / "dict.txt").write_text((two_spm_models["a"] / "dict.txt").read_text())
    (model_dir / "spm.model").write_bytes((two_spm_models["b"] / "spm.model").read_bytes())
    (tmp_path / "doc.txt").write_text("one two three\n")
    with pytest.raises(SystemExit) as e:
        summarize.main([str(model_dir), str(tmp_path / "doc.txt"), "--output", str(tmp_path / "out.txt")])
    err = capsys.readouterr().err
    assert e.value.code == 2
    assert f"{model_dir / 'spm.model'} does not match {model_dir / 'dict.txt'}" in err
    assert "pieces are not in the dictionary" in err
    assert not (tmp_path / "out.txt").exists()


def test_spm_check_accepts_own_pair_and_refuses_foreign(two_spm_models):
    from lsg_text.fileio import DataError
    from lsg_fairseq.models.hub import check_spm_matches_dict

    a, b = two_spm_models["a"], two_spm_models["b"]
    check_spm_matches_dict(str(a / "spm.model"), str(a / "dict.txt"))  # no error
    with pytest.raises(DataError, match="does not match"):
        check_spm_matches_dict(str(a / "spm.model"), str(b / "dict.txt"))


def test_spm_model_not_matching_dictionary_refused_by_eval_rouge(two_spm_models, tmp_path):
    data = tmp_path / "bin"
    data.mkdir()
    (data / "dict.txt").write_text((two_spm_models["a"] / "dict.txt").read_text())
    with pytest.raises(
        Exception, match=r"--eval-rouge-sentencepiece-model .*spm\.model does not match the target dictionary"
    ):
        build_task(
            data,
            "--eval-rouge",
            "--eval-rouge-bpe",
            "sentencepiece",
            "--eval-rouge-sentencepiece-model",
            str(two_spm_models["b"] / "spm.model"),
        )


# ----------------------------------------------------------------------------- model flags
def test_unknown_sparsity_type_message_names_flag_and_choices(tmp_path, capsys):
    data = tmp_path / "d"
    data.mkdir()
    (data / "dict.txt").write_text("".join(f"{i} 1\n" for i in range(4, 40)))
    with pytest.raises(SystemExit):
        build_task(data, "--sparsity-type", "bogus", arch=["--arch", "lsg_bart_tiny"])
    err = capsys.readouterr().err
    assert "--sparsity-type" in err and "invalid choice: 'bogus'" in err and "norm" in err


# ----------------------------------------------------------------------------- converter
def test_convert_folder_that_is_not_a_model(tmp_path, capsys):
    from lsg_fairseq.cli.convert import main as convert_main

    src = tmp_path / "notes"
    src.mkdir()
    (src / "README.txt").write_text("not a model\n")
    (src / "weights.bin").write_bytes(b"\x00" * 64)
    out = tmp_path / "out"
    with pytest.raises(SystemExit) as e:
        convert_main([str(src), str(out)])
    err = capsys.readouterr().err
    assert e.value.code == 2
    assert f"{src}: not a model this converter knows" in err and "BART, LED, LOCOST or LSG-BART" in err
    assert not out.exists()


# ----------------------------------------------------------------------------- checkpoints and generation
@pytest.fixture(scope="module")
def tiny_checkpoint(word_data, tmp_path_factory):
    """An lsg_bart checkpoint on the word-level data, saved by fairseq's Trainer (no training)."""
    from fairseq import tasks
    from fairseq.trainer import Trainer

    d = tmp_path_factory.mktemp("tiny_ckpt")
    argv = [
        str(word_data),
        "--task",
        "long_document_summarization",
        "--user-dir",
        lsg_fairseq.user_dir(),
        *TINY_LSG_BART,
        "--max-source-positions",
        "128",
        "--max-target-positions",
        "64",
        "--criterion",
        "cross_entropy",
        "--optimizer",
        "adam",
        "--lr",
        "1e-3",
        "--cpu",
    ]
    cfg = training_config(argv)
    task = tasks.setup_task(cfg.task)
    model = task.build_model(cfg.model)
    trainer = Trainer(cfg, task, model, task.build_criterion(cfg.criterion))
    trainer.consolidate_optimizer()
    path = str(d / "checkpoint_best.pt")
    trainer.save_checkpoint(path, {"train_iterator": {"epoch": 1}})
    return path


def test_generate_wrapper_needs_no_user_dir_or_task(word_data, tiny_checkpoint, capsys, monkeypatch):
    """`lsg-fairseq-generate` = fairseq-generate with the plugin's --user-dir and task filled in."""
    from lsg_fairseq.cli import fairseq_wrappers

    argv = [
        str(word_data),
        "--path",
        tiny_checkpoint,
        "--gen-subset",
        "valid",
        "--beam",
        "1",
        "--max-len-b",
        "4",
        "--max-source-positions",
        "128",
        "--max-target-positions",
        "64",
        "--truncate-target",
        "--batch-size",
        "2",
        "--cpu",
    ]
    assert fairseq_wrappers.plugin_argv(argv, "x")[-4:] == [
        "--user-dir",
        lsg_fairseq.user_dir(),
        "--task",
        "long_document_summarization",
    ]
    monkeypatch.setattr("sys.argv", ["lsg-fairseq-generate"])
    fairseq_wrappers.generate(argv)
    out = capsys.readouterr().out
    assert sum(1 for line in out.splitlines() if line.startswith("H-")) == 4  # every valid document


def test_generate_wrapper_missing_checkpoint_named(word_data, tmp_path, capsys):
    from lsg_fairseq.cli import fairseq_wrappers

    with pytest.raises(SystemExit) as e:
        fairseq_wrappers.generate([str(word_data), "--path", str(tmp_path / "nope.pt")])
    assert e.value.code == 2
    assert f"--path {tmp_path / 'nope.pt'}: no such checkpoint file" in capsys.readouterr().err


def test_generate_missing_gen_subset_is_one_line(word_data, tiny_checkpoint, tmp_path, capsys, monkeypatch):
    """--gen-subset test on a folder without it: one line and exit 2 from lsg-fairseq-generate and
    from fairseq-generate itself (fairseq's own error is a FileNotFoundError traceback)."""
    from conftest import fairseq_cli
    from lsg_fairseq.cli import fairseq_wrappers

    argv = [str(word_data), "--path", tiny_checkpoint, "--gen-subset", "test", "--beam", "1", "--cpu"]
    expected = f"{word_data}: no 'test' split"
    monkeypatch.setattr("sys.argv", ["lsg-fairseq-generate"])
    with pytest.raises(SystemExit) as e:
        fairseq_wrappers.generate(argv)
    err = capsys.readouterr().err
    assert e.value.code == 2 and "Traceback" not in err
    assert err.strip().splitlines()[-1].startswith(f"lsg-fairseq-generate: error: {expected}")
    assert "--gen-subset" in err.strip().splitlines()[-1]
    proc = subprocess.run(
        [
            fairseq_cli("fairseq-generate"),
            *argv,
            "--user-dir",
            lsg_fairseq.user_dir(),
            "--task",
            "long_document_summarization",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert proc.stderr.strip().splitlines()[-1].startswith(f"fairseq-generate: error: {expected}")


def word_model_with_gpt2_files(tmp_path, word_data, checkpoint: bytes, encoder_json: str):
    """A model folder: ``checkpoint`` as model.pt, the word-level dict.txt, tiny GPT-2 BPE files; and
    tmp_path/doc.txt, a document to summarize."""
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    (model_dir / "model.pt").write_bytes(checkpoint)
    (model_dir / "dict.txt").write_text(open(os.path.join(word_data, "dict.source.txt")).read())
    (model_dir / "encoder.json").write_text(encoder_json)
    (model_dir / "vocab.bpe").write_text("#version: 0.2\n")
    (tmp_path / "doc.txt").write_text("a document\n")
    return model_dir


def test_summarize_corrupt_checkpoint_named(tiny_checkpoint, word_data, tmp_path, capsys):
    from lsg_fairseq.cli import summarize

    data = open(tiny_checkpoint, "rb").read()
    model_dir = word_model_with_gpt2_files(tmp_path, word_data, data[: len(data) // 3], "{}")
    with pytest.raises(SystemExit) as e:
        summarize.main([str(model_dir), str(tmp_path / "doc.txt"), "--output", str(tmp_path / "out.txt")])
    assert e.value.code == 2
    assert f"{model_dir / 'model.pt'}: truncated or corrupt checkpoint" in capsys.readouterr().err
    assert not (tmp_path / "out.txt").exists()


def test_interactive_without_bpe_on_a_converted_model_is_refused(tmp_path, capsys, monkeypatch):
    """A converted model's folder (tokenizer.txt: gpt2) read by fairseq-interactive without --bpe:
    every input word was <unk>, a summary of nothing came out, exit 0."""
    from lsg_fairseq.cli import fairseq_wrappers
    from lsg_fairseq.convert import convert

    model = tmp_path / "model"
    convert(os.path.join(FIXTURES, "lsg", "bart_plain", "hf"), str(model))
    monkeypatch.setattr("sys.stdin", io.StringIO("a document\n"))
    monkeypatch.setattr("sys.argv", ["lsg-fairseq-interactive"])
    with pytest.raises(SystemExit) as e:
        fairseq_wrappers.interactive([str(model), "--path", str(model / "model.pt"), "--cpu"])
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert e.value.code == 2 and line == (
        f"lsg-fairseq-interactive: error: --bpe is not given, but {model / 'tokenizer.txt'} says the model reads "
        f"gpt2 pieces: every input word would be <unk>; pass --bpe gpt2 --gpt2-encoder-json {model / 'encoder.json'} "
        f"--gpt2-vocab-bpe {model / 'vocab.bpe'}"
    ), line


def test_interactive_wrapper_needs_no_user_dir_or_task(word_data, tiny_checkpoint, tmp_path, capsys, monkeypatch):
    from lsg_fairseq.cli import fairseq_wrappers

    (tmp_path / "docs.txt").write_text("the patients were treated\nresults show a decrease\n")
    monkeypatch.setattr("sys.argv", ["lsg-fairseq-interactive"])
    fairseq_wrappers.interactive(
        [
            str(word_data),
            "--path",
            tiny_checkpoint,
            "--input",
            str(tmp_path / "docs.txt"),
            "--beam",
            "1",
            "--max-len-b",
            "4",
            "--max-source-positions",
            "128",
            "--max-target-positions",
            "64",
            "--cpu",
        ]
    )
    out = capsys.readouterr().out
    assert [line.split("\t")[0] for line in out.splitlines() if line.startswith("H-")] == ["H-0", "H-1"]


def test_interactive_truncates_a_line_longer_than_the_model(word_data, tiny_checkpoint, tmp_path, capsys, monkeypatch):
    """A typed document longer than --max-source-positions is truncated, as a binarized split's is
    (it was refused, with advice to lower the flag to the value already given)."""
    from lsg_fairseq.cli import fairseq_wrappers

    (tmp_path / "docs.txt").write_text(" ".join(["the patients were treated"] * 60) + "\nresults show a decrease\n")
    monkeypatch.setattr("sys.argv", ["lsg-fairseq-interactive"])
    fairseq_wrappers.interactive(
        [str(word_data), "--path", tiny_checkpoint, "--input", str(tmp_path / "docs.txt"), "--beam", "1"]
        + ["--max-len-b", "4", "--max-source-positions", "128", "--max-target-positions", "64", "--cpu"]
        + ["--buffer-size", "2", "--batch-size", "2"]
    )
    out = capsys.readouterr().out
    assert [line.split("\t")[0] for line in out.splitlines() if line.startswith("H-")] == ["H-0", "H-1"]
    source = next(line for line in out.splitlines() if line.startswith("S-0")).split("\t")[1].split()
    assert len(source) == 128 - 2  # <s> and </s> besides, as in a split truncated to 128


@pytest.fixture(scope="module")
def separate_dictionaries(word_data, tmp_path_factory):
    """The word-level data binarized as fairseq-preprocess does by default: one dictionary per side."""
    from conftest import fairseq_cli

    raw, dest = os.path.join(word_data, "..", "raw"), tmp_path_factory.mktemp("separate_dicts")
    subprocess.run(
        [fairseq_cli("fairseq-preprocess"), "--source-lang", "source", "--target-lang", "target"]
        + ["--trainpref", os.path.join(raw, "train"), "--validpref", os.path.join(raw, "valid")]
        + ["--destdir", str(dest), "--nwordssrc", "2000", "--nwordstgt", "500", "--workers", "1"],
        check=True,
        capture_output=True,
    )
    return dest


@pytest.mark.parametrize("arch", ["lsg_bart_tiny", "led_tiny"])
@pytest.mark.parametrize(
    "flags,expected",
    [
        (["--encoder-attention-heads", "3"], "--encoder-attention-heads 3 must divide --encoder-embed-dim 16"),
        (["--decoder-attention-heads", "3"], "--decoder-attention-heads 3 must divide --decoder-embed-dim 16"),
        (["--decoder-embed-dim", "32"], "--decoder-embed-dim 32 differs from --encoder-embed-dim 16"),
        (["--dropout", "1.5"], "--dropout 1.5: must be a number in [0, 1)"),
        (["--attention-dropout", "2"], "--attention-dropout 2.0: must be a number in [0, 1)"),
        (["--dropout", "-0.5"], "--dropout -0.5: must be a number in [0, 1)"),
        (["--relu-dropout", "1.5"], "--relu-dropout 1.5: must be a number in [0, 1)"),  # a ValueError in forward
        (["--encoder-layerdrop", "1.5"], "--encoder-layerdrop 1.5: must be a number in [0, 1)"),  # trained, exit 0
        (["--encoder-ffn-embed-dim", "0"], "--encoder-ffn-embed-dim 0: must be an integer >= 1"),  # ZeroDivisionError
        # an in-place RuntimeError in backward; with adaptive_loss and legacy_ddp, a checkpoint that does not load
        (["--adaptive-softmax-cutoff", "100,200"], "--adaptive-softmax-cutoff 100,200: not supported by"),
        (
            ["--encoder-layers-to-keep", "0"],
            "--encoder-layers-to-keep: fairseq 0.12's layer pruning fails",
        ),  # AttributeError
        # a KeyError when the model is built (no int8 form of LearnedPositionalEmbedding)
        (["--quant-noise-scalar", "0.1"], "--quant-noise-scalar 0.1: fairseq's scalar quantization noise has no"),
        # the first forward's shape RuntimeError: the output layer is the embedding
        (["--decoder-output-dim", "32"], "--decoder-output-dim 32 differs from --decoder-embed-dim 16"),
        # parsed, then read by none of BART's modules: trained without them, without a word
        (["--adaptive-input"], "--adaptive-input: "),
        (["--tie-adaptive-weights"], "--tie-adaptive-weights: "),
        ("separate", ": dict.source.txt (2001 symbols) and dict.target.txt (505) differ, but"),
    ],
)
def test_bart_family_flags_and_dictionaries_refused_in_one_line(
    word_data, separate_dictionaries, tmp_path, capsys, monkeypatch, arch, flags, expected
):
    """fairseq's BART refuses these with a traceback (a ValueError or assert at build time, or in
    the first forward for a dropout of 1.5) or not at all (-0.5); LOCOST refused them already."""
    from test_user_errors import TRAIN, fairseq_train

    data, flags = (separate_dictionaries, []) if flags == "separate" else (word_data, flags)
    code, err = fairseq_train(
        [str(data), "--user-dir", lsg_fairseq.user_dir(), "--arch", arch, *TRAIN]
        + ["--save-dir", str(tmp_path / "ck"), *flags],
        capsys,
        monkeypatch,
    )
    assert code == 2 and "Traceback" not in err, err[-2000:]
    assert err.strip().splitlines()[-1].startswith("fairseq-train: error: ") and expected in err, err[-500:]
    assert not (tmp_path / "ck" / "checkpoint_last.pt").exists()


def test_generate_with_another_vocabulary_is_one_line(word_data, tiny_checkpoint, tmp_path, capsys, monkeypatch):
    """The data folder of another vocabulary (here one symbol more) for a checkpoint: one line naming
    both sizes, not torch's size-mismatch traceback; also for fairseq-train --finetune-from-model."""
    import shutil

    from lsg_fairseq.cli import fairseq_wrappers

    data = tmp_path / "other_vocabulary"
    shutil.copytree(word_data, data)
    for name in ("dict.source.txt", "dict.target.txt"):
        with open(data / name, "a") as f:
            f.write("zzzextra 1\n")
    monkeypatch.setattr("sys.argv", ["lsg-fairseq-generate"])
    with pytest.raises(SystemExit) as e:
        fairseq_wrappers.generate([str(data), "--path", tiny_checkpoint, "--gen-subset", "valid", "--cpu"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and "Traceback" not in err
    line = err.strip().splitlines()[-1]
    assert line.startswith("lsg-fairseq-generate: error: the checkpoint's vocabulary has ") and "give the data" in line
    assert "--task" not in line  # one symbol more in the data: not the <mask> a missing --task leaves out


def test_one_symbol_fewer_than_the_checkpoint_names_the_task(word_data, tiny_checkpoint, tmp_path, capsys, monkeypatch):
    """One symbol fewer than the checkpoint is what a command without this plugin's --task reads (its
    tasks add <mask>): the message says so beside the data folder."""
    import shutil

    from lsg_fairseq.cli import fairseq_wrappers

    data = tmp_path / "one_fewer"
    shutil.copytree(word_data, data)
    for name in ("dict.source.txt", "dict.target.txt"):
        lines = (data / name).read_text().splitlines(keepends=True)
        (data / name).write_text("".join(lines[:-1]))
    monkeypatch.setattr("sys.argv", ["lsg-fairseq-generate"])
    with pytest.raises(SystemExit) as e:
        fairseq_wrappers.generate([str(data), "--path", tiny_checkpoint, "--gen-subset", "valid", "--cpu"])
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert e.value.code == 2 and "the checkpoint's vocabulary has " in line
    assert line.endswith(
        "one symbol apart, the run lacks the checkpoint's --task (e.g. --task "
        "long_document_summarization: its tasks add <mask> to the dictionary)"
    ), line


def test_a_damaged_dictionary_is_one_line_naming_its_line(word_data, tiny_checkpoint, tmp_path, capsys, monkeypatch):
    """A dict.txt with a line fairseq cannot parse, read through the task (generate, and the
    converter and exporter, which load the dictionary beside a checkpoint): the file and its line
    named in one line, not fairseq's ValueError traceback; nothing written."""
    import shutil

    from lsg_fairseq.cli import fairseq_wrappers
    from lsg_fairseq.cli.convert import main as convert_main
    from lsg_fairseq.cli.export import main as export_main

    data, model = tmp_path / "data", tmp_path / "model"
    shutil.copytree(word_data, data)
    model.mkdir()
    shutil.copy(tiny_checkpoint, model / "model.pt")
    for path in (data / "dict.source.txt", model / "dict.txt"):
        lines = (word_data / "dict.source.txt").read_text().splitlines(keepends=True)
        path.write_text("".join(lines[:3] + ["garbage line\n"] + lines[3:]))
    monkeypatch.setattr("sys.argv", ["lsg-fairseq-generate"])
    runs = (
        (lambda: fairseq_wrappers.generate([str(data), "--path", tiny_checkpoint, "--cpu"]), data / "dict.source.txt"),
        (lambda: convert_main([str(model), str(tmp_path / "converted"), "--to", "lsg_bart"]), model / "dict.txt"),
        (lambda: export_main([str(model), str(tmp_path / "hf")]), model / "dict.txt"),
    )
    for run, culprit in runs:
        with pytest.raises(SystemExit) as e:
            run()
        err = capsys.readouterr().err
        assert e.value.code == 2 and "Traceback" not in err, err[-2000:]
        assert f"{culprit}: not a fairseq dict.txt (line 4 is 'garbage line'" in err.strip().splitlines()[-1]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data", "model"]


def test_generate_without_path_and_finetune_from_nothing_are_one_line(word_data, tmp_path, capsys, monkeypatch):
    from lsg_fairseq.cli import fairseq_wrappers
    from test_user_errors import TRAIN, fairseq_train

    for command in (fairseq_wrappers.generate, fairseq_wrappers.interactive):
        with pytest.raises(SystemExit) as e:
            command([str(word_data), "--cpu"])
        assert e.value.code == 2 and "error: --path is required" in capsys.readouterr().err
    code, err = fairseq_train(
        [str(word_data), "--user-dir", lsg_fairseq.user_dir(), "--arch", "lsg_bart_tiny", *TRAIN]
        + ["--save-dir", str(tmp_path / "ck"), "--finetune-from-model", str(tmp_path / "nope.pt")],
        capsys,
        monkeypatch,
    )
    assert code == 2 and "Traceback" not in err
    line = err.strip().splitlines()[-1]
    assert line.startswith(f"fairseq-train: error: --finetune-from-model {tmp_path / 'nope.pt'}: no such file")


@pytest.mark.parametrize(
    "flags,expected",
    [
        (["--beam", "0"], "--beam 0: must be"),
        (["--max-len-b", "-1"], "--max-len-b -1: must be"),
        (["--min-len", "9", "--max-len-b", "4"], "--min-len 9 is above --max-len-b 4"),
        # above the decoder's positions: fairseq's AssertionError in every generation call
        (["--min-len", "5000", "--max-len-b", "6000"], "--min-len 5000 (or --eval-rouge-args' min_len): the model"),
        (["--match-source-len"], "--match-source-len: a source of"),  # an IndexError past the decoder's positions
        (["--max-tokens", "10"], "more than --max-tokens 10"),
        ("results_path_is_a_file", "--results-path {}: exists and is not a folder"),
        ("results_path_below_a_file", "--results-path {}/run1: {} is a file, not a folder"),  # NotADirectoryError
        # fairseq's own, with the plugin's task refused before any work (lsg_fairseq/tasks/run_settings.py)
        (["--sampling", "--beam", "4", "--nbest", "1"], "--nbest 1: with --sampling it must equal --beam (4)"),
        (["--nbest", "0"], "--nbest 0: must be an integer >= 1"),  # ZeroDivisionError
        (["--diverse-beam-groups", "3", "--beam", "4"], "--diverse-beam-groups 3: must divide --beam (4)"),
        # fairseq-generate 0.12 shards by the distributed rank only: each "shard" generated every example, exit 0
        (["--shard-id", "1", "--num-shards", "2"], "--num-shards 2: fairseq-generate does not read it"),
        (["--shard-id", "3"], "--shard-id 3: fairseq-generate does not read it"),
        # ... its batches of shard --distributed-rank of it, exit 0, or a ZeroDivisionError when none
        (
            ["--distributed-world-size", "2", "--distributed-rank", "1"],
            "--distributed-world-size 2: fairseq-generate runs in one process and would generate only its batches "
            "of shard 1 (--distributed-rank) of 2, none if the split makes fewer batches; drop it",
        ),
        (["--seed", "-1"], "--seed -1: must be an integer in [0, 4294967295]"),
        (["--batch-size", "0"], "--batch-size 0: must be an integer >= 1"),
        (["--print-step"], "--print-step: only for fairseq's iterative refinement models"),  # KeyError
        (["--replace-unk"], "--replace-unk: fairseq-generate replaces <unk> from raw text datasets only"),
        (["--constraints"], "--constraints: fairseq-generate's binarized data carries none"),  # TypeError
        (["--post-process", "gpt2"], "--post-process gpt2: not one of fairseq's"),  # NotImplementedError
        (["--required-seq-len-multiple", "0"], "--required-seq-len-multiple 0: must be an integer >= 1"),
        (["--lm-path", "nope.pt"], "--lm-path: file not found: nope.pt"),  # OSError
        (  # a TypeError in the first search step: the language model is called as a decoder-only one
            ["--lm-path", "CKPT"],
            "--lm-path CKPT: a checkpoint of --task long_document_summarization, not a language model",
        ),
        (["--model-overrides", "nonsense"], "--model-overrides nonsense: must be a Python dict"),  # ValueError
        (  # torch's size-mismatch traceback once the model was built with the override
            ["--model-overrides", "{'max_source_positions': 256}"],
            "in this model: the model built from the checkpoint's settings as changed (--model-overrides, and "
            "fairseq-validate's own flags such as --max-target-positions, which it applies to the model) does not fit "
            "its weights; extend it with `lsg-fairseq-convert CHECKPOINT OUT_DIR --max-source-positions 256`",
        ),
        # the tokenizer's files, once the models are loaded: a download of fairseq's GPT-2 files (no
        # internet: a ConnectionError), omegaconf's MissingMandatoryValue, OSErrors
        (["--bpe", "gpt2"], "--gpt2-encoder-json https://dl.fbaipublicfiles.com/fairseq/gpt2_bpe/encoder.json: a URL"),
        (
            ["--bpe", "sentencepiece"],
            "--sentencepiece-model is required with --bpe sentencepiece: the model's spm.model",
        ),
        (["--bpe", "sentencepiece", "--sentencepiece-model", "nope.model"], "--sentencepiece-model: file not found"),
        (
            ["--bpe", "gpt2", "--gpt2-encoder-json", "nope.json", "--gpt2-vocab-bpe", "nope.bpe"],
            "--gpt2-encoder-json: file not found: nope.json",
        ),
        # the split is there, binarized (mmap): fairseq's assert on the index header; raw: "no 'valid' split"
        (["--dataset-impl", "lazy"], "the 'valid' split is not in the format --dataset-impl lazy reads; drop"),
        (["--dataset-impl", "raw"], "the 'valid' split is not in the format --dataset-impl raw reads; drop"),
    ],
)
def test_generate_flags_refused_in_one_line(word_data, tiny_checkpoint, tmp_path, capsys, monkeypatch, flags, expected):
    """fairseq's own errors: a reshape RuntimeError (--beam 0), asserts (--max-len-b -1, --min-len
    above it, an example above --max-tokens), a FileExistsError (--results-path naming a file), a
    NotADirectoryError (below one)."""
    from lsg_fairseq.cli import fairseq_wrappers

    if "CKPT" in flags:
        flags, expected = (
            [tiny_checkpoint if f == "CKPT" else f for f in flags],
            expected.replace("CKPT", tiny_checkpoint),
        )
    if flags in ("results_path_is_a_file", "results_path_below_a_file"):
        (tmp_path / "afile").write_text("kept\n")
        path = tmp_path / "afile" if flags.endswith("is_a_file") else tmp_path / "afile" / "run1"
        flags, expected = ["--results-path", str(path)], expected.format(tmp_path / "afile", tmp_path / "afile")
    monkeypatch.setattr("sys.argv", ["lsg-fairseq-generate"])
    with pytest.raises(SystemExit) as e:
        fairseq_wrappers.generate(
            [str(word_data), "--path", tiny_checkpoint, "--gen-subset", "valid", "--cpu", "--truncate-target"]
            + ["--max-source-positions", "128", "--max-target-positions", "64", *flags]
        )
    err = capsys.readouterr().err
    assert e.value.code == 2 and "Traceback" not in err
    assert err.strip().splitlines()[-1].startswith("lsg-fairseq-generate: error: ") and expected in err, err[-600:]
    assert not (tmp_path / "afile").exists() or (tmp_path / "afile").read_text() == "kept\n"


GOOD_ENCODER = {"a": 0, "b": 1, "ab": 2}


@pytest.mark.parametrize(
    "encoder,vocab,expected",
    [
        (GOOD_ENCODER, "#version: 0.2\na b\n", None),
        # fairseq's get_encoder drops the first and the last line of vocab.bpe: a merge lost, no error
        (GOOD_ENCODER, "a b\n", "--gpt2-vocab-bpe: {vocab}: first line must be the '#version: ...' header"),
        (GOOD_ENCODER, "#version: 0.2\na b", "--gpt2-vocab-bpe: {vocab}: missing trailing newline"),
        ("<unk> 1\n", "#version: 0.2\na b\n", "--gpt2-encoder-json: {encoder} is not a JSON file"),
        (
            "[" * 100_000,
            "#version: 0.2\na b\n",
            "--gpt2-encoder-json: {encoder} is not a JSON file (nested too deeply)",
        ),
    ],
    ids=["good", "no_header", "no_last_newline", "encoder_not_json", "encoder_nested_too_deeply"],
)
def test_bpe_gpt2_files_are_read_as_fairseq_reads_them(tmp_path, encoder, vocab, expected):
    from omegaconf import OmegaConf

    from lsg_fairseq.tasks.run_settings import check_bpe_files
    from lsg_text.errors import UserError

    enc, voc = tmp_path / "encoder.json", tmp_path / "vocab.bpe"
    enc.write_text(encoder if isinstance(encoder, str) else json.dumps(encoder))
    voc.write_text(vocab)
    bpe = OmegaConf.create({"_name": "gpt2", "gpt2_encoder_json": str(enc), "gpt2_vocab_bpe": str(voc)})
    if expected is None:
        check_bpe_files(bpe)
        return
    with pytest.raises(UserError) as e:
        check_bpe_files(bpe)
    assert str(e.value).startswith(expected.format(vocab=voc, encoder=enc)), e.value


def test_generate_with_a_vocab_bpe_fairseq_would_misread_is_one_line(word_data, tiny_checkpoint, tmp_path, capsys):
    from lsg_fairseq.cli import fairseq_wrappers

    (tmp_path / "encoder.json").write_text(json.dumps(GOOD_ENCODER))
    (tmp_path / "vocab.bpe").write_text("a b\n")  # no '#version' header
    with pytest.raises(SystemExit) as e:
        fairseq_wrappers.generate(
            [str(word_data), "--path", tiny_checkpoint, "--gen-subset", "valid", "--cpu", "--bpe", "gpt2"]
            + ["--gpt2-encoder-json", str(tmp_path / "encoder.json"), "--gpt2-vocab-bpe", str(tmp_path / "vocab.bpe")]
        )
    err = capsys.readouterr().err
    assert e.value.code == 2 and "Traceback" not in err
    assert "--gpt2-vocab-bpe: " in err.strip().splitlines()[-1] and "'#version: ...' header" in err, err[-600:]


def test_each_tokenizer_package_is_the_one_fairseq_imports():
    """TOKENIZER_PACKAGES names, for each --tokenizer/--bpe, the package its fairseq class imports."""
    import inspect
    import re

    from fairseq.registry import REGISTRIES

    from lsg_fairseq.tasks.run_settings import TOKENIZER_PACKAGES

    import lsg_fairseq.tasks  # noqa: F401  (fairseq's encoders registered)

    for (group, name), (module, _) in TOKENIZER_PACKAGES.items():
        source = inspect.getsource(REGISTRIES[group]["registry"][name])
        assert re.search(rf"\b(import|from) {module}[\s.]", source), (group, name, module)


def test_generate_with_a_tokenizer_whose_package_is_missing_is_one_line(
    word_data, tiny_checkpoint, capsys, monkeypatch
):
    """fairseq's own: an ImportError traceback once the models are loaded."""
    import importlib.util

    from lsg_fairseq.cli import fairseq_wrappers

    find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "sacremoses" else find_spec(name, *a)
    )
    with pytest.raises(SystemExit) as e:
        fairseq_wrappers.generate(
            [str(word_data), "--path", tiny_checkpoint, "--gen-subset", "valid", "--cpu", "--tokenizer", "moses"]
            + [
                "--truncate-source",
                "--max-source-positions",
                "128",
                "--max-target-positions",
                "64",
                "--truncate-target",
            ]
        )
    err = capsys.readouterr().err
    assert e.value.code == 2 and "Traceback" not in err
    assert err.strip().splitlines()[-1] == (
        "lsg-fairseq-generate: error: --tokenizer moses: fairseq's moses tokenizer needs the package sacremoses, "
        "which is not installed here (pip install sacremoses)"
    ), err[-600:]


def test_generate_refused_before_any_work_keeps_earlier_results(word_data, tiny_checkpoint, tmp_path, capsys):
    """A refusal before fairseq opens generate-valid.txt leaves an earlier run's file as it was (a
    refusal after it, e.g. out of memory, removes this run's partial file: test_device_policy.py)."""
    from lsg_fairseq.cli import fairseq_wrappers

    (tmp_path / "generate-valid.txt").write_text("an earlier run\n")
    with pytest.raises(SystemExit) as e:
        fairseq_wrappers.generate(
            [str(word_data), "--path", tiny_checkpoint, "--gen-subset", "valid", "--cpu", "--nbest", "0"]
            + ["--results-path", str(tmp_path)]
        )
    assert e.value.code == 2 and "--nbest 0: must be" in capsys.readouterr().err
    assert (tmp_path / "generate-valid.txt").read_text() == "an earlier run\n"


@pytest.mark.parametrize(
    "flags,expected",
    [
        (["--nbest", "0"], "--nbest 0: must be an integer >= 1"),
        (  # a download of fairseq's GPT-2 files: a ConnectionError without internet
            ["--bpe", "gpt2", "--gpt2-encoder-json", "ENC", "--gpt2-vocab-bpe", "https://example.org/vocab.bpe"],
            "--gpt2-vocab-bpe https://example.org/vocab.bpe: a URL, which fairseq would download at run time; give "
            "the model's own file (e.g. --gpt2-vocab-bpe MODEL_DIR/vocab.bpe: lsg-fairseq-convert writes it beside "
            "model.pt)",
        ),
        (  # fairseq's AssertionError
            ["--batch-size", "4"],
            "--batch-size 4: must not exceed --buffer-size (1; lines read at a time): pass --buffer-size 4 or more",
        ),
        # --input: fairseq's FileNotFoundError / UnicodeDecodeError once the model is loaded
        (["--input", "nothere.txt"], "--input: file not found: nothere.txt"),
        # spawned processes read /dev/null: nothing printed, exit 0
        (
            ["--distributed-world-size", "2"],
            "--distributed-world-size 2: fairseq-interactive reads its input in one process, and the processes "
            "fairseq would spawn for it read none (nothing would be printed); drop it",
        ),
        (
            ["--input", "LATIN1"],
            "--input: LATIN1: not UTF-8 text (byte offset 3, line 1: invalid continuation byte); convert it to "
            "UTF-8 text",
        ),
    ],
)
def test_interactive_flags_refused_in_one_line(word_data, tiny_checkpoint, capsys, monkeypatch, flags, expected):
    from lsg_fairseq.cli import fairseq_wrappers

    flags = [str(word_data / "dict.source.txt") if f == "ENC" else f for f in flags]  # a file that is there
    if "LATIN1" in flags:
        latin1 = word_data.parent / "latin1.txt"
        latin1.write_bytes(b"caf\xe9 au lait\n")  # byte 3 is not UTF-8
        flags, expected = [str(latin1) if f == "LATIN1" else f for f in flags], expected.replace("LATIN1", str(latin1))
    monkeypatch.setattr("sys.stdin", io.StringIO("a document\n"))
    with pytest.raises(SystemExit) as e:
        fairseq_wrappers.interactive([str(word_data), "--path", tiny_checkpoint, "--cpu", *flags])
    err = capsys.readouterr().err
    assert e.value.code == 2 and "Traceback" not in err
    assert err.strip().splitlines()[-1] == f"lsg-fairseq-interactive: error: {expected}"


@pytest.mark.parametrize(
    "flags,expected",
    [
        (["--max-tokens", "4096"], "--path is required: the checkpoint to validate"),  # AttributeError of None
        (["--max-tokens", "4096", "--path", "nope.pt"], "--path nope.pt: no such checkpoint file"),  # OSError
        (["--path", "CKPT"], "--max-tokens or --batch-size is required"),  # AssertionError
        (["--path", "CKPT", "--max-tokens", "4096", "--model-overrides", "x"], "--model-overrides x: must be"),
        # the checkpoint's task is built whatever --task says: the flag was ignored (here exit 0, the
        # summarization loss reported as a GSG model's)
        (
            ["--path", "CKPT", "--max-tokens", "4096", "--task", "gap_sentence_generation"],
            "--task gap_sentence_generation: CKPT was trained with --task long_document_summarization, and "
            "fairseq-validate evaluates with the checkpoint's own task",
        ),
        (  # applied to the model: torch's size-mismatch traceback (the checkpoint's decoder table is 64)
            ["--path", "CKPT", "--max-tokens", "4096", "--max-target-positions", "16", "--truncate-target"],
            "decoder.embed_positions.weight is [66, 16] in the checkpoint, [18, 16] in this model",
        ),
        (  # fairseq-validate has no default task: KeyError: None from fairseq's parser
            ["--path", "CKPT", "--max-tokens", "4096", "--task", None],
            "the following arguments are required: --task",
        ),
    ],
)
def test_validate_flags_refused_in_one_line(word_data, tiny_checkpoint, capsys, monkeypatch, flags, expected):
    """fairseq-validate (fairseq's own main, through call_main and the task's vet_run)."""
    from fairseq_cli import validate

    flags = [tiny_checkpoint if f == "CKPT" else f for f in flags]
    expected = expected.replace("CKPT", tiny_checkpoint)
    argv = [str(word_data), "--user-dir", lsg_fairseq.user_dir(), "--task", "long_document_summarization", "--cpu"]
    if flags[-2] == "--task":  # given in flags, or (None) not at all
        argv = argv[:3] + argv[5:] + ([] if flags[-1] is None else flags[-2:])
        flags = flags[:-2]
    monkeypatch.setattr("sys.argv", ["fairseq-validate", *argv, *flags])
    # fairseq-validate's main replaces the root logger's handlers by one on sys.stdout (here capsys's,
    # closed after this test): the later tests in this process would log into a closed stream
    root = logging.getLogger()
    monkeypatch.setattr(root, "handlers", root.handlers[:])
    monkeypatch.setattr(root, "level", root.level)
    with pytest.raises(SystemExit) as e:
        validate.cli_main()
    err = capsys.readouterr().err
    assert e.value.code == 2 and "Traceback" not in err
    assert err.strip().splitlines()[-1].startswith(f"fairseq-validate: error: {expected}")


@pytest.mark.parametrize("task", ["long_document_summarization", "gap_sentence_generation"])
def test_data_folder_mistakes_name_what_to_run(word_data, tmp_path, capsys, monkeypatch, task):
    """A data path that is a file is called one (not "does not exist"); a folder without a training
    split names the command that writes one for the task: preprocess.sh, or gsg_preprocess.py."""
    from test_user_errors import TRAIN, fairseq_train

    (tmp_path / "afile").write_text("x\n")
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "dict.txt").write_text(open(os.path.join(word_data, "dict.source.txt")).read())
    maker = "scripts/preprocess.sh --trainpref" if task.startswith("long") else "scripts/gsg_preprocess.py --input"
    for data, expected in ((tmp_path / "afile", "is a file, not a data folder"), (empty, maker)):
        argv = [str(data), "--user-dir", lsg_fairseq.user_dir(), "--arch", "lsg_bart_tiny", *TRAIN]
        argv[argv.index("--task") + 1] = task
        code, err = fairseq_train(argv + ["--save-dir", str(tmp_path / "ck")], capsys, monkeypatch)
        assert code == 2 and "Traceback" not in err
        assert err.strip().splitlines()[-1].startswith("fairseq-train: error: ") and expected in err, err[-600:]


def test_save_dir_that_is_a_file_refused_before_any_work(word_data, tmp_path, capsys, monkeypatch):
    """fairseq's own: NotADirectoryError ('afile/dummy') when it first writes into --save-dir."""
    from test_user_errors import TRAIN, fairseq_train

    (tmp_path / "afile").write_text("kept\n")
    code, err = fairseq_train(
        [str(word_data), "--user-dir", lsg_fairseq.user_dir(), "--arch", "lsg_bart_tiny", *TRAIN]
        + ["--save-dir", str(tmp_path / "afile")],
        capsys,
        monkeypatch,
    )
    assert code == 2 and "Traceback" not in err
    expected = f"--save-dir {tmp_path / 'afile'}: exists and is not a folder (choose another output folder)"
    assert err.strip().splitlines()[-1] == f"fairseq-train: error: {expected}"
    assert (tmp_path / "afile").read_text() == "kept\n"


def test_summarize_word_dictionary_with_gpt2_files_refused_before_generating(
    word_data, tiny_checkpoint, tmp_path, capsys
):
    """A word-level dict.txt beside GPT-2 BPE files: fairseq's decoder failed with int()'s ValueError
    after the whole generation; now one line naming dict.txt, before it."""
    from lsg_fairseq.cli import summarize

    model_dir = word_model_with_gpt2_files(tmp_path, word_data, open(tiny_checkpoint, "rb").read(), '{"a": 0}')
    with pytest.raises(SystemExit) as e:
        summarize.main([str(model_dir), str(tmp_path / "doc.txt"), "--output", str(tmp_path / "out.txt")])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith(f"lsg-fairseq-summarize: error: {model_dir / 'dict.txt'}: holds ") and "not a GPT-2" in err
    assert not (tmp_path / "out.txt").exists()


# ----------------------------------------------------------------------------- fairseq-train's own settings
# (flags, the one line), one case per row of TRAINING_SETTINGS and --adam-betas: fairseq checks none of
# them; out of range it fails late (a traceback after the data and model are loaded) or trains
# nothing, or wrongly, without a word (what each did is in the comment)
TRAINING_CASES = [
    (["--lr", "0.001,-1"], "--lr 0.001,-1: must be a number >= 0"),  # -1: stops at once, exit 0
    (["--update-freq", "0"], "--update-freq 0: must be an integer >= 1"),  # ZeroDivisionError
    (["--max-update", "-5"], "--max-update -5: must be an integer >= 0"),  # stops after 1 update
    (["--max-epoch", "-1"], "--max-epoch -1: must be an integer >= 0"),  # trains no epoch, exit 0
    (["--clip-norm", "-1"], "--clip-norm -1: must be a number >= 0"),  # no clipping
    (["--max-tokens", "0"], "--max-tokens 0: must be an integer >= 1"),
    (["--batch-size", "0"], "--batch-size 0: must be an integer >= 1"),  # no limit
    (["--batch-size-valid", "-2"], "--batch-size-valid -2: must be an integer >= 1"),
    (["--max-tokens-valid", "0"], "--max-tokens-valid 0: must be an integer >= 1"),
    (["--num-workers", "-1"], "--num-workers -1: must be an integer >= 0"),  # torch's ValueError
    (["--required-seq-len-multiple", "0"], "--required-seq-len-multiple 0: must be an integer >= 1"),  # ZeroDivision
    (["--validate-interval", "0"], "--validate-interval 0: must be an integer >= 1"),  # at an epoch's end
    (["--validate-interval-updates", "-1"], "--validate-interval-updates -1: must be an integer >= 0"),
    (["--save-interval", "0"], "--save-interval 0: must be an integer >= 1"),  # at an epoch's end
    (["--save-interval-updates", "-1"], "--save-interval-updates -1: must be an integer >= 0"),
    (["--keep-interval-updates", "-5"], "--keep-interval-updates -5: must be an integer >= -1"),  # as -1: all
    (["--keep-last-epochs", "-2"], "--keep-last-epochs -2: must be an integer >= -1"),  # as -1: keeps all
    (["--keep-best-checkpoints", "-3"], "--keep-best-checkpoints -3: must be an integer >= -1"),
    (["--patience", "-10"], "--patience -10: must be an integer >= -1"),  # as -1: never stops early
    (["--seed", "-1"], "--seed -1: must be an integer in [0, 4294967295]"),  # numpy's ValueError
    (["--log-interval", "0"], "--log-interval 0: must be an integer >= 1"),  # ZeroDivisionError
    (["--weight-decay", "-1"], "--weight-decay -1: must be a number >= 0"),  # weights grow
    (["--adam-eps", "-0.5"], "--adam-eps -0.5: must be a number > 0"),
    (["--optimizer", "sgd", "--momentum", "2"], "--momentum 2: must be a number in [0, 1)"),  # diverges, exit 0
    (["--lr-scheduler", "inverse_sqrt", "--warmup-updates", "-10"], "--warmup-updates -10: must be an integer >= 0"),
    (  # the rate turns negative at the schedule's end: gradient ascent, exit 0
        ["--lr-scheduler", "polynomial_decay", "--total-num-update", "10", "--end-learning-rate", "-1"],
        "--end-learning-rate -1: must be a number >= 0",
    ),
    (  # the rate grows as the schedule ends
        ["--lr-scheduler", "polynomial_decay", "--total-num-update", "10", "--power", "-1"],
        "--power -1: must be a number > 0",
    ),
    (["--lr-scheduler", "cosine", "--min-lr", "-1"], "--min-lr -1: must be a number >= 0"),
    (
        ["--criterion", "label_smoothed_cross_entropy", "--label-smoothing", "2"],  # trains, on a wrong loss
        "--label-smoothing 2: must be a number in [0, 1)",
    ),
    (["--store-ema", "--ema-decay", "1.5"], "--ema-decay 1.5: must be a number in [0, 1]"),  # trained, exit 0
    (["--adam-betas", "(0.9, 2)"], "--adam-betas (0.9, 2): must be two numbers in [0, 1), e.g. '(0.9, 0.98)'"),
    (["--adam-betas", "nonsense"], "--adam-betas nonsense: must be two numbers in [0, 1), e.g. '(0.9, 0.98)'"),
]


def training_cfg(data, *flags, optimizer=("--optimizer", "adam")):
    argv = [str(data), "--user-dir", lsg_fairseq.user_dir(), "--task", "long_document_summarization"]
    argv += [*TINY_LSG_BART, *optimizer, "--lr", "1e-3", "--max-tokens", "2048", "--cpu", *flags]
    return training_config(argv)


def test_a_quantization_config_that_is_not_there_refused(word_data):
    """fairseq's own: a FileNotFoundError traceback once the data and the model are loaded."""
    from lsg_fairseq.tasks.run_settings import check_training_args
    from lsg_text.errors import UserError

    with pytest.raises(UserError, match=r"^--quantization-config-path: file not found: nowhere\.yaml$"):
        check_training_args(training_cfg(word_data, "--quantization-config-path", "nowhere.yaml"))


def test_training_without_an_optimizer_refused(word_data):
    """fairseq's own: "ValueError: optimizer is required!" once the data and the model are loaded."""
    from lsg_fairseq.tasks.run_settings import check_training_args
    from lsg_text.errors import ConfigError

    with pytest.raises(ConfigError, match=r"^--optimizer is required \(e.g. --optimizer adam;"):
        check_training_args(training_cfg(word_data, optimizer=()))


@pytest.mark.parametrize("flags,message", TRAINING_CASES, ids=[" ".join(f) for f, _ in TRAINING_CASES])
def test_training_settings_out_of_range_refused(word_data, flags, message):
    from lsg_fairseq.tasks.run_settings import check_training_args
    from lsg_text.errors import ConfigError

    with pytest.raises(ConfigError) as e:
        check_training_args(training_cfg(word_data, *flags))
    assert str(e.value) == message


def test_every_training_setting_has_a_case():
    from lsg_text.argtypes import TRAINING_SETTINGS

    flags = {f[-2] for f, _ in TRAINING_CASES}
    assert {f"--{key.replace('_', '-')}" for _, key in TRAINING_SETTINGS} | {"--adam-betas"} == flags


def test_training_defaults_and_fairseq_sentinels_pass(word_data):
    """fairseq's defaults, and the values that mean something there: --lr 0 (a run that measures),
    0 for no limit / no clipping / no periodic save, -1 for keep all / no warmup init lr."""
    from lsg_fairseq.tasks.run_settings import check_training_args

    check_training_args(training_cfg(word_data))
    check_training_args(
        training_cfg(
            word_data,
            *"--lr 0 --max-update 0 --max-epoch 0 --clip-norm 0 --save-interval-updates 0".split(),
            *"--keep-last-epochs -1 --keep-interval-updates 0 --patience -1 --batch-size 1".split(),
            *"--lr-scheduler fixed --warmup-updates 0 --adam-betas [0.9,0.98]".split(),
            *"--criterion label_smoothed_cross_entropy --label-smoothing 0 --update-freq 1,2 --seed 0".split(),
        )
    )


# combinations: fairseq's KeyError after the first epoch, its ValueError once the model is built, or
# a checkpoint_best.pt picked the wrong way round without a word
COMBINATION_CASES = [
    (  # fairseq loads the split once for both: training started at epoch 2, unshuffled, exit 0
        ["--valid-subset", "valid,train"],
        "--valid-subset valid,train holds the training split train: fairseq then skips epoch 1 and trains without "
        "shuffling; validate on another split (a copy of it binarized under another name checks the fit on "
        "training data)",
    ),
    (  # fairseq's KeyError (Dataset not loaded: valid1) at the end of the first epoch
        ["--combine-valid-subsets", "--valid-subset", "valid,valid1"],
        "--valid-subset valid,valid1 with --combine-valid-subsets: the combined splits (valid, valid1, valid2, ...) "
        "are validated as one, named valid; drop valid1 or --combine-valid-subsets",
    ),
    (
        ["--best-checkpoint-metric", "rougeL", "--maximize-best-checkpoint-metric"],
        "--best-checkpoint-metric rougeL: validation logs ROUGE only with --eval-rouge (add it, or keep the default "
        "metric, loss)",
    ),
    (
        ["--best-checkpoint-metric", "rouge_l", "--maximize-best-checkpoint-metric"],
        "--best-checkpoint-metric rouge_l: validation logs it as rougeL",
    ),
    (
        ["--best-checkpoint-metric", "rouge2", "--eval-rouge", "--eval-rouge-bpe", "none"],
        "--best-checkpoint-metric rouge2: higher is better, add --maximize-best-checkpoint-metric (else "
        "checkpoint_best.pt is the one of lowest ROUGE)",
    ),
    (
        ["--maximize-best-checkpoint-metric"],
        "--maximize-best-checkpoint-metric: the metric is loss, lower is better (drop the flag, or choose a "
        "higher-is-better metric such as rougeL with --eval-rouge)",
    ),
    (
        ["--finetune-from-model", "m.pt", "--reset-optimizer", "--reset-meters"],
        "--finetune-from-model with --reset-optimizer, --reset-meters: it resets the optimizer, the lr scheduler, "
        "the meters and the dataloader itself (drop them)",
    ),
    (
        ["--finetune-from-model", "m.pt", "--restore-file", "r.pt"],
        "--finetune-from-model with --restore-file r.pt: give one (--restore-file resumes a training from its "
        "checkpoint, --finetune-from-model starts a new one from a model's weights)",
    ),
    (  # fairseq's ZeroDivisionError once the model is built (0 is no warmup for the other schedules)
        ["--lr-scheduler", "inverse_sqrt", "--warmup-updates", "0"],
        "--warmup-updates 0 with --lr-scheduler inverse_sqrt: fairseq divides by it; give 1 or more (1: --lr from "
        "the first update, then its inverse square root decay)",
    ),
    (  # fairseq's AssertionError once the model is built
        ["--lr-scheduler", "polynomial_decay", "--total-num-update", "0"],
        "--total-num-update 0: --lr-scheduler polynomial_decay decays over that many updates (more than 0), "
        "--max-update's by default: give --total-num-update N or --max-update N",
    ),
    (  # the same: its length is --max-update's 0 (no limit) by default
        ["--lr-scheduler", "polynomial_decay", "--max-epoch", "1"],
        "--total-num-update 0: --lr-scheduler polynomial_decay decays over that many updates (more than 0), "
        "--max-update's by default: give --total-num-update N or --max-update N",
    ),
    (  # fairseq's AssertionError once the model is built
        ["--lr-scheduler", "cosine", "--max-update", "0", "--max-epoch", "1"],
        "--lr-scheduler cosine needs its period: --max-update N or --lr-period-updates N",
    ),
    (  # fairseq's ValueError
        ["--lr-scheduler", "cosine", "--max-update", "100", "--lr", "1e-3,5e-4"],
        "--lr 0.001,0.0005: --lr-scheduler cosine takes one learning rate (a list is fixed's, per epoch)",
    ),
    (
        ["--lr-scheduler", "tri_stage"],
        "--lr-scheduler tri_stage needs --phase-ratio or --warmup-steps/--hold-steps/--decay-steps",
    ),
    (
        ["--lr-scheduler", "reduce_lr_on_plateau", "--lr-shrink", "2"],
        "--lr-shrink 2: the factor a plateau multiplies the learning rate by, in [0, 1)",
    ),
    (  # translation's flag, accepted and never computed: a --best-checkpoint-metric bleu failed after an epoch
        ["--eval-bleu"],
        "--eval-bleu: this task scores validation with ROUGE (--eval-rouge), not BLEU",
    ),
]


@pytest.mark.parametrize("flags,message", COMBINATION_CASES, ids=[" ".join(f) for f, _ in COMBINATION_CASES])
def test_training_combinations_refused(word_data, flags, message):
    from lsg_fairseq.tasks.run_settings import check_training_args
    from lsg_text.errors import ConfigError

    with pytest.raises(ConfigError) as e:
        check_training_args(training_cfg(word_data, *flags))
    assert str(e.value) == message


def test_best_checkpoint_metrics_that_hold(word_data):
    from lsg_fairseq.tasks.run_settings import check_training_args

    for flags in (
        ["--best-checkpoint-metric", "rougeLsum", "--maximize-best-checkpoint-metric", "--eval-rouge"],
        ["--best-checkpoint-metric", "rougeL", "--disable-validation"],  # never read
        ["--best-checkpoint-metric", "nll_loss", "--finetune-from-model", "m.pt"],
    ):
        check_training_args(training_cfg(word_data, *flags, "--eval-rouge-bpe", "none"))


def validated_training(word_data, tmp_path, metric):
    """fairseq-train's flags for a few updates of lsg_bart_tiny validated each epoch, checkpoints
    picked by ``metric``."""
    from test_user_errors import TRAIN

    argv = [str(word_data), "--user-dir", lsg_fairseq.user_dir(), "--arch", "lsg_bart_tiny", *TRAIN]
    argv.remove("--disable-validation")
    return argv + ["--truncate-target", "--best-checkpoint-metric", metric, "--save-dir", str(tmp_path / "ck")]


def test_unknown_best_checkpoint_metric_is_one_line_at_the_first_training_log(word_data, tmp_path, capsys, monkeypatch):
    """fairseq reads --best-checkpoint-metric only once validation has run, an epoch later: its
    KeyError then, that epoch lost. Refused at the first training log instead, before any checkpoint."""
    from test_user_errors import fairseq_train

    code, err = fairseq_train(validated_training(word_data, tmp_path, "bleu"), capsys, monkeypatch)
    assert code == 2 and "Traceback" not in err
    assert err.strip().splitlines()[-1] == (
        "fairseq-train: error: --best-checkpoint-metric bleu: not a metric of this run (its criterion and task "
        "log loss, ppl, bsz, wpb, wps); refused at the first training log, before any checkpoint"
    )
    assert "valid on 'valid' subset" not in err and not (tmp_path / "ck").exists()  # main had made it


@pytest.mark.parametrize("metric", ["ppl", "bsz"])
def test_a_metric_the_run_logs_trains(word_data, tmp_path, monkeypatch, metric):
    """ppl: derived from the loss; bsz: fairseq's task logs it. (nll_loss: cross_entropy logs it only
    with --sentence-avg, and fairseq's KeyError would then come at the first validation.)"""
    from fairseq_cli import train

    monkeypatch.setattr(sys, "argv", ["fairseq-train", *validated_training(word_data, tmp_path, metric)])
    train.cli_main()
    assert (tmp_path / "ck" / "checkpoint_best.pt").is_file()


def test_a_metric_missing_at_validation_is_still_explained():
    """What only a validation could fail to log (a criterion's eval-only metric) gets the
    after-the-fact line instead of fairseq's KeyError."""
    from omegaconf import OmegaConf

    from lsg_fairseq.tasks.run_settings import explain_missing_metric

    cfg = OmegaConf.create({"checkpoint": {"best_checkpoint_metric": "eval_acc"}})
    line = explain_missing_metric(cfg, "fairseq_cli.train", KeyError("eval_acc"))
    assert str(line).startswith("--best-checkpoint-metric eval_acc: validation logged no such metric")
    assert explain_missing_metric(cfg, "fairseq_cli.train", KeyError("other")) is None


def test_metrics_only_validation_logs_pass_the_first_training_log():
    from lsg_fairseq.tasks.run_settings import check_metric_logged
    from lsg_text.errors import ConfigError

    train_log = ["loss", "nll_loss", "ppl", "wpb"]
    check_metric_logged("rougeL", train_log, valid_only=["rouge1", "rougeL"])  # --eval-rouge
    check_metric_logged("num_updates", train_log)  # fairseq adds it to the validation's stats
    with pytest.raises(ConfigError, match="validation adds rouge1, rougeL"):
        check_metric_logged("rouge_l", train_log, valid_only=["rouge1", "rougeL"])


def test_training_setting_refused_by_fairseq_train_before_any_work(word_data, tmp_path, capsys, monkeypatch):
    from test_user_errors import TRAIN, fairseq_train

    argv = [str(word_data), "--user-dir", lsg_fairseq.user_dir(), "--arch", "lsg_bart_tiny", *TRAIN]
    code, err = fairseq_train(argv + ["--update-freq", "0", "--save-dir", str(tmp_path / "ck")], capsys, monkeypatch)
    assert code == 2 and "Traceback" not in err
    assert err.strip().splitlines()[-1] == "fairseq-train: error: --update-freq 0: must be an integer >= 1"
    assert not (tmp_path / "ck").exists()


@pytest.mark.parametrize(
    "flags,message",
    [
        (  # fairseq's ImportError once the model is built
            ["--ddp-backend", "fully_sharded"],
            "--ddp-backend fully_sharded: fairseq's fully sharded data parallel needs the package fairscale, which is "
            "not installed here (pip install fairscale)",
        ),
        (
            ["--zero-sharding", "os"],
            "--zero-sharding os: fairseq's optimizer state sharding needs the package fairscale",
        ),
        (
            ["--scoring", "wer"],
            "--scoring wer: fairseq's wer scorer needs the package editdistance",
        ),  # after generating
        (  # logged by fairseq-train, which then returns: exit 0, nothing trained
            ["--write-checkpoints-asynchronously"],
            "--write-checkpoints-asynchronously: fairseq's asynchronous checkpoint writing needs the package iopath",
        ),
        (  # the loggers: one warning from fairseq, then a training whose metrics go nowhere
            ["--wandb-project", "long-docs"],
            "--wandb-project long-docs: fairseq's Weights & Biases logging needs the package wandb, which is not "
            "installed here (pip install wandb)",
        ),
        (["--aim-repo", "runs/aim"], "--aim-repo runs/aim: fairseq's Aim logging needs the package aim"),
        (["--azureml-logging"], "--azureml-logging: fairseq's AzureML logging needs the package azureml.core"),
    ],
)
def test_settings_whose_package_is_missing_refused(word_data, monkeypatch, flags, message):
    import importlib.util

    from lsg_fairseq.tasks.run_settings import SETTING_PACKAGES, check_training_args
    from lsg_text.errors import ConfigError

    missing = {module for module, _, _ in SETTING_PACKAGES.values()}
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name in missing else find_spec(name, *a))
    check_training_args(training_cfg(word_data))  # the defaults need none of them
    with pytest.raises(ConfigError) as e:
        check_training_args(training_cfg(word_data, *flags))
    assert str(e.value).startswith(message)


def test_each_scorer_package_is_the_one_fairseq_imports():
    import inspect
    import re

    from fairseq.registry import REGISTRIES

    from lsg_fairseq.tasks.run_settings import SETTING_PACKAGES

    scorers = [(value, module) for (group, _, value), (module, _, _) in SETTING_PACKAGES.items() if group == "scoring"]
    assert scorers
    for name, module in scorers:
        source = inspect.getsource(REGISTRIES["scoring"]["registry"][name])
        assert re.search(rf"\bimport {module}\b", source), (name, module)


def test_each_logger_package_is_the_one_fairseq_imports():
    import inspect
    import re

    from fairseq.logging import progress_bar

    from lsg_fairseq.tasks.run_settings import ANY, SETTING_PACKAGES, _installed

    source = inspect.getsource(progress_bar)
    loggers = [module for (_, _, value), (module, _, _) in SETTING_PACKAGES.items() if value is ANY]
    assert len(loggers) == 3
    for module in loggers:
        assert re.search(rf"^\s*(import {module}|from {module} import)\b", source, re.M), module
    assert not _installed("no_such_package_here.core")  # find_spec of a dotted name raises without its parent


def test_a_second_shard_is_loaded_beside_the_first(word_data, tmp_path):
    """A data folder with train1 beside train: fairseq's default --upsample-primary -1 failed loading
    it ("negative dimensions are not allowed", fairseq#3644); the task's default is 1."""
    import glob
    import shutil

    from fairseq import tasks
    from fairseq.tasks.translation import TranslationConfig

    from lsg_text.errors import ConfigError

    assert TranslationConfig().upsample_primary == -1  # fairseq's, which the task's config overrides
    data = tmp_path / "shards"
    shutil.copytree(word_data, data)
    for path in glob.glob(str(data / "train.*")):
        shutil.copy(path, path.replace("train.", "train1."))
    # -1: fairseq's default, which the checkpoints of earlier runs hold (generate and validate set
    # their task up from it): read as the 1 it meant
    for flags, examples in (([], 24), (["--upsample-primary", "2"], 36), (["--upsample-primary", "-1"], 24)):
        task = tasks.setup_task(training_cfg(data, *flags).task)
        task.load_dataset("train", combine=True)
        assert len(task.datasets["train"]) == examples
    for value in ("0", "-2"):
        with pytest.raises(ConfigError, match=f"^--upsample-primary {value}: must be an integer >= 1$"):
            tasks.setup_task(training_cfg(data, "--upsample-primary", value).task)


def test_data_of_another_dictionary_is_named(word_data, tmp_path):
    """A dict.txt shorter than the one the data was binarized with: fairseq trained on until an id
    past the embedding, "IndexError: index out of range in self" in the first batch holding one."""
    import shutil

    from fairseq import tasks

    from lsg_text.fileio import DataError

    data = tmp_path / "short_dict"
    shutil.copytree(word_data, data)
    for side in ("source", "target"):
        lines = (data / f"dict.{side}.txt").read_text().splitlines(keepends=True)
        (data / f"dict.{side}.txt").write_text("".join(lines[:500]))
    task = tasks.setup_task(training_cfg(data).task)
    with pytest.raises(
        DataError, match=r"valid.source-target.source.bin holds token id \d+, but .*dict.source.txt has 505"
    ):
        task.load_dataset("valid")
    tasks.setup_task(training_cfg(word_data).task).load_dataset("valid")  # its own dictionary: loads


def test_positions_with_no_room_for_a_token_refused(word_data):
    """--max-target-positions 2 beside <s>: every target was truncated to <s></s> and trained on,
    exit 0; 1 leaves no room even without <s>."""
    from fairseq import tasks

    from lsg_text.errors import ConfigError

    with pytest.raises(ConfigError, match=r"^--max-target-positions must be >= 2 \(room for </s> and one token\)"):
        tasks.setup_task(training_cfg(word_data, "--max-target-positions", "1").task)
    cfg = training_cfg(word_data, "--max-target-positions", "2")
    task = tasks.setup_task(cfg.task)
    with pytest.raises(ConfigError, match=r"^--max-target-positions must be >= 3 with <s> before each sequence"):
        task.build_model(cfg.model)
    cfg = training_cfg(word_data, "--max-target-positions", "2", "--no-prepend-bos")  # T5-style: </s> + a token
    tasks.setup_task(cfg.task).build_model(cfg.model)


@pytest.mark.parametrize("arch", ["locost", "lsg_bart"])
def test_a_source_past_the_model_names_the_override_only_without_a_table(word_data, arch):
    """LOCOST's encoder holds no position table: its source limit is the checkpoint's setting, which
    --model-overrides raises (the model then reads the longer inputs). LSG-BART's is its table's."""
    import numpy as np
    from fairseq import tasks
    from omegaconf import open_dict

    from lsg_text.errors import ConfigError

    model_flags = TINY_LOCOST if arch == "locost" else TINY_LSG_BART
    argv = [str(word_data), "--user-dir", lsg_fairseq.user_dir(), "--task", "long_document_summarization"]
    cfg = training_config(argv + [*model_flags, "--optimizer", "adam", "--cpu", "--max-source-positions", "256"])
    task = tasks.setup_task(cfg.task)
    with open_dict(cfg):
        cfg.model.max_source_positions = 128  # the checkpoint's, below this run's 256
    model = task.build_model(cfg.model)
    task.load_dataset("valid")
    dataset = task.datasets["valid"]
    with pytest.raises(ConfigError) as e:
        task.filter_indices_by_size(np.arange(len(dataset)), dataset, max_positions=model.max_positions())
    message = str(e.value)
    assert "the model accepts at most 128 source tokens; lower --max-source-positions to 128" in message
    override = (
        ", or raise the model's, which no position table holds: --model-overrides \"{'max_source_positions': 256}\""
    )
    assert message.endswith(override) == (arch == "locost"), message


def test_an_ema_seed_without_an_ema_refused(word_data, tiny_checkpoint):
    """--ema-seed-model: fairseq reads its extra_state["ema"] at the first update (a KeyError, or a
    FileNotFoundError for a file not there), after the data and the model are loaded."""
    from lsg_fairseq.tasks.run_settings import check_training_args
    from lsg_text.errors import ConfigError
    from lsg_text.fileio import DataError

    with pytest.raises(ConfigError, match=f"^--ema-seed-model {tiny_checkpoint}: holds no EMA"):
        check_training_args(training_cfg(word_data, "--store-ema", "--ema-seed-model", tiny_checkpoint))
    with pytest.raises(DataError, match="^--ema-seed-model: file not found: nope.pt"):
        check_training_args(training_cfg(word_data, "--store-ema", "--ema-seed-model", "nope.pt"))


def test_prefix_size_forces_words_after_the_bos(word_data, tiny_checkpoint, tmp_path):
    """--prefix-size N forces the reference's first N words. fairseq slices the reference, which
    starts with <s> for the BART families: N=1 forced <s> alone and changed nothing."""
    from lsg_fairseq.cli import fairseq_wrappers

    size = 1  # the count that changed; 2 forces two words the same way
    out = tmp_path / f"prefix{size}"
    fairseq_wrappers.generate(
        [str(word_data), "--path", tiny_checkpoint, "--gen-subset", "valid", "--cpu", "--truncate-target"]
        + ["--max-source-positions", "128", "--max-target-positions", "64", "--beam", "2", "--max-len-b", "5"]
        + ["--prefix-size", str(size), "--results-path", str(out)]
    )
    lines = (out / "generate-valid.txt").read_text().splitlines()
    refs = {ln.split("\t")[0][2:]: ln.split("\t")[1].split() for ln in lines if ln.startswith("T-")}
    hyps = {ln.split("\t")[0][2:]: ln.split("\t")[2].split() for ln in lines if ln.startswith("H-")}
    assert refs and hyps.keys() == refs.keys()
    for i, ref in refs.items():
        words = [w.replace("<<unk>>", "<unk>") for w in ref[:size]]  # fairseq shows a reference's <unk> so
        assert hyps[i][:size] == words, (size, i, hyps[i], ref)
