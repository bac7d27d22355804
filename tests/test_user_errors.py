"""Issue 14: every user mistake gets one line (``prog: error: ...``, exit 2), never a traceback; nothing
is skipped silently; outputs are all-or-nothing and never clobber an input. One test per class of the
issue's table (README "Bad inputs"); the random-input properties are in test_fuzz_cli.py.
"""

import logging
import json
import os
import shutil
import signal
import subprocess
import sys

import pytest
import torch

import lsg_fairseq
from conftest import FIXTURES, edit_config, fairseq_cli, load_script
from lsg_fairseq.cli import summarize
from lsg_fairseq.cli.convert import main as convert_main
from lsg_text.errors import ConfigError
from test_task import build as build_task

BART_HF = os.path.join(FIXTURES, "lsg", "bart_plain", "hf")
LOCOST_HF = os.path.join(FIXTURES, "locost", "model")


def one_error_line(err: str, prog: str) -> str:
    """The single ``prog: error:`` line of ``err``; fails on a traceback or several error lines."""
    assert "Traceback" not in err, err
    lines = [line for line in err.splitlines() if line.startswith(f"{prog}: error: ")]
    assert len(lines) == 1, err
    return lines[0]


def copy_folder(src, dst):
    shutil.copytree(src, dst)
    for root, dirs, files in os.walk(dst):  # the fixtures are read-only
        for name in dirs + files:
            os.chmod(os.path.join(root, name), 0o755 if name in dirs else 0o644)
    return str(dst)


def folder_state(folder):
    return {name: open(os.path.join(folder, name), "rb").read() for name in sorted(os.listdir(folder))}


def run_convert(argv, capsys):
    with pytest.raises(SystemExit) as e:
        convert_main([str(a) for a in argv])
    return e.value.code, one_error_line(capsys.readouterr().err, "lsg-fairseq-convert")


# ----------------------------------------------------------------------------- weights files read defensively
@pytest.mark.parametrize(
    "damage,expected",
    [
        ("truncate", "cannot load weights: truncated or not in the expected format"),
        ("html", "cannot load weights: an HTML/XML page, not weights"),
        ("empty", "cannot load weights: empty"),
        ("lfs", "cannot load weights: a Git LFS pointer"),
    ],
)
def test_damaged_safetensors_named_and_nothing_written(tmp_path, capsys, damage, expected):
    src = copy_folder(BART_HF, tmp_path / "hf")
    weights = os.path.join(src, "model.safetensors")
    data = open(weights, "rb").read()
    damaged = {
        "truncate": data[: len(data) // 2],
        "html": b"<!DOCTYPE html>\n<html><body>502 Bad Gateway</body></html>\n",
        "empty": b"",
        "lfs": b"version https://git-lfs.github.com/spec/v1\noid sha256:0\nsize 1073808\n",
    }[damage]
    open(weights, "wb").write(damaged)
    code, line = run_convert([src, tmp_path / "out"], capsys)
    assert code == 2
    assert f"{weights}: {expected}" in line and "re-download it" in line
    assert not (tmp_path / "out").exists() and os.listdir(tmp_path) == ["hf"]  # no temp folder left


def test_html_page_saved_as_pytorch_model_bin(tmp_path, capsys):
    src = copy_folder(LOCOST_HF, tmp_path / "hf")
    weights = os.path.join(src, "pytorch_model.bin")
    open(weights, "wb").write(b"<html><head><title>404 Not Found</title></head></html>")
    code, line = run_convert([src, tmp_path / "out"], capsys)
    assert code == 2 and f"{weights}: cannot load weights: an HTML/XML page" in line


@pytest.mark.parametrize(
    "text, problem",
    [
        ("[1, 2]", "expected a JSON object, got list"),
        ('{"model_type": "bart",', "not valid JSON (Expecting property name enclosed in double quotes at column 23)"),
        ('{"model_type": "bart",\n "x": }', "not valid JSON (Expecting value at line 2 column 7)"),
        ("[" * 100_000, "not valid JSON (nested too deeply)"),  # json's RecursionError
        (b"\xff\xfe{}", "not UTF-8 text (byte offset 0)"),
    ],
)
def test_unreadable_config_json_named(tmp_path, capsys, text, problem):
    """A damaged config.json is named with what is wrong with it; it used to read "not a model
    this converter knows", which sent the user looking for a family."""
    src = copy_folder(BART_HF, tmp_path / "hf")
    with open(os.path.join(src, "config.json"), "wb") as f:
        f.write(text if isinstance(text, bytes) else text.encode())
    code, line = run_convert([src, tmp_path / "out"], capsys)
    assert code == 2 and f"{os.path.join(src, 'config.json')}: {problem}" in line, line
    assert not (tmp_path / "out").exists()


def test_checkpoint_beside_unreadable_config_json_converts(tmp_path, capsys):
    """A folder holding a fairseq checkpoint is that checkpoint's, whatever config.json lies beside it."""
    assert convert_main([BART_HF, str(tmp_path / "fs")]) in (0, None)
    (tmp_path / "fs" / "config.json").write_text("not json")
    assert convert_main([str(tmp_path / "fs"), str(tmp_path / "lsg"), "--to", "lsg_bart"]) in (0, None)
    assert (tmp_path / "lsg" / "model.pt").is_file()


HF_FOLDERS = {
    "bart": BART_HF,
    "lsg": os.path.join(FIXTURES, "lsg", "lsg_norm", "hf"),
    "led": os.path.join(FIXTURES, "led", "led_w32", "hf"),
    "locost": LOCOST_HF,
}


@pytest.mark.parametrize(
    "family,field,value,expected",
    [
        ("bart", "d_model", "abc", "d_model must be an integer, got 'abc'"),  # was fairseq's int() message
        ("bart", "encoder_layers", -3, "encoder_layers must be an integer >= 1, got -3"),
        ("bart", "dropout", "abc", "dropout must be a number, got 'abc'"),
        ("bart", "activation_function", [1], "activation_function must be one of gelu, relu,"),  # TypeError
        ("bart", "architectures", -3, "architectures must be a list of class names, got -3"),  # TypeError
        ("lsg", "block_size", "abc", "block_size must be an integer, got 'abc'"),  # TypeError
        ("lsg", "num_global_tokens", 0, "num_global_tokens must be an integer in [1, "),
        ("lsg", "mask_first_token", "abc", "mask_first_token must be true or false, got 'abc'"),  # ArgumentTypeError
        ("lsg", "sparsity_type", "abc", "sparsity_type must be one of none, norm,"),
        ("lsg", "block_size", None, "block_size null; give a value"),  # was a --sparse-block-size message
        ("led", "d_model", "abc", "d_model must be an integer, got 'abc'"),  # TypeError
        ("led", "attention_window", None, "attention_window must be a positive even integer"),  # TypeError
        ("led", "max_encoder_position_embeddings", "abc", "max_encoder_position_embeddings must be an integer"),
        ("led", "max_decoder_position_embeddings", None, "max_decoder_position_embeddings is null"),  # TypeError
        ("locost", "d_state", None, "d_state is null"),  # TypeError
        ("locost", "vocab_size", "abc", "vocab_size must be an integer, got 'abc'"),  # ValueError
        ("locost", "pad_token_id", [1], "pad_token_id must be an integer, got [1]"),  # TypeError
        # true/false fields the converter reads but maps to no flag (common.config_flag)
        ("bart", "normalize_before", "abc", "normalize_before must be true or false, got 'abc'"),
        ("lsg", "adaptive", [0], "adaptive must be true or false, got [0]"),
        ("led", "scale_embedding", "abc", "scale_embedding must be true or false, got 'abc'"),
        ("locost", "is_encoder_decoder", "abc", "is_encoder_decoder must be true or false, got 'abc'"),
    ],
)
def test_bad_config_json_field_named(tmp_path, capsys, family, field, value, expected):
    """A hand-edited or damaged config.json: one line naming the file and the field, checked against
    the flag's own range where the value arrives (fields.Field.kind, common.config_value); the cases
    marked were tracebacks, the others named no field or file, or a flag the user never gave."""
    src = copy_folder(HF_FOLDERS[family], tmp_path / "hf")
    path = edit_config(src, **{field: value})
    code, line = run_convert([src, tmp_path / "out"], capsys)
    assert code == 2 and path in line and expected in line, line
    assert os.listdir(tmp_path) == ["hf"]


@pytest.mark.parametrize("family,field", [("bart", "normalize_before"), ("led", "scale_embedding")])
def test_config_json_false_as_a_string_is_false(tmp_path, capsys, family, field):
    """ "false" is false, as the LSG fields already read it: it was a truthy string, refused as a
    pre-LayerNorm model or as "scale_embedding true is not LED"."""
    src = copy_folder(HF_FOLDERS[family], tmp_path / "hf")
    path = edit_config(src, **{field: "false"})
    assert convert_main([src, str(tmp_path / "out")]) in (0, None)
    assert (tmp_path / "out" / "model.pt").is_file()
    edit_config(src, **{field: "true"})
    code, line = run_convert([src, tmp_path / "out2"], capsys)
    assert code == 2 and path in line, line


# ----------------------------------------------------------------------------- converter output folder
def test_convert_refuses_non_empty_out_and_force_replaces_it_whole(tmp_path, capsys):
    out = tmp_path / "out"
    out.mkdir()
    (out / "model.pt").write_bytes(b"another model")
    (out / "spm.model").write_bytes(b"another model's sentencepiece")
    code, line = run_convert([BART_HF, out], capsys)
    assert code == 2
    assert f"{out}: output folder exists and is not empty (model.pt, spm.model); pass --force" in line
    assert folder_state(out) == {"model.pt": b"another model", "spm.model": b"another model's sentencepiece"}

    convert_main([BART_HF, str(out), "--force"])
    names = sorted(os.listdir(out))
    assert names == ["dict.txt", "encoder.json", "model.pt", "tokenizer.txt", "vocab.bpe"]  # no stale spm.model
    assert (out / "tokenizer.txt").read_text() == "gpt2\n"
    assert sorted(os.listdir(tmp_path)) == ["out"]  # no temp folder left beside it
    from lsg_fairseq.models.hub import from_pretrained

    assert from_pretrained(str(out)).bpe is not None  # the replaced folder is a working model


def test_convert_into_an_empty_out_and_refuses_a_folder_holding_the_source(tmp_path, capsys):
    out = tmp_path / "empty"
    out.mkdir()
    convert_main([BART_HF, str(out)])  # an empty OUT is fine without --force
    assert (out / "model.pt").is_file()
    # converting OUT/model.pt into OUT itself would delete the input: refused even with --force
    code, line = run_convert([out / "model.pt", out, "--force", "--max-source-positions", "2048"], capsys)
    assert code == 2 and f"{out}: the output folder would replace the source {out / 'model.pt'}" in line


def test_convert_truncated_checkpoint_named_as_train_and_export_do(tmp_path, capsys):
    """It used to read "not a model this converter knows"."""
    torch.save({"model": {"w": torch.zeros(4096)}}, tmp_path / "checkpoint_best.pt")
    data = (tmp_path / "checkpoint_best.pt").read_bytes()
    (tmp_path / "checkpoint_best.pt").write_bytes(data[: len(data) // 2])
    code, line = run_convert([tmp_path / "checkpoint_best.pt", tmp_path / "out"], capsys)
    assert code == 2 and f"{tmp_path / 'checkpoint_best.pt'}: truncated or corrupt checkpoint" in line
    assert not (tmp_path / "out").exists()


def test_convert_reports_a_bad_flag_before_a_non_empty_out(tmp_path, capsys):
    """The flags are checked first: the user is not asked to empty OUT (or pass --force) only to
    learn that the flag was wrong."""
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("the user's")
    code, line = run_convert([BART_HF, out, "--attention-window", "16"], capsys)
    assert code == 2 and "unknown option(s) for the bart family: attention_window" in line, line
    code, line = run_convert([BART_HF, out, "--max-source-positions", "0"], capsys)
    assert code == 2 and "--max-source-positions 0 is not achievable" in line, line
    assert folder_state(out) == {"notes.txt": b"the user's"}


# ----------------------------------------------------------------------------- tokenizer record
def fake_model_folder(folder, files):
    folder.mkdir()
    (folder / "model.pt").write_bytes(b"never read: the tokenizer files are checked first")
    (folder / "dict.txt").write_text("".join(f"{i} 1\n" for i in range(4, 40)))
    for name, text in files.items():
        (folder / name).write_text(text)
    return folder


@pytest.mark.parametrize(
    "files,expected",
    [
        (
            {"tokenizer.txt": "gpt2\n", "encoder.json": "{}", "vocab.bpe": "#version: 0.2\n", "spm.model": "stale"},
            "tokenizer.txt says gpt2 but {d} also holds spm.model",
        ),
        (
            {"tokenizer.txt": "sentencepiece\n", "encoder.json": "{}", "vocab.bpe": "#version: 0.2\n"},
            "tokenizer.txt says sentencepiece but {d} holds none of",
        ),
        ({"tokenizer.txt": "gpt2\n", "encoder.json": "{}"}, "tokenizer.txt says gpt2 but vocab.bpe is missing in {d}"),
        ({"tokenizer.txt": "wordpiece\n"}, "tokenizer.txt: names tokenizer 'wordpiece'"),
        (
            {"encoder.json": "{}", "vocab.bpe": "#version: 0.2\n", "spm.model": "stale"},
            "{d}: holds both GPT-2 BPE files (encoder.json, vocab.bpe) and spm.model, and no tokenizer.txt saying "
            "which one the model uses; delete the files of the tokenizer the model does not use",
        ),
    ],
)
def test_summarize_refuses_tokenizer_files_contradicting_the_record(tmp_path, capsys, files, expected):
    model_dir = fake_model_folder(tmp_path / "model", files)
    (tmp_path / "doc.txt").write_text("a document\n")
    with pytest.raises(SystemExit) as e:
        summarize.main([str(model_dir), str(tmp_path / "doc.txt"), "--output", str(tmp_path / "out.txt")])
    assert e.value.code == 2
    line = one_error_line(capsys.readouterr().err, "lsg-fairseq-summarize")
    assert expected.format(d=model_dir) in line
    assert not (tmp_path / "out.txt").exists()


# ----------------------------------------------------------------------------- summarize inputs and outputs
def test_summarize_non_utf8_file_names_byte_offset(tmp_path, capsys):
    model_dir = fake_model_folder(tmp_path / "model", {"encoder.json": "{}", "vocab.bpe": "#version: 0.2\n"})
    pdf = tmp_path / "paper.pdf"
    pdf.write_bytes(b"%PDF-1.4\n%\xe2\xe3\xcf\xd3\n1 0 obj\n")
    with pytest.raises(SystemExit) as e:
        summarize.main([str(model_dir), str(pdf)])
    assert e.value.code == 2
    line = one_error_line(capsys.readouterr().err, "lsg-fairseq-summarize")
    assert f"{pdf}: not UTF-8 text (byte offset 10, line 2" in line and "--errors replace" in line


def test_summarize_errors_replace_reads_bad_bytes(tmp_path):
    (tmp_path / "doc.txt").write_bytes(b"caf\xe9 au lait\n")
    (tmp_path / "lines.txt").write_bytes(b"\xef\xbb\xbfone doc\ntwo\x0cdoc \xff\n")
    args = summarize.build_parser().parse_args(["m", str(tmp_path / "doc.txt"), "--errors", "replace"])
    assert summarize.read_documents(args)[1] == ["caf\ufffd au lait"]
    args = summarize.build_parser().parse_args(
        ["m", "--input-lines", str(tmp_path / "lines.txt"), "--errors", "replace"]
    )
    # BOM dropped; a form feed is no document boundary (only \n is)
    assert summarize.read_documents(args)[1] == ["one doc", "two\x0cdoc \ufffd"]


@pytest.mark.parametrize(
    "flags,expected",
    [
        (["--beam", "0"], "argument --beam: must be an integer >= 1, got '0'"),
        (["--max-len-b", "-1"], "argument --max-len-b: must be an integer >= 1, got '-1'"),
        (["--batch-size", "0"], "argument --batch-size: must be an integer >= 1, got '0'"),
        (["--lenpen", "nan"], "argument --lenpen: must be a number in [-10, 10], got 'nan'"),
        (["--lenpen", "1e3"], "argument --lenpen: must be a number in [-10, 10], got '1e3'"),
        (["--max-source-positions", "1"], "argument --max-source-positions: must be an integer >= 2, got '1'"),
        (["--min-len", "9", "--max-len-b", "5"], "--min-len 9 is above --max-len-b 5"),
        (["--fp16"], "--fp16 needs a GPU (--device cuda)"),
        (["--fp16", "--bf16"], "--fp16 and --bf16: give one"),
        (["--device", "tpu9"], "--device tpu9: not a torch device"),
    ],
)
def test_summarize_flag_ranges(tmp_path, capsys, flags, expected):
    model_dir = fake_model_folder(tmp_path / "model", {"encoder.json": "{}", "vocab.bpe": "#version: 0.2\n"})
    (tmp_path / "doc.txt").write_text("a document\n")
    with pytest.raises(SystemExit) as e:
        summarize.main([str(model_dir), str(tmp_path / "doc.txt"), *flags])
    assert e.value.code == 2
    assert expected in one_error_line(capsys.readouterr().err, "lsg-fairseq-summarize")


def test_summarize_files_may_come_before_or_after_the_options(tmp_path, capsys):
    """``MODEL_DIR --beam 2 doc.txt``: argparse's parse_args matched FILES (nargs="*"), empty, before the
    option and refused doc.txt as an unrecognized argument."""
    model_dir = fake_model_folder(tmp_path / "model", {"encoder.json": "{}", "vocab.bpe": "#version: 0.2\n"})
    (tmp_path / "doc.txt").write_text("a document\n")
    code, line = run_summarize([model_dir, "--beam", "2", tmp_path / "doc.txt"], capsys)
    assert code == 2 and "model.pt: not a checkpoint" in line, line  # past the arguments, at the model
    parse = summarize.build_parser().parse_intermixed_args
    assert parse(["m", "--beam", "2", "a.txt", "b.txt"]).files == ["a.txt", "b.txt"]
    assert parse(["m", "a.txt", "--checkpoint", "c.pt", "b.txt"]).files == ["a.txt", "b.txt"]
    assert parse(["m"]).files == [] and parse(["n"]).files == []  # the default list is not shared
    for argv, expected in (
        ([], "the following arguments are required: model_dir ("),  # FILES is not required
        (["m", "--bogus", "a.txt"], "unrecognized arguments: --bogus"),
    ):
        with pytest.raises(SystemExit) as e:
            summarize.main(argv)
        assert e.value.code == 2 and expected in one_error_line(capsys.readouterr().err, "lsg-fairseq-summarize")


@pytest.mark.parametrize(
    "names,expected",
    [
        (["checkpoint_last.pt"], "checkpoint_last.pt: not a checkpoint"),
        (["checkpoint_last.pt", "checkpoint_best.pt"], "checkpoint_best.pt: not a checkpoint"),
        (["model.pt", "checkpoint_best.pt"], "model.pt: not a checkpoint"),
        ([], "MODEL_DIR {d}: no checkpoint (none of model.pt, checkpoint_best.pt, checkpoint_last.pt); name its file"),
    ],
)
def test_summarize_picks_the_checkpoint_as_the_converter_does(tmp_path, capsys, names, expected):
    """Without --checkpoint: model.pt, else checkpoint_best.pt, else checkpoint_last.pt (a training's
    --save-dir with dict.txt and the tokenizer copied in is a model folder too)."""
    model_dir = fake_model_folder(tmp_path / "model", {"encoder.json": "{}", "vocab.bpe": "#version: 0.2\n"})
    (model_dir / "model.pt").unlink()
    for name in names:
        (model_dir / name).write_bytes(b"never a checkpoint")
    (tmp_path / "doc.txt").write_text("a document\n")
    code, line = run_summarize([model_dir, tmp_path / "doc.txt"], capsys)
    assert code == 2 and expected.format(d=model_dir) in line, line


def test_the_hub_picks_the_checkpoint_as_summarize_does(tmp_path):
    from lsg_fairseq.models.hub import from_pretrained
    from lsg_text.errors import UserError

    model_dir = fake_model_folder(tmp_path / "model", {"encoder.json": "{}", "vocab.bpe": "#version: 0.2\n"})
    (model_dir / "model.pt").rename(model_dir / "checkpoint_last.pt")
    with pytest.raises(UserError, match="checkpoint_last.pt: not a checkpoint"):
        from_pretrained(str(model_dir))
    (model_dir / "checkpoint_last.pt").unlink()
    with pytest.raises(UserError, match=r"no checkpoint \(none of model.pt, checkpoint_best.pt, checkpoint_last.pt\)"):
        from_pretrained(str(model_dir))


@pytest.mark.parametrize("which", ["input-lines", "file", "checkpoint"])
def test_summarize_never_writes_over_an_input(tmp_path, capsys, which):
    model_dir = fake_model_folder(tmp_path / "model", {"encoder.json": "{}", "vocab.bpe": "#version: 0.2\n"})
    docs = tmp_path / "docs.txt"
    docs.write_text("first document\nsecond document\n")
    argv = {
        "input-lines": [str(model_dir), "--input-lines", str(docs), "--output", str(docs)],
        "file": [str(model_dir), str(docs), "--output", str(docs)],
        "checkpoint": [str(model_dir), str(docs), "--output", str(model_dir / "model.pt")],
    }[which]
    before = docs.read_bytes(), (model_dir / "model.pt").read_bytes()
    with pytest.raises(SystemExit) as e:
        summarize.main(argv)
    assert e.value.code == 2
    line = one_error_line(capsys.readouterr().err, "lsg-fairseq-summarize")
    assert "the --output would overwrite the input" in line
    assert (docs.read_bytes(), (model_dir / "model.pt").read_bytes()) == before


def run_summarize(argv, capsys):
    with pytest.raises(SystemExit) as e:
        summarize.main([str(a) for a in argv])
    return e.value.code, one_error_line(capsys.readouterr().err, "lsg-fairseq-summarize")


def test_summarize_refuses_an_output_folder_up_front(tmp_path, capsys):
    """Before any work (this model.pt is never read), naming the user's path, not a hidden temp file."""
    model_dir = fake_model_folder(tmp_path / "model", {"encoder.json": "{}", "vocab.bpe": "#version: 0.2\n"})
    (tmp_path / "doc.txt").write_text("a document\n")
    (tmp_path / "summaries").mkdir()
    code, line = run_summarize([model_dir, tmp_path / "doc.txt", "--output", tmp_path / "summaries"], capsys)
    assert code == 2 and f"--output {tmp_path / 'summaries'}: is a folder (give the path of a file" in line, line
    assert os.listdir(tmp_path / "summaries") == []  # and no temp file beside it
    assert sorted(os.listdir(tmp_path)) == ["doc.txt", "model", "summaries"]


def test_summarize_names_a_checkpoint_that_does_not_fit_its_own_model(tmp_path, capsys):
    """A tensor missing or of another shape is the checkpoint's fault, not dict.txt's: it read "use
    the dict.txt written with this checkpoint". A dict.txt of another size still says that."""
    import torch

    convert_main([BART_HF, str(tmp_path / "model")])
    (tmp_path / "doc.txt").write_text("a document. it has two sentences.\n")
    path = tmp_path / "model" / "model.pt"
    good = path.read_bytes()
    dictionary = (tmp_path / "model" / "dict.txt").read_text()
    (tmp_path / "model" / "dict.txt").write_text(dictionary + "".join(f"{60000 + i} 1\n" for i in range(8)))
    code, line = run_summarize([tmp_path / "model", tmp_path / "doc.txt"], capsys)
    assert code == 2 and "use the dict.txt written with this checkpoint" in line, line
    (tmp_path / "model" / "dict.txt").write_text(dictionary)
    state = torch.load(path, weights_only=False)
    del state["model"]["decoder.layers.1.fc1.weight"]
    torch.save(state, path)
    code, line = run_summarize([tmp_path / "model", tmp_path / "doc.txt"], capsys)
    assert code == 2 and f"{path}: its weights do not fit the model its own cfg builds" in line, line
    assert "decoder.layers.1.fc1.weight" in line and "dict.txt" not in line, line
    path.write_bytes(good)
    assert summarize.main([str(tmp_path / "model"), str(tmp_path / "doc.txt"), "--quiet"]) in (0, None)


@pytest.mark.parametrize("device", ["mps", "meta", "xpu"])
def test_summarize_runs_on_cpu_or_cuda_and_says_so(tmp_path, capsys, device):
    """torch names these devices, so they passed; then a traceback from torch (no MPS in this build,
    .item() on meta tensors, an assertion for XPU)."""
    model_dir = fake_model_folder(tmp_path / "model", {"encoder.json": "{}", "vocab.bpe": "#version: 0.2\n"})
    (tmp_path / "doc.txt").write_text("a document\n")
    code, line = run_summarize([model_dir, tmp_path / "doc.txt", "--device", device], capsys)
    assert code == 2 and f"--device {device}: this command runs on cpu or cuda (e.g. cuda:1)" in line, line


def test_summarize_names_a_pipe_for_what_it_is(tmp_path, capsys):
    """A FIFO (or <(cmd)) exists but is no regular file: it was called 'no such file'."""
    model_dir = fake_model_folder(tmp_path / "model", {"encoder.json": "{}", "vocab.bpe": "#version: 0.2\n"})
    os.mkfifo(tmp_path / "pipe")
    code, line = run_summarize([model_dir, tmp_path / "pipe"], capsys)
    assert code == 2 and f"{tmp_path / 'pipe'}: not a regular file (write it to a file first)" in line, line


def test_summarize_names_its_own_flags_when_device_memory_runs_out(tmp_path, capsys, monkeypatch):
    """An out-of-memory error in generation was a traceback here (the task's DeviceMemoryError was
    caught nowhere) and named fairseq-generate's --max-tokens, which this command does not have."""
    from fairseq.tasks.translation import TranslationTask

    convert_main([BART_HF, str(tmp_path / "model")])
    (tmp_path / "doc.txt").write_text("a document. it has two sentences.\n")

    def out_of_memory(*args, **kwargs):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 24.00 GiB")

    monkeypatch.setattr(TranslationTask, "inference_step", out_of_memory)  # the task's super() call
    code, line = run_summarize([tmp_path / "model", tmp_path / "doc.txt", "--output", tmp_path / "s.txt"], capsys)
    assert code == 2 and "error: device memory ran out in generation on a batch of 1 document of up to 35" in line, line
    assert "lower --batch-size or --beam, or shorten the inputs with --max-source-positions (CUDA OOM." in line
    assert "--max-tokens" not in line and not (tmp_path / "s.txt").exists()


@pytest.mark.parametrize(
    "files,expected",
    [
        # an HF folder: the user never passed --checkpoint, and the fix is the converter
        (
            {"config.json": "{}", "model.safetensors": ""},
            "MODEL_DIR {d}: an HF model folder (config.json), not a fairseq one; convert it first "
            "(lsg-fairseq-convert {d} OUT_DIR)",
        ),
        # no dict.txt: the task's hint named --data, which this command does not have
        (
            {"model.pt": "", "encoder.json": "{}", "vocab.bpe": "#version: 0.2\n"},
            "MODEL_DIR {d}: no dict.txt; copy there, as dict.txt, the dictionary the model was trained with",
        ),
    ],
    ids=["hf_folder", "no_dict"],
)
def test_summarize_model_dir_problems_say_what_to_do(tmp_path, capsys, files, expected):
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    for name, text in files.items():
        (model_dir / name).write_text(text)
    (tmp_path / "doc.txt").write_text("a document\n")
    code, line = run_summarize([model_dir, tmp_path / "doc.txt"], capsys)
    assert code == 2 and expected.format(d=model_dir) in line and "--data" not in line, line


def test_summarize_folder_given_as_a_document(tmp_path, capsys):
    model_dir = fake_model_folder(tmp_path / "model", {"encoder.json": "{}", "vocab.bpe": "#version: 0.2\n"})
    (tmp_path / "docs").mkdir()
    code, line = run_summarize([model_dir, tmp_path / "docs"], capsys)
    assert code == 2 and f"{tmp_path / 'docs'}: a folder, not a text file" in line, line


def test_summarize_quiet_prints_nothing_on_stderr(tmp_path, capfd):
    """fairseq's INFO lines and torch's pin_memory warning (fairseq's DataLoader on a CPU) are kept
    out of the command's stderr."""
    import warnings

    from lsg_fairseq.convert import convert

    convert(BART_HF, str(tmp_path / "model"))
    (tmp_path / "doc.txt").write_text("the patients were treated with a new drug\n")
    capfd.readouterr()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        summarize.main(
            [str(tmp_path / "model"), str(tmp_path / "doc.txt"), "--quiet", "--beam", "1", "--max-len-b", "3"]
        )
    out, err = capfd.readouterr()
    assert len(out.splitlines()) == 1 and err == "", err
    assert not [w for w in caught if "pin_memory" in str(w.message)]


# ----------------------------------------------------------------------------- fairseq-train flags and resumes
TRAIN = [
    "--task",
    "long_document_summarization",
    "--encoder-embed-dim",
    "16",
    "--encoder-ffn-embed-dim",
    "32",
    "--decoder-embed-dim",
    "16",
    "--decoder-ffn-embed-dim",
    "32",
    "--encoder-layers",
    "2",
    "--decoder-layers",
    "1",
    "--encoder-attention-heads",
    "2",
    "--decoder-attention-heads",
    "2",
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
    "--max-tokens",
    "4096",
    "--max-update",
    "1",
    "--cpu",
    "--no-epoch-checkpoints",
    "--disable-validation",
    "--num-workers",
    "0",
    "--log-format",
    "none",
]


def fairseq_train(argv, capsys, monkeypatch):
    """fairseq-train's own cli_main, in-process; returns (exit code, stderr)."""
    from fairseq_cli import train

    monkeypatch.setattr(sys, "argv", ["fairseq-train", *argv])
    with pytest.raises(SystemExit) as e:
        train.cli_main()
    return e.value.code, capsys.readouterr().err


def data_with_splits(word_data, dest, splits):
    """A copy of the word-level data folder holding only ``splits`` (and the dictionaries)."""
    dest.mkdir()
    for name in os.listdir(word_data):
        if name.startswith("dict.") or name.split(".")[0] in splits:
            shutil.copy(os.path.join(word_data, name), dest / name)
    return dest


@pytest.mark.parametrize(
    "kept,flags,missing,hint",
    [
        (("train",), [], "valid", "--disable-validation"),  # fairseq-train's default --valid-subset valid
        (("train", "valid"), ["--valid-subset", "test"], "test", "--valid-subset"),
        (("valid",), ["--disable-validation"], "train", "--train-subset"),
    ],
)
def test_fairseq_train_missing_split_is_one_line(word_data, tmp_path, capsys, monkeypatch, kept, flags, missing, hint):
    """fairseq's own error is a traceback: FileNotFoundError "Dataset not found: valid (bin)"."""
    data = data_with_splits(word_data, tmp_path / "data", kept)
    argv = [a for a in TRAIN if a != "--disable-validation"] + flags
    code, err = fairseq_train(
        [
            str(data),
            "--user-dir",
            lsg_fairseq.user_dir(),
            "--arch",
            "lsg_bart_tiny",
            "--save-dir",
            str(tmp_path / "ck"),
            *argv,
        ],
        capsys,
        monkeypatch,
    )
    line = one_error_line(err, "fairseq-train")
    assert code == 2 and f"{data}: no {missing!r} split" in line and hint in line
    assert f"splits there: {', '.join(sorted(kept))}" in line
    assert not (tmp_path / "ck" / "checkpoint_last.pt").exists()


@pytest.mark.parametrize(
    "arch,flags,expected",
    [
        ("lsg_bart_tiny", ["--block-size", "0"], "argument --block-size: must be an integer >= 1, got '0'"),
        ("lsg_bart_tiny", ["--block-size", "-8"], "argument --block-size: must be an integer >= 1, got '-8'"),
        ("led_tiny", ["--attention-window", "33"], "argument --attention-window: must be a positive even integer"),
        ("led_tiny", ["--attention-window", "0"], "argument --attention-window: must be a positive even integer"),
        ("locost_tiny", ["--d-state", "0"], "argument --d-state: must be an integer >= 2, got '0'"),
        (  # a typo of 1e-6: RMSNorm would scale the activations down by ~1000 instead of normalizing them
            "locost_tiny",
            ["--layer-norm-eps", "1e6"],
            "argument --layer-norm-eps: must be a number in (0, 1), got '1e6'",
        ),
    ],
)
def test_train_flag_out_of_range_refused_when_parsed(word_data, tmp_path, capsys, monkeypatch, arch, flags, expected):
    code, err = fairseq_train(
        [
            str(word_data),
            "--user-dir",
            lsg_fairseq.user_dir(),
            "--arch",
            arch,
            *TRAIN,
            "--save-dir",
            str(tmp_path / "ck"),
            *flags,
        ],
        capsys,
        monkeypatch,
    )
    assert code == 2 and "Traceback" not in err
    assert err.splitlines()[-1] == f"fairseq-train: error: {expected}" or expected in err.splitlines()[-1]


@pytest.mark.parametrize(
    "arch,flags,expected",
    [
        (
            "lsg_bart_tiny",
            ["--block-size", "16", "--sparsity-factor", "3"],
            "--sparsity-factor (3) must divide --block-size (16)",
        ),
        (
            "led_tiny",
            ["--attention-window", "16,16,16"],
            "--attention-window has 3 entries but the encoder has 2 layers",
        ),
    ],
)
def test_train_cross_flag_errors_are_one_line(word_data, tmp_path, capsys, monkeypatch, arch, flags, expected):
    code, err = fairseq_train(
        [
            str(word_data),
            "--user-dir",
            lsg_fairseq.user_dir(),
            "--arch",
            arch,
            *TRAIN,
            "--save-dir",
            str(tmp_path / "ck"),
            *flags,
        ],
        capsys,
        monkeypatch,
    )
    assert code == 2
    assert expected in one_error_line(err, "fairseq-train")


def _damaged(content):
    return lambda path: path.write_bytes(content)


def _foreign(path):
    torch.save({"encoder.weight": torch.zeros(2)}, path)  # e.g. an HF .bin


@pytest.mark.parametrize(
    "damage, expected",
    [
        (_damaged(b""), "truncated or corrupt checkpoint"),
        (_damaged(b"PK\x03\x04 half a zip"), "truncated or corrupt checkpoint"),
        (_foreign, "a torch file but not a fairseq checkpoint"),
    ],
    ids=["empty", "half_a_zip", "foreign_torch_file"],
)
def test_train_resume_from_bad_checkpoint_last_is_one_line(word_data, tmp_path, capsys, monkeypatch, damage, expected):
    save_dir = tmp_path / "ck"
    save_dir.mkdir()
    damage(save_dir / "checkpoint_last.pt")
    argv = [str(word_data), "--user-dir", lsg_fairseq.user_dir(), "--arch", "lsg_bart_tiny", *TRAIN]
    code, err = fairseq_train(
        [*argv, "--block-size", "16", "--sparse-block-size", "16", "--save-dir", str(save_dir)], capsys, monkeypatch
    )
    assert code == 2
    assert f"{save_dir / 'checkpoint_last.pt'}: {expected}" in one_error_line(err, "fairseq-train")


def test_resume_with_other_attention_settings_is_refused_and_finetuning_warns(
    word_data, tmp_path, capsys, monkeypatch, caplog
):
    """No weight records LSG's sparsity: fairseq builds the model from the command line, so a resumed
    run without the first one's flags trained another attention without a word."""
    from fairseq_cli import train

    argv = [str(word_data), "--user-dir", lsg_fairseq.user_dir(), "--arch", "lsg_bart_tiny", *TRAIN]
    argv += ["--block-size", "16", "--sparse-block-size", "16", "--truncate-source", "--truncate-target"]
    first = tmp_path / "ck"
    monkeypatch.setattr(sys, "argv", ["fairseq-train", *argv, "--save-dir", str(first)])
    train.cli_main()
    last = first / "checkpoint_last.pt"
    saved = last.read_bytes()
    code, err = fairseq_train(
        [*argv, "--save-dir", str(first), "--max-update", "2", "--sparsity-type", "stride", "--block-size", "32"],
        capsys,
        monkeypatch,
    )
    assert code == 2 and "Traceback" not in err
    assert one_error_line(err, "fairseq-train").startswith(
        f"fairseq-train: error: {last} (the checkpoint this run resumes): its model was built with --block-size 16 "
        "--sparsity-type norm, this run builds --block-size 32 --sparsity-type stride; no weight records these settings"
    ), err[-800:]
    assert last.read_bytes() == saved
    # a new run from it, with other settings: meant, maybe; said, and it trains
    tuned = tmp_path / "tuned"
    monkeypatch.setattr(
        sys,
        "argv",
        [
            "fairseq-train",
            *argv,
            "--save-dir",
            str(tuned),
            "--finetune-from-model",
            str(last),
            "--sparsity-type",
            "stride",
        ],
    )
    with caplog.at_level(logging.WARNING, logger="lsg_fairseq.checkpoint_policy"):
        train.cli_main()
    assert (
        f"--finetune-from-model {last}: its model was built with --sparsity-type norm, this run builds "
        "--sparsity-type stride; no weight records these settings, so the checkpoint loads into either: pass the "
        "checkpoint's flags unless the change is meant" in caplog.text
    )
    assert (tuned / "checkpoint_last.pt").is_file()


def test_led_windows_compare_as_the_encoder_reads_them():
    """One window for every layer and the same window listed per layer are one setting."""
    from argparse import Namespace

    from lsg_fairseq.models.led import LEDModel

    def settings(**kw):
        return LEDModel.weightless_settings(Namespace(encoder_layers=2, global_attention="first", **kw))

    assert settings(attention_window="32", global_token_ids="5,0") == settings(
        attention_window="32,32", global_token_ids="0,5"
    )
    assert settings(attention_window="32", global_token_ids="")["attention_window"] == [32, 32]
    assert settings(attention_window="32,64", global_token_ids="") != settings(
        attention_window="32", global_token_ids=""
    )


@pytest.mark.parametrize(
    "flags,expected",
    [
        (["--block-size", "16", "--sparsity-factor", "3"], "--sparsity-factor (3) must divide --block-size (16)"),
        (["--profile"], "--profile: fairseq runs the command under the CUDA profiler with it"),  # before call_main
    ],
    ids=["model_flags", "profile"],
)
def test_real_fairseq_train_process_prints_one_line(word_data, tmp_path, flags, expected):
    """The console script itself (the hooks are installed by --user-dir's import, not by the tests)."""
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.run(
        [
            fairseq_cli("fairseq-train"),
            str(word_data),
            "--user-dir",
            lsg_fairseq.user_dir(),
            "--arch",
            "lsg_bart_tiny",
            *TRAIN,
            "--save-dir",
            str(tmp_path / "ck"),
            *flags,
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert expected in one_error_line(proc.stderr, "fairseq-train")


@pytest.mark.parametrize(
    "flag,stock_error,expected",
    [
        (
            "--profile",
            AssertionError,  # torch.cuda.profiler.profile(): "Torch not compiled with CUDA enabled"
            "--profile: fairseq runs the command under the CUDA profiler with it (NVTX ranges for Nsight Systems), "
            "and here --cpu is given; drop it",
        ),
        (
            "--use-plasma-view",
            ImportError,  # "please run pip install pyarrow", whether pyarrow is installed or not
            "--use-plasma-view: fairseq's plasma store shares language_modeling's token blocks, and this task has "
            "none to share; drop it",
        ),
    ],
)
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")  # the stock PlasmaStore's __del__
def test_what_fairseq_train_starts_before_the_run_is_vetted_first(
    word_data, tmp_path, capsys, monkeypatch, flag, stock_error, expected
):
    """fairseq-train's cli_main enters the CUDA profiler, or starts a plasma store, between parsing and
    call_main, where the task's checks ran: a traceback. With the plugin imported as fairseq-train
    imports it (its module loaded), the config is vetted as cli_main makes it."""
    from fairseq_cli import train

    from lsg_fairseq import fairseq_fixes
    from lsg_fairseq.fairseq_fixes._wrap import original

    argv = [str(word_data), "--user-dir", lsg_fairseq.user_dir(), "--arch", "lsg_bart_tiny", *TRAIN]
    argv += ["--save-dir", str(tmp_path / "ck"), flag]
    stock = original(train, "convert_namespace_to_omegaconf")
    monkeypatch.setattr(train, "convert_namespace_to_omegaconf", stock)  # and back after the test
    monkeypatch.setattr(sys, "argv", ["fairseq-train", *argv])
    with pytest.raises(stock_error):
        train.cli_main()
    fairseq_fixes.install()  # as --user-dir's import does in fairseq-train, whose module is loaded then
    code, err = fairseq_train(argv, capsys, monkeypatch)
    assert code == 2 and one_error_line(err, "fairseq-train") == f"fairseq-train: error: {expected}"
    assert not (tmp_path / "ck").exists()


# ----------------------------------------------------------------------------- nothing skipped silently
def test_over_long_training_targets_refused_with_flags_named(word_data):
    task, _, _ = build_task(word_data, "--max-target-positions", "8")
    task.load_dataset("train")
    ds = task.dataset("train")
    # fairseq's trainer always passes ignore_invalid_inputs=True for training (it would skip them)
    with pytest.raises(ConfigError) as e:
        task.get_batch_iterator(ds, max_tokens=100000, max_positions=task.max_positions(), ignore_invalid_inputs=True)
    msg = str(e.value)
    assert f"{word_data}/train: 12 of 12 examples have a target longer than 8 tokens" in msg
    assert "pass --truncate-target" in msg and "--max-target-positions 8" in msg


def test_truncate_target_counts_instead(word_data):
    task, _, _ = build_task(word_data, "--max-target-positions", "8", "--truncate-target")
    task.load_dataset("train")
    ds = task.dataset("train")
    batches = task.get_batch_iterator(
        ds, max_tokens=100000, max_positions=task.max_positions(), ignore_invalid_inputs=True
    ).next_epoch_itr(shuffle=False)
    assert sum(len(b["id"]) for b in batches) == 12  # nothing skipped
    assert task.truncation_counts["train"]["target"] == 12


def test_max_tokens_below_one_document_refused_with_flag_named(word_data):
    from fairseq import utils

    task, _, _ = build_task(word_data)
    task.load_dataset("train")
    ds = task.dataset("train")
    # what fairseq's trainer passes: the task's limits folded with --max-tokens
    limits = utils.resolve_max_positions(task.max_positions(), (1024, 1024), 40)
    with pytest.raises(ConfigError) as e:
        task.get_batch_iterator(ds, max_tokens=40, max_positions=limits, ignore_invalid_inputs=True)
    msg = str(e.value)
    assert f"{word_data}/train:" in msg and "--max-tokens 40 is smaller than one example" in msg
    assert "raise --max-tokens to at least" in msg


def test_a_validation_split_names_max_tokens_valid(word_data, monkeypatch):
    """fairseq-train batches validation with --max-tokens-valid: an example above it was blamed on
    --max-tokens (which the run had set far higher)."""
    from fairseq import utils

    task, _, _ = build_task(word_data)
    monkeypatch.setattr(type(task), "valid_subsets", ("valid",))  # what vet_run sets under fairseq-train
    task.load_dataset("valid")
    limits = utils.resolve_max_positions(task.max_positions(), (1024, 1024), 40)
    with pytest.raises(ConfigError) as e:
        task.get_batch_iterator(task.dataset("valid"), max_tokens=40, max_positions=limits, ignore_invalid_inputs=True)
    assert "--max-tokens-valid 40 is smaller than one example; raise --max-tokens-valid to at least" in str(e.value)


@pytest.mark.parametrize("truncate", [False, True])
def test_a_lower_target_limit_is_advised_with_truncation(word_data, truncate):
    """Targets are cut only with --truncate-target: without it, "lower --max-target-positions" led to
    the next refusal (a target longer than --max-target-positions)."""
    import numpy as np

    task, _, _ = build_task(word_data, *(["--truncate-target"] if truncate else []))

    class Sizes:  # sources that fit, a target that does not
        src_sizes, tgt_sizes = np.array([5, 5]), np.array([30, 9])

    with_truncation = "" if truncate else " with --truncate-target"
    task._batch_max_tokens = 20  # --max-tokens 20, folded into both limits as fairseq-train does
    with pytest.raises(ConfigError, match=f"or lower --max-target-positions{with_truncation}$"):
        task._refuse_over_long([0, 1], Sizes(), (20, 20))
    task._batch_max_tokens = None  # a model that accepts 20 target tokens, the task's limit above it
    with pytest.raises(ConfigError, match=f"lower --max-target-positions to 20{with_truncation}$"):
        task._refuse_over_long([0, 1], Sizes(), (1024, 20))


@pytest.mark.parametrize(
    "flags,expected",
    [
        (["--max-target-positions", "8"], "examples have a target longer than 8 tokens"),
        (["--truncate-target", "--max-tokens", "40"], "--max-tokens 40 is smaller than one example"),
    ],
)
def test_fairseq_train_refuses_instead_of_skipping(word_data, tmp_path, capsys, monkeypatch, flags, expected):
    """The README pipeline's failure: fairseq skipped every training example, then "The dataset is empty"."""
    code, err = fairseq_train(
        [
            str(word_data),
            "--user-dir",
            lsg_fairseq.user_dir(),
            "--arch",
            "lsg_bart_tiny",
            *TRAIN,
            "--block-size",
            "16",
            "--sparse-block-size",
            "16",
            "--save-dir",
            str(tmp_path / "ck"),
            *flags,
        ],
        capsys,
        monkeypatch,
    )
    assert code == 2
    line = one_error_line(err, "fairseq-train")
    assert f"{word_data}/train: 12 of 12" in line and expected in line
    assert "dataset is empty" not in err


# ----------------------------------------------------------------------------- option dictionaries
@pytest.mark.parametrize(
    "value,expected",
    [
        ('{"beam_size": 0, "max_len": 5}', "--eval-rouge-args: unknown key(s) 'beam_size', 'max_len'; known: beam,"),
        ('{"beam": 0}', "--eval-rouge-args: beam must be an integer >= 1, got 0"),
        ('{"beam": 2.5}', "--eval-rouge-args: beam must be an integer, got 2.5"),
        ('{"lenpen": "1"}', '--eval-rouge-args: lenpen must be a number, got "1"'),
        ('{"sampling": 1}', "--eval-rouge-args: sampling must be true or false, got 1"),
        ('{"min_len": 9, "max_len_b": 5}', "--eval-rouge-args: min_len 9 is above max_len_b 5"),
        (
            "{beam: 4}",
            "--eval-rouge-args: not valid JSON (Expecting property name enclosed in double quotes at column 2)",
        ),
        ('{"beam": ' + "[" * 100_000, "--eval-rouge-args: not valid JSON (nested too deeply)"),  # a RecursionError
        ("[4]", "--eval-rouge-args: expected a JSON object, got list"),
    ],
)
def test_eval_rouge_args_validated(word_data, value, expected):
    with pytest.raises(ConfigError) as e:
        build_task(word_data, "--eval-rouge-args", value)
    assert expected in str(e.value)


def test_eval_rouge_args_good_values_accepted(word_data):
    task, _, _ = build_task(word_data, "--eval-rouge-args", '{"beam": 2, "max_len_a": 0.5, "sampling": false}')
    assert task.cfg.eval_rouge_args  # built without error


# ----------------------------------------------------------------------------- all-or-nothing converter
KILL_POINTS = {
    # a family has written model.pt into the temp folder
    "after_checkpoint": "lsg_fairseq.convert.common.save_checkpoint",
    # everything written, not yet moved into place
    "before_swap": "lsg_text.atomic._fsync_tree",
    # swapped in, the old folder not yet deleted
    "after_swap": "shutil.rmtree",
}


_CHILD = """
import importlib, json, os, signal, sys
point, target, src, out, extra = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], json.loads(sys.argv[5])
module_name, attr = target.rsplit(".", 1)
module = importlib.import_module(module_name)
original = getattr(module, attr)

def killer(*args, **kwargs):
    result = original(*args, **kwargs) if point != "after_swap" else None
    os.kill(os.getpid(), signal.SIGKILL)
    return result

setattr(module, attr, killer)
from lsg_fairseq.convert import convert
convert(src, out, force=True, **extra)
"""


def _converted_in_child(point, src, out, extra):
    """A fresh Python converts with --force and SIGKILLs itself at ``point``; returns its exit code.

    A new process, not os.fork(): a fork of this (torch-threaded) process can deadlock in the
    child on a lock another thread held, which hung the suite."""

    r = subprocess.run(
        [sys.executable, "-c", _CHILD, point, KILL_POINTS[point], src, out, json.dumps(extra)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    return r.returncode


@pytest.mark.parametrize("point", list(KILL_POINTS))
def test_converter_killed_leaves_old_or_complete_new(tmp_path, point):
    from lsg_fairseq.convert import convert

    out = str(tmp_path / "out")
    convert(BART_HF, out)  # the previous OUT
    before = folder_state(out)
    code = _converted_in_child(point, BART_HF, out, {"max_source_positions": 2048})
    assert code == -signal.SIGKILL
    after = folder_state(out)
    if point == "after_swap":  # the new folder is in place, complete
        assert after.keys() == before.keys() and after["model.pt"] != before["model.pt"]
        from lsg_fairseq.models.hub import from_pretrained

        assert from_pretrained(out).model.max_positions()[0] == 2048
    else:
        assert after == before  # untouched, byte for byte
    leftovers = [n for n in os.listdir(tmp_path) if n != "out"]
    assert all(n.startswith(".out.") and n.endswith(".tmp") for n in leftovers)
    convert(BART_HF, out, force=True)  # the next run cleans up what the killed one left
    assert os.listdir(tmp_path) == ["out"]


def test_atomic_folder_failure_leaves_out_untouched(tmp_path):
    from lsg_text.atomic import atomic_folder

    out = tmp_path / "out"
    out.mkdir()
    (out / "a.txt").write_text("old")
    with pytest.raises(RuntimeError):
        with atomic_folder(str(out), force=True) as tmp:
            open(os.path.join(tmp, "b.txt"), "w").write("new")
            raise RuntimeError("disk full")
    assert folder_state(out) == {"a.txt": b"old"} and os.listdir(tmp_path) == ["out"]
    with atomic_folder(str(out), force=True) as tmp:
        open(os.path.join(tmp, "b.txt"), "w").write("new")
    assert folder_state(out) == {"b.txt": b"new"}  # replaced as a whole: no a.txt
    assert os.listdir(tmp_path) == ["out"]


def test_unwritable_output_location_is_one_line(tmp_path, capsys):
    """An output under a regular file (as root, permissions cannot make a folder unwritable)."""
    blocker = tmp_path / "file.txt"
    blocker.write_text("not a folder\n")
    code, line = run_convert([BART_HF, blocker / "out"], capsys)
    # refused before the conversion (check_output_folder), not by the write after it
    assert code == 2 and line.endswith(
        f"output folder {blocker / 'out'}: {blocker} is a file, not a folder (choose another path)"
    )
    model_dir = tmp_path / "model"
    convert_main([BART_HF, str(model_dir)])
    capsys.readouterr()
    (tmp_path / "doc.txt").write_text("a short document\n")
    with pytest.raises(SystemExit) as e:
        summarize.main(
            [
                str(model_dir),
                str(tmp_path / "doc.txt"),
                "--beam",
                "1",
                "--max-len-b",
                "3",
                "--quiet",
                "--output",
                str(blocker / "summaries.txt"),
            ]
        )
    assert e.value.code == 2
    assert f"--output {blocker}" in one_error_line(capsys.readouterr().err, "lsg-fairseq-summarize")


@pytest.mark.parametrize("flag", ["--save-dir", "--tensorboard-logdir"])
@pytest.mark.parametrize("where", ["is_file", "below_file"])
def test_train_output_folder_of_the_wrong_kind_is_one_line(word_data, tmp_path, capsys, monkeypatch, flag, where):
    """fairseq's own: a traceback from os.makedirs (FileExistsError or NotADirectoryError), for
    --save-dir after its "Unable to access checkpoint save directory" warning."""
    (tmp_path / "taken").write_text("a file the user keeps\n")
    folder = tmp_path / "taken" if where == "is_file" else tmp_path / "taken" / "run1"
    argv = [str(word_data), "--user-dir", lsg_fairseq.user_dir(), "--arch", "lsg_bart_tiny", *TRAIN]
    argv += ["--block-size", "16", "--sparse-block-size", "16", "--truncate-source", "--truncate-target"]
    if flag != "--save-dir":
        argv += ["--save-dir", str(tmp_path / "ck")]
    code, err = fairseq_train([*argv, flag, str(folder)], capsys, monkeypatch)
    line = one_error_line(err, "fairseq-train")
    assert code == 2 and line.startswith(f"fairseq-train: error: {flag} {folder}:"), line
    assert (tmp_path / "taken").read_text() == "a file the user keeps\n"
    assert not (tmp_path / "ck").exists()


@pytest.mark.parametrize(
    "flag,value,expected",
    [
        ("--save-dir", "", "--save-dir: an empty path (give a path)"),  # fairseq: os.makedirs('') traceback
        # fairseq's IsADirectoryError from its log handler (and our explanation blamed --save-dir, below it)
        ("--log-file", "{tmp}", "--log-file {tmp}: is a folder (give the path of a file, e.g. one inside it)"),
        (  # fairseq's FileNotFoundError: it opens the file first, in a folder it does not make
            "--log-file",
            "{tmp}/logs/train.log",
            "--log-file {tmp}/logs/train.log: the folder {tmp}/logs does not exist, and fairseq-train does not make it "
            "(make it first)",
        ),
    ],
    ids=["empty_save_dir", "log_file_is_a_folder", "log_file_in_no_folder"],
)
def test_train_log_file_and_an_empty_save_dir_are_one_line(
    word_data, tmp_path, capsys, monkeypatch, flag, value, expected
):
    argv = [str(word_data), "--user-dir", lsg_fairseq.user_dir(), "--arch", "lsg_bart_tiny", *TRAIN]
    argv.append("--truncate-target")
    if flag != "--save-dir":
        argv += ["--save-dir", str(tmp_path / "ck")]
    code, err = fairseq_train([*argv, flag, value.format(tmp=tmp_path)], capsys, monkeypatch)
    line = one_error_line(err, "fairseq-train")
    assert code == 2 and line == f"fairseq-train: error: {expected.format(tmp=tmp_path)}"
    assert not (tmp_path / "ck").exists() and not (tmp_path / "logs").exists()


@pytest.mark.parametrize(
    "flags,batches,refused",
    [
        (["--max-tokens", "4096"], 1, True),  # all 12 examples in one batch: the one dropped
        (["--max-tokens", "400", "--update-freq", "4"], 4, True),  # 3 kept, short of one update
        (["--max-tokens", "400", "--update-freq", "2"], 4, False),  # 3 kept: one update, one batch left
    ],
    ids=["one_batch", "short_of_an_update", "one_update"],
)
def test_skip_remainder_batch_with_no_update_in_an_epoch_is_one_line(
    word_data, tmp_path, capsys, monkeypatch, flags, batches, refused
):
    """--skip-remainder-batch drops an epoch's last batch, then the batches short of --update-freq:
    with none left fairseq-train ended the epoch in an UnboundLocalError ("valid_losses") traceback,
    leaving an empty --save-dir. The one-update case checks updates_per_epoch against fairseq's count."""
    from lsg_fairseq.tasks.run_settings import updates_per_epoch

    save_dir = tmp_path / "runs" / "ck"
    argv = [str(word_data), "--user-dir", lsg_fairseq.user_dir(), "--arch", "lsg_bart_tiny", *TRAIN]
    argv += ["--truncate-target", "--max-update", "0", "--max-epoch", "1", "--save-dir", str(save_dir)]
    argv += ["--skip-remainder-batch", *flags]
    update_freq = int(flags[-1]) if "--update-freq" in flags else 1
    if refused:
        code, err = fairseq_train(argv, capsys, monkeypatch)
        line = one_error_line(err, "fairseq-train")
        assert code == 2 and line.startswith(
            f"fairseq-train: error: --skip-remainder-batch: {word_data}/train makes {batches} batch"
        ), line
        assert "so no update would run" in line and ("lower --update-freq" in line) == (update_freq > 1)
        assert not (tmp_path / "runs").exists()  # fairseq-train's main had made it
    else:
        from fairseq_cli import train

        monkeypatch.setattr(sys, "argv", ["fairseq-train", *argv])
        train.cli_main()
        saved = torch.load(save_dir / "checkpoint_last.pt", map_location="cpu", weights_only=False)
        assert saved["optimizer_history"][-1]["num_updates"] == updates_per_epoch(batches, update_freq, True) == 1


@pytest.mark.parametrize("flag", ["--save-dir", "--tensorboard-logdir"])
def test_train_output_folder_that_cannot_be_made_is_one_line(word_data, tmp_path, capsys, monkeypatch, flag):
    """A folder the kernel will not make whatever the permissions (in /proc, even for root; on a
    cluster, a read-only or foreign mount): fairseq's FileNotFoundError traceback from os.makedirs,
    for the logs after the data and the model are loaded. Explained when it happens, naming the flag."""
    folder = f"/proc/lsg-fairseq-{os.getpid()}/run1"
    argv = [str(word_data), "--user-dir", lsg_fairseq.user_dir(), "--arch", "lsg_bart_tiny", *TRAIN]
    argv += ["--block-size", "16", "--sparse-block-size", "16", "--truncate-target", "--save-dir", str(tmp_path / "ck")]
    code, err = fairseq_train([*argv, flag, folder], capsys, monkeypatch)
    line = one_error_line(err, "fairseq-train")
    assert code == 2 and "Traceback" not in err
    assert line == (
        f"fairseq-train: error: {flag} {folder}: cannot be made or written in (No such file or directory: "
        f"{os.path.dirname(folder)}); choose another folder"
    ), line


def test_an_input_this_user_may_not_read_is_one_line(tmp_path, monkeypatch, capsys):
    """require_file, where every script's inputs are checked: an unreadable file was a PermissionError
    traceback from seven scripts (root reads everything, so os.access is stood in for)."""
    from lsg_text.fileio import DataError, require_file

    locked = tmp_path / "train.jsonl"
    locked.write_text('{"document": "a", "summary": "b"}\n')
    real_access = os.access
    monkeypatch.setattr(os, "access", lambda p, mode: os.path.abspath(p) != str(locked) and real_access(p, mode))
    with pytest.raises(DataError, match=f"^--input train: {locked} is not readable for this user$"):
        require_file(str(locked), "--input train")
    script = load_script("scripts/jsonl_to_parallel.py", "jsonl_to_parallel")
    assert script.main(["--input", f"train={locked}", "--output-dir", str(tmp_path / "out")]) == 2
    assert "is not readable for this user" in capsys.readouterr().err and not (tmp_path / "out").exists()


def test_a_broken_link_as_output_is_one_line(tmp_path):
    """An output path that is a symbolic link to nothing (or a loop) was a FileExistsError traceback
    from makedirs, or, for lsg-fairseq-convert and -export, an error naming their staging folder."""
    from lsg_fairseq.convert import ConversionError, convert
    from lsg_text.fileio import DataError, check_output_path

    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere" / "out")
    for folder in (True, False):
        with pytest.raises(DataError, match="a symbolic link to .*nowhere/out, which does not exist"):
            check_output_path(str(tmp_path / "dangling"), "--out", folder=folder)
    with pytest.raises(ConversionError, match=f"^output folder {tmp_path / 'dangling'}: a symbolic link to"):
        convert(BART_HF, str(tmp_path / "dangling"))
    (tmp_path / "afile").write_text("x")  # below a file: the staging folder's error named before
    with pytest.raises(ConversionError, match=f"^output folder {tmp_path / 'afile' / 'hf'}: {tmp_path / 'afile'} is a"):
        convert(BART_HF, str(tmp_path / "afile" / "hf"))


@pytest.mark.parametrize("command", ["convert", "export"])
def test_a_write_that_fails_names_the_output_not_its_staging_copy(tmp_path, monkeypatch, capsys, command):
    """A full disk during the write: one line naming OUT_DIR / HF_DIR (lsg-fairseq-export showed a
    traceback; both would name the hidden temp folder, which is gone by then)."""
    import errno

    import lsg_fairseq.convert as convert_package
    from lsg_fairseq.cli import export as export_cli

    out = tmp_path / "hf"
    staged = tmp_path / ".hf.x1y2z3.tmp" / "model.safetensors"

    def disk_full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device", str(staged))

    monkeypatch.setattr(convert_package, command, disk_full)
    main = {"convert": convert_main, "export": export_cli.main}[command]
    with pytest.raises(SystemExit) as e:
        main([BART_HF, str(out)])
    line = one_error_line(capsys.readouterr().err, f"lsg-fairseq-{command}")
    left = {"convert": "OUT_DIR", "export": "HF_DIR"}[command]
    assert e.value.code == 2 and line.endswith(f"error: {out}: No space left on device ({left} left unchanged)"), line


def test_an_output_folder_this_user_may_not_write_in_is_refused_up_front(tmp_path, monkeypatch):
    """check_output_path: the nearest existing folder where an output goes must be writable (as
    root here every folder is, so os.access is stood in for: a read-only mount or another user's
    folder on a cluster). The folder checked is the nearest one that exists, where the missing ones
    would be made, not only the path's own parent."""
    from lsg_text.fileio import DataError, check_output_path

    locked = tmp_path / "locked"
    locked.mkdir()
    real_access = os.access
    monkeypatch.setattr(os, "access", lambda p, mode: os.path.abspath(p) != str(locked) and real_access(p, mode))
    for path, folder in ((locked / "a" / "run1", True), (locked, True), (locked / "out.txt", False)):
        with pytest.raises(DataError) as e:
            check_output_path(str(path), "--out", folder=folder)
        assert str(e.value) == f"--out {path}: {locked} is not writable for this user (choose another path)"
    check_output_path(str(tmp_path / "free" / "run1"), "--out", folder=True)
    check_output_path(str(tmp_path / "out.txt"), "--out")
