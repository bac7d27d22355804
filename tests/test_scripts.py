"""The offline data scripts, run as a user would (subprocess) on a few real documents.

Happy paths run each script once in a subprocess on 4 SumPubMed examples per split, chained as in
the README (JSONL -> parallel text -> sentencepiece -> fairseq-preprocess). Error cases call the
scripts' ``main(argv)`` in-process (same code, no second interpreter start) and check the message
names the file/flag and that no output file was left behind.
"""

import json
import os
import subprocess
import sys

import pytest

import conftest
from conftest import DOCUMENTS

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPTS = os.path.join(REPO_ROOT, "scripts")
SUMPUBMED = os.path.join(DOCUMENTS, "sumpubmed")
N = 4  # examples per split: enough for line-count checks, small enough for a fast test file


def run_script(name, *args, check=True):
    cmd = (["bash"] if name.endswith(".sh") else [sys.executable]) + [os.path.join(SCRIPTS, name), *map(str, args)]
    proc = subprocess.run(
        cmd, capture_output=True, text=True, env={**os.environ, "PYTHON": sys.executable}, cwd=REPO_ROOT
    )
    if check and proc.returncode != 0:
        raise AssertionError(f"{name} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return proc


def load_script(name):
    return conftest.load_script(f"scripts/{name}", "script_" + name[:-3])


def read_lines(path):
    with open(path, encoding="utf-8") as f:
        return f.read().split("\n")[:-1]


def files_in(folder):
    return sorted(os.listdir(folder)) if os.path.isdir(folder) else []


@pytest.fixture(scope="module")
def pipeline(tmp_path_factory):
    """jsonl_to_parallel -> spm_train -> spm_encode -> preprocess.sh, once for the module."""
    root = tmp_path_factory.mktemp("pipeline")
    raw, spm_dir, enc, binarized = root / "raw", root / "spm", root / "enc", root / "bin"
    run_script(
        "jsonl_to_parallel.py", "--input-dir", SUMPUBMED, "--output-dir", raw, "--max-examples", N, "--write-ids"
    )
    run_script(
        "spm_train.py",
        "--inputs",
        raw / "train.source",
        raw / "train.target",
        "--model-prefix",
        spm_dir / "spm",
        "--vocab-size",
        600,
        "--character-coverage",
        1.0,
        "--threads",
        1,
    )
    srcs = [raw / f"{s}.{side}" for s in ("train", "valid") for side in ("source", "target")]
    run_script(
        "spm_encode.py",
        "--model",
        spm_dir / "spm.model",
        "--inputs",
        *srcs,
        "--outputs",
        *[enc / p.name for p in srcs],
        "--threads",
        1,
    )
    run_script(
        "preprocess.sh",
        "--trainpref",
        enc / "train",
        "--validpref",
        enc / "valid",
        "--destdir",
        binarized,
        "--dict",
        spm_dir / "dict.txt",
    )
    return {"raw": raw, "spm": spm_dir, "enc": enc, "bin": binarized}


# ----------------------------------------------------------------------------- jsonl_to_parallel


def test_jsonl_to_parallel_one_example_per_line(pipeline):
    raw = pipeline["raw"]
    assert files_in(raw) == sorted(f"{s}.{e}" for s in ("train", "valid", "test") for e in ("source", "target", "id"))
    with open(os.path.join(SUMPUBMED, "train.jsonl"), encoding="utf-8") as f:
        originals = [json.loads(next(f)) for _ in range(N)]
    src, tgt, ids = (read_lines(raw / "train.source"), read_lines(raw / "train.target"), read_lines(raw / "train.id"))
    assert len(src) == len(tgt) == len(ids) == N
    for ex, s, t, i in zip(originals, src, tgt, ids):
        assert "\n" in ex["document"]  # paragraphs in the JSONL ...
        assert s == " ".join(ex["document"].split())  # ... collapsed to single spaces
        assert t == " ".join(ex["summary"].split())
        assert i == ex["id"]


def test_jsonl_to_parallel_newline_token(tmp_path):
    src = tmp_path / "in.jsonl"
    src.write_text(json.dumps({"document": "First para.\nSecond  para\n\nthird", "summary": "s\nt"}) + "\n")
    assert (
        load_script("jsonl_to_parallel.py").main(
            ["--input", f"train={src}", "--output-dir", str(tmp_path / "o"), "--newline-token", "<n>"]
        )
        == 0
    )
    assert read_lines(tmp_path / "o" / "train.source") == ["First para. <n> Second para <n> third"]
    assert read_lines(tmp_path / "o" / "train.target") == ["s <n> t"]


def test_jsonl_to_parallel_refuses_to_write_over_its_input(tmp_path, capsys):
    """A JSONL input named like one of the outputs (test.source in --output-dir): one line, the
    input kept (it was replaced by the flattened text, exit 0)."""
    src = tmp_path / "test.source"
    src.write_text(json.dumps({"document": "a b", "summary": "c"}) + "\n")
    before = src.read_bytes()
    argv = ["--input", f"test={src}", "--output-dir", str(tmp_path)]
    assert load_script("jsonl_to_parallel.py").main(argv) == 2
    assert "would overwrite the input" in one_error_line(capsys.readouterr().err, "jsonl_to_parallel.py")
    assert src.read_bytes() == before and not (tmp_path / "test.target").exists()


@pytest.mark.parametrize(
    "line, message",
    [
        ('{"document": "a b", "summary": "  \\n "}', "train.jsonl:2: field 'summary' is empty"),
        ('{"document": "", "summary": "x"}', "train.jsonl:2: field 'document' is empty"),
        ('{"document": "a b"}', "train.jsonl:2: missing field 'summary'"),
        ('{"document": "a b", "summary": ', "train.jsonl:2: not valid JSON"),
        ('{"document": ' + "[" * 100_000, "train.jsonl:2: not valid JSON (nested too deeply)"),  # a RecursionError
        ('["a", "b"]', "train.jsonl:2: expected a JSON object"),
    ],
)
def test_jsonl_to_parallel_bad_line_names_file_and_line(tmp_path, capsys, line, message):
    in_dir, out_dir = tmp_path / "in", tmp_path / "out"
    in_dir.mkdir()
    good = json.dumps({"document": "d", "summary": "s"})
    (in_dir / "train.jsonl").write_text(good + "\n" + line + "\n")
    (in_dir / "valid.jsonl").write_text(good + "\n")
    rc = load_script("jsonl_to_parallel.py").main(
        ["--input-dir", str(in_dir), "--output-dir", str(out_dir), "--splits", "valid", "train"]
    )
    err = capsys.readouterr().err
    assert rc == 2 and message in err and str(in_dir / "train.jsonl") in err
    # valid.jsonl was fine and converted first, yet nothing is left: outputs are all-or-nothing.
    assert files_in(out_dir) == []


def test_jsonl_to_parallel_keeps_old_outputs_on_error(tmp_path, capsys):
    in_dir, out_dir = tmp_path / "in", tmp_path / "out"
    in_dir.mkdir()
    out_dir.mkdir()
    (out_dir / "train.source").write_text("old\n")
    (in_dir / "train.jsonl").write_text('{"document": "d", "summary": ""}\n')
    assert (
        load_script("jsonl_to_parallel.py").main(
            ["--input-dir", str(in_dir), "--output-dir", str(out_dir), "--splits", "train"]
        )
        == 2
    )
    assert files_in(out_dir) == ["train.source"] and (out_dir / "train.source").read_text() == "old\n"


def test_jsonl_to_parallel_missing_input_dir(tmp_path, capsys):
    missing = tmp_path / "no_such_dir"
    rc = load_script("jsonl_to_parallel.py").main(["--input-dir", str(missing), "--output-dir", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert rc == 2 and "--input-dir" in err and str(missing) in err and "not found" in err
    assert not (tmp_path / "out").exists()


def test_jsonl_to_parallel_missing_split_file(tmp_path, capsys):
    (tmp_path / "train.jsonl").write_text('{"document": "d", "summary": "s"}\n')
    rc = load_script("jsonl_to_parallel.py").main(["--input-dir", str(tmp_path), "--output-dir", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert rc == 2 and str(tmp_path / "valid.jsonl") in err
    assert not (tmp_path / "out").exists()


# ----------------------------------------------------------------------------- sentencepiece


def test_spm_dict_matches_model_ids(pipeline):
    import sentencepiece as spm
    from fairseq.data import Dictionary

    sp = spm.SentencePieceProcessor(model_file=str(pipeline["spm"] / "spm.model"))
    assert [sp.id_to_piece(i) for i in range(4)] == ["<s>", "<pad>", "</s>", "<unk>"]
    d = Dictionary.load(str(pipeline["spm"] / "dict.txt"))
    assert len(d) == sp.get_piece_size() == 600
    # fairseq index == sentencepiece id for every piece
    assert all(d.index(sp.id_to_piece(i)) == i for i in range(4, sp.get_piece_size()))
    assert (d.bos(), d.pad(), d.eos(), d.unk()) == (0, 1, 2, 3)
    assert (pipeline["spm"] / "spm.vocab").exists() and not [f for f in files_in(pipeline["spm"]) if f.startswith(".")]


def test_spm_encode_round_trip_through_fairseq(pipeline):
    """Binarized tokens equal the sentencepiece ids, and fairseq's decoding restores the text."""
    import unicodedata

    import sentencepiece as spm
    from fairseq.data import Dictionary, data_utils
    from fairseq.data.encoders.sentencepiece_bpe import SentencepieceBPE, SentencepieceConfig

    sp = spm.SentencePieceProcessor(model_file=str(pipeline["spm"] / "spm.model"))
    bpe = SentencepieceBPE(SentencepieceConfig(sentencepiece_model=str(pipeline["spm"] / "spm.model")))
    d = Dictionary.load(str(pipeline["bin"] / "dict.target.txt"))
    for split in ("train", "valid"):
        raw = read_lines(pipeline["raw"] / f"{split}.target")
        encoded = read_lines(pipeline["enc"] / f"{split}.target")
        assert len(raw) == len(encoded) == N
        dataset = data_utils.load_indexed_dataset(str(pipeline["bin"] / f"{split}.source-target.target"), d)
        assert len(dataset) == N
        for i, (text, pieces) in enumerate(zip(raw, encoded)):
            assert pieces == bpe.encode(text)  # same strings as fairseq's online encoder
            tokens = dataset[i].tolist()
            assert tokens[-1] == d.eos() and tokens[:-1] == sp.encode(text)
            if split == "train":
                # Every character was seen in training (coverage 1.0), so the text comes back;
                # the model's default nmt_nfkc normalization is the only change allowed. (valid
                # has unseen characters, e.g. curly quotes, which decode as <unk>.)
                assert bpe.decode(d.string(dataset[i])) == unicodedata.normalize("NFKC", text)


def test_spm_train_vocab_too_large_leaves_nothing(tmp_path, capsys):
    (tmp_path / "t.txt").write_text("a tiny corpus. it has few words.\n" * 20)
    out = tmp_path / "spm"
    main = load_script("spm_train.py").main
    assert main(["--inputs", str(tmp_path / "t.txt"), "--model-prefix", str(out / "m"), "--vocab-size", "5000"]) == 2
    assert "--vocab-size" in capsys.readouterr().err
    assert files_in(out) == []  # no model without its dict, no temp folder
    assert main(["--inputs", str(tmp_path / "nope.txt"), "--model-prefix", str(out / "m")]) == 2
    assert f"--inputs: file not found: {tmp_path / 'nope.txt'}" in capsys.readouterr().err


def test_spm_train_replaces_a_model_only_with_force(tmp_path, capsys):
    """A rerun into the same prefix would leave text encoded, and data binarized, with the old model."""
    (tmp_path / "t.txt").write_text("a tiny corpus. it has few words, and a few more words.\n" * 20)
    main = load_script("spm_train.py").main
    args = ["--inputs", str(tmp_path / "t.txt"), "--model-prefix", str(tmp_path / "spm" / "m"), "--vocab-size", "30"]
    assert main(args) == 0
    before = {name: (tmp_path / "spm" / name).read_bytes() for name in files_in(tmp_path / "spm")}
    assert sorted(before) == ["dict.txt", "m.model", "m.vocab"]
    capsys.readouterr()
    assert main([*args[:-1], "40"]) == 2
    err = one_error_line(capsys.readouterr().err, "spm_train.py")
    assert f"{tmp_path / 'spm' / 'm.model'}: exists (pass --force to replace the m.model, m.vocab, dict.txt" in err
    assert {name: (tmp_path / "spm" / name).read_bytes() for name in files_in(tmp_path / "spm")} == before
    assert "; or choose another --model-prefix)" in err
    assert main([*args[:-1], "40", "--force"]) == 0
    assert len((tmp_path / "spm" / "dict.txt").read_text().splitlines()) == 40 - 4
    # a --dict in the way, the model files not: its own flag is named (it read "--model-prefix")
    capsys.readouterr()
    assert (
        main(
            [
                *args[:-1],
                "40",
                "--model-prefix",
                str(tmp_path / "spm" / "m2"),
                "--dict",
                str(tmp_path / "spm" / "dict.txt"),
            ]
        )
        == 2
    )
    err = one_error_line(capsys.readouterr().err, "spm_train.py")
    assert f"{tmp_path / 'spm' / 'dict.txt'}: exists (pass --force to replace the dict.txt" in err
    assert err.endswith("; or choose another --dict)") and not (tmp_path / "spm" / "m2.model").exists()
    # --dict naming the model file: the dictionary replaced the model just trained, exit 0
    capsys.readouterr()
    assert main([*args[:-1], "40", "--model-prefix", str(tmp_path / "m3"), "--dict", str(tmp_path / "m3.model")]) == 2
    assert "--dict " + str(tmp_path / "m3.model") + ": given twice" in capsys.readouterr().err
    assert not (tmp_path / "m3.model").exists()


def test_spm_encode_missing_model(tmp_path, capsys):
    rc = load_script("spm_encode.py").main(
        ["--model", str(tmp_path / "nope.model"), "--inputs", "-", "--outputs", str(tmp_path / "o")]
    )
    err = capsys.readouterr().err
    assert rc == 2 and "--model" in err and "nope.model" in err and not (tmp_path / "o").exists()


# ----------------------------------------------------------------------------- preprocess.sh


def test_preprocess_writes_binarized_splits(pipeline):
    names = files_in(pipeline["bin"])
    for split in ("train", "valid"):
        for side in ("source", "target"):
            assert f"{split}.source-target.{side}.bin" in names and f"{split}.source-target.{side}.idx" in names
    assert "dict.source.txt" in names and "dict.target.txt" in names
    assert not [n for n in files_in(pipeline["bin"].parent) if n.startswith(".bin.tmp")]


def test_spm_binarize_equals_the_three_steps_run_by_hand(pipeline, tmp_path):
    """spm_binarize.sh (the data steps of demo.sh and the examples) gives the same sentencepiece
    encoding as spm_train.py + spm_encode.py run separately, binaries for all three splits and the
    sentencepiece model next to them."""
    out = tmp_path / "out"
    run_script(
        "spm_binarize.sh",
        "--raw-dir",
        pipeline["raw"],
        "--out-dir",
        out,
        "--vocab-size",
        600,
        "--",
        "--character-coverage",
        1.0,
        "--threads",
        1,
    )
    for split in ("train", "valid"):
        for side in ("source", "target"):
            assert (out / "spm-enc" / f"{split}.{side}").read_text() == (
                pipeline["enc"] / f"{split}.{side}"
            ).read_text()
    names = files_in(out / "bin")
    for split in ("train", "valid", "test"):
        for side in ("source", "target"):
            assert f"{split}.source-target.{side}.bin" in names
    assert (out / "bin" / "spm.model").read_bytes() == (out / "spm" / "spm.model").read_bytes()
    (pipeline["raw"].parent / "partial").mkdir()
    for side in ("source", "target"):
        (pipeline["raw"].parent / "partial" / f"train.{side}").write_text("a\n")
    proc = run_script(
        "spm_binarize.sh",
        "--raw-dir",
        pipeline["raw"].parent / "partial",
        "--out-dir",
        out,
        "--vocab-size",
        600,
        check=False,
    )
    partial = pipeline["raw"].parent / "partial"
    assert proc.returncode == 2 and f"--raw-dir: file not found: {partial}/valid.source" in proc.stderr
    assert "usage: spm_binarize.sh" in run_script("spm_binarize.sh", "--help").stdout


def test_preprocess_mismatched_line_counts(tmp_path):
    (tmp_path / "train.source").write_text("a\nb\nc\n")
    (tmp_path / "train.target").write_text("a\nb")  # last line without newline still counts
    proc = run_script("preprocess.sh", "--trainpref", tmp_path / "train", "--destdir", tmp_path / "bin", check=False)
    assert proc.returncode == 2
    assert f"{tmp_path}/train.source has 3 lines, {tmp_path}/train.target has 2 lines" in proc.stderr
    assert not (tmp_path / "bin").exists()


def test_preprocess_missing_file(tmp_path):
    (tmp_path / "train.source").write_text("a\n")
    (tmp_path / "train.target").write_text("a\n")
    proc = run_script(
        "preprocess.sh",
        "--trainpref",
        tmp_path / "train",
        "--validpref",
        tmp_path / "valid",
        "--destdir",
        tmp_path / "bin",
        check=False,
    )
    assert proc.returncode == 2 and f"--validpref: file not found: {tmp_path}/valid.source" in proc.stderr
    assert not (tmp_path / "bin").exists()


def test_text_checks_counts_as_fairseq_reads_and_refuses_a_malformed_call(tmp_path, capsys):
    """lsg_text/text_checks.py, the checks preprocess.sh and spm_binarize.sh run first: a last line
    without its newline is an example (as fairseq reads it); counts are printed only once all passed."""
    from lsg_text import text_checks

    (tmp_path / "a.source").write_text("x\ny\n")
    (tmp_path / "a.target").write_text("x\ny")
    ok = ["pair", "--trainpref", str(tmp_path / "a"), "output-folder", "--destdir", str(tmp_path / "new" / "bin")]
    assert text_checks.main(ok) == 0 and capsys.readouterr().out == f"{tmp_path / 'a'}: 2 examples\n"
    assert text_checks.main(ok + ["dict", "--dict", str(tmp_path / "a.source")]) == 1
    out, err = capsys.readouterr()
    assert out == "" and "--dict " in err and "not a fairseq dict.txt (line 1 is 'x'" in err
    for bad in (["pair", "--trainpref"], ["pairs", "--trainpref", str(tmp_path / "a")]):
        assert text_checks.main(bad) == 2 and "usage: python -m lsg_text.text_checks" in capsys.readouterr().err


def test_preprocess_help():
    proc = run_script("preprocess.sh", "--help")
    assert "--trainpref" in proc.stdout and "--dict" in proc.stdout


# ----------------------------------------------------------------------------- GPT-2 BPE


@pytest.fixture()
def tiny_gpt2(tmp_path):
    """A handmade byte-level BPE: the 256 byte symbols plus four merges."""
    from fairseq.data.encoders.gpt2_bpe_utils import bytes_to_unicode

    encoder = {ch: i for i, ch in enumerate(bytes_to_unicode().values())}
    for token in ("th", "the", "\u0120c", "\u0120ca"):  # \u0120 (Ġ) is GPT-2's symbol for a space
        encoder[token] = len(encoder)
    (tmp_path / "encoder.json").write_text(json.dumps(encoder))
    (tmp_path / "vocab.bpe").write_text("#version: 0.2\nt h\nth e\n\u0120 c\n\u0120c a\n", encoding="utf-8")
    return tmp_path, encoder


def test_gpt2_encode_matches_hand_merges(tiny_gpt2):
    folder, enc = tiny_gpt2
    # 250 more lines "cat", "the cat", "the the cat", ...: with 2 workers and chunks of 100 lines,
    # results come back from different processes and must still be in input order.
    extra = [" ".join(["the"] * (i % 4) + ["cat"]) for i in range(250)]
    (folder / "a.txt").write_text("the cat\n\n  the the \n" + "".join(x + "\n" for x in extra))
    (folder / "b.txt").write_text("a\nb\nc\n" + "a\n" * len(extra))
    proc = run_script(
        "gpt2_encode.py",
        "--encoder-json",
        folder / "encoder.json",
        "--vocab-bpe",
        folder / "vocab.bpe",
        "--inputs",
        folder / "a.txt",
        folder / "b.txt",
        "--outputs",
        folder / "a.ids",
        folder / "b.ids",
        "--keep-empty",
        "--workers",
        2,
    )
    # By hand: "the" -> t h e -> th e -> the; " cat" -> Ġ c a t -> Ġc a t -> Ġca t;
    # " the" -> Ġ t h e -> Ġ th e -> Ġ the (no merge "Ġ the"); "cat" -> c a t (no merge "c a").
    ids = lambda *tokens: " ".join(str(enc[t]) for t in tokens)  # noqa: E731
    g = "\u0120"
    expected_extra = [
        ids(*(["c", "a", "t"] if k == 0 else ["the"] + [g, "the"] * (k - 1) + [g + "ca", "t"]))
        for k in (i % 4 for i in range(250))
    ]
    assert read_lines(folder / "a.ids") == [ids("the", g + "ca", "t"), "", ids("the", g, "the")] + expected_extra
    assert read_lines(folder / "b.ids") == [ids("a"), ids("b"), ids("c")] + [ids("a")] * 250
    assert "INFO" not in proc.stderr, proc.stderr  # fairseq's import-time notices (tensorboardX) say nothing here


def test_gpt2_encode_drops_empty_without_keep_empty(tiny_gpt2, capsys):
    folder, enc = tiny_gpt2
    (folder / "a.txt").write_text("the\n\nthe cat\n")
    (folder / "b.txt").write_text("a\nb\n\n")
    main = load_script("gpt2_encode.py").main
    args = [
        "--encoder-json",
        str(folder / "encoder.json"),
        "--vocab-bpe",
        str(folder / "vocab.bpe"),
        "--inputs",
        str(folder / "a.txt"),
        str(folder / "b.txt"),
    ]
    assert main(args + ["--outputs", str(folder / "a.ids"), str(folder / "b.ids")]) == 0
    # Lines 2 and 3 each have an empty side: both examples are dropped from both outputs.
    assert read_lines(folder / "a.ids") == [str(enc["the"])] and read_lines(folder / "b.ids") == [str(enc["a"])]
    assert "dropped 2" in capsys.readouterr().err


@pytest.mark.parametrize("flag", ["--encoder-json", "--vocab-bpe"])
def test_gpt2_encode_unknown_bpe_file(tiny_gpt2, capsys, flag):
    folder, _ = tiny_gpt2
    (folder / "a.txt").write_text("the\n")
    paths = {"--encoder-json": str(folder / "encoder.json"), "--vocab-bpe": str(folder / "vocab.bpe")}
    paths[flag] = str(folder / "missing" / "bpe.file")
    argv = [x for kv in paths.items() for x in kv] + [
        "--inputs",
        str(folder / "a.txt"),
        "--outputs",
        str(folder / "a.ids"),
    ]
    assert load_script("gpt2_encode.py").main(argv) == 2
    assert f"{flag}: file not found: {folder / 'missing' / 'bpe.file'}" in capsys.readouterr().err
    assert not (folder / "a.ids").exists()


def test_gpt2_encode_refuses_urls_and_headerless_merges(tiny_gpt2, capsys):
    folder, _ = tiny_gpt2
    (folder / "a.txt").write_text("the\n")
    main = load_script("gpt2_encode.py").main
    url = "https://dl.fbaipublicfiles.com/fairseq/gpt2_bpe/encoder.json"
    assert (
        main(
            [
                "--encoder-json",
                url,
                "--vocab-bpe",
                str(folder / "vocab.bpe"),
                "--inputs",
                str(folder / "a.txt"),
                "--outputs",
                str(folder / "o"),
            ]
        )
        == 2
    )
    assert "--encoder-json" in capsys.readouterr().err
    (folder / "nohead.bpe").write_text("t h\nth e\n")
    assert (
        main(
            [
                "--encoder-json",
                str(folder / "encoder.json"),
                "--vocab-bpe",
                str(folder / "nohead.bpe"),
                "--inputs",
                str(folder / "a.txt"),
                "--outputs",
                str(folder / "o"),
            ]
        )
        == 2
    )
    err = capsys.readouterr().err
    assert "--vocab-bpe" in err and str(folder / "nohead.bpe") in err and "#version" in err
    assert not (folder / "o").exists()


def test_gpt2_encode_mismatched_inputs(tiny_gpt2, capsys):
    folder, _ = tiny_gpt2
    (folder / "a.txt").write_text("the\nthe\n")
    (folder / "b.txt").write_text("the\n")
    rc = load_script("gpt2_encode.py").main(
        [
            "--encoder-json",
            str(folder / "encoder.json"),
            "--vocab-bpe",
            str(folder / "vocab.bpe"),
            "--inputs",
            str(folder / "a.txt"),
            str(folder / "b.txt"),
            "--outputs",
            str(folder / "a.o"),
            str(folder / "b.o"),
        ]
    )
    err = capsys.readouterr().err
    assert rc == 2 and f"{folder / 'a.txt'} has 2" in err and f"{folder / 'b.txt'} has 1" in err
    assert not (folder / "a.o").exists() and not (folder / "b.o").exists()


# ----------------------------------------------------------------------------- generate_to_rouge

GENERATE_OUTPUT = """\
2026-11-22 12:00:00 | INFO | fairseq_cli.generate | loading model(s)
S-1\tthe src two
T-1\tthe cat ran
H-1\t-0.51\tthe c@@ at sat
D-1\t-0.51\tthe cat sat
P-1\t-0.1 -0.2 -0.3
S-0\tthe src one
T-0\ta b
H-0\t-0.20\ta b
D-0\t-0.20\ta b
P-0\t-0.1 -0.2
H-0\t-0.90\tx y
D-0\t-0.90\tx y
S-2\tsrc three
T-2\tan empty hypothesis
H-2\t-1.0\t
D-2\t-1.0\t
2026-11-22 12:00:01 | INFO | fairseq_cli.generate | Translated 3 sentences
"""


def test_generate_to_rouge_from_fairseq_output(tmp_path):
    (tmp_path / "gen.out").write_text(GENERATE_OUTPUT)
    proc = run_script(
        "generate_to_rouge.py", "--generate-output", tmp_path / "gen.out", "--output-dir", tmp_path / "eval"
    )
    # Sorted by id; D- lines (the best of the n-best) are used.
    assert read_lines(tmp_path / "eval" / "hyp.txt") == ["a b", "the cat sat", ""]
    assert read_lines(tmp_path / "eval" / "ref.txt") == ["a b", "the cat ran", "an empty hypothesis"]
    report = json.loads((tmp_path / "eval" / "rouge.json").read_text())
    assert json.loads(proc.stdout) == report
    # By hand: pair 0 is exact (100); pair 1 "the cat sat" vs "the cat ran": unigrams 2/3, bigrams
    # 1/2, LCS 2/3; pair 2 scores 0.
    assert report["n"] == 3
    assert report["rouge1"] == pytest.approx((100 + 200 / 3 + 0) / 3)
    assert report["rouge2"] == pytest.approx((100 + 50 + 0) / 3)
    assert report["rougeL"] == pytest.approx((100 + 200 / 3 + 0) / 3)
    assert report["rougeLsum"] == pytest.approx((100 + 200 / 3 + 0) / 3)


def test_generate_to_rouge_json_inside_its_output_dir_is_refused(tmp_path, capsys):
    """--json eval/hyp.txt wrote the report over the hypotheses, exit 0."""
    (tmp_path / "gen.out").write_text(GENERATE_OUTPUT)
    main = load_script("generate_to_rouge.py").main
    argv = ["--generate-output", str(tmp_path / "gen.out"), "--output-dir", str(tmp_path / "eval")]
    assert main(argv + ["--json", str(tmp_path / "eval" / "hyp.txt")]) == 2
    line = one_error_line(capsys.readouterr().err, "generate_to_rouge.py")
    assert f"--json {tmp_path / 'eval' / 'hyp.txt'}: given twice" in line and not (tmp_path / "eval").exists()


def test_generate_to_rouge_lead_baselines_and_table(tmp_path, capsys):
    """Lead-N rows use the same example ids as the model's, are scored against the same references,
    and a source file too short for an id is refused by name."""
    main = load_script("generate_to_rouge.py").main
    (tmp_path / "gen.out").write_text(GENERATE_OUTPUT)
    # id 0's source starts with its reference, id 1's with half of it, id 2's with nothing of it
    (tmp_path / "src").write_text("a b c d\nthe dog ran far\nzzz yyy xxx\n")
    argv = [
        "--generate-output",
        str(tmp_path / "gen.out"),
        "--output-dir",
        str(tmp_path / "eval"),
        "--source-file",
        str(tmp_path / "src"),
        "--lead-words",
        "2",
        "3",
    ]
    assert main(argv) == 0
    report = json.loads(capsys.readouterr().out)
    assert read_lines(tmp_path / "eval" / "lead2.txt") == ["a b", "the dog", "zzz yyy"]
    lead2 = json.loads((tmp_path / "eval" / "lead2.json").read_text())
    assert report["lead_baselines"]["lead-2 words"] == lead2
    # pair 0 exact; "the dog" vs "the cat ran": P 1/2, R 1/3 -> F1 40; pair 2 zero
    assert lead2["rouge1"] == pytest.approx((100 + 40 + 0) / 3)
    assert lead2["words_per_summary"] == 2 and report["reference_words_per_summary"] == pytest.approx(8 / 3)
    assert main(argv + ["--table", "--name", "tiny"]) == 0
    rows = capsys.readouterr().out.splitlines()
    assert [r.split()[0] for r in rows] == ["tiny", "lead-2", "lead-3", "reference"]
    (tmp_path / "short").write_text("a b\n")
    assert main(argv[:4] + ["--source-file", str(tmp_path / "short"), "--lead-words", "2"]) != 0
    assert "has 1 lines; example id 1" in capsys.readouterr().err
    assert main(argv[:4] + ["--lead-words", "2"]) != 0
    assert "--lead-words needs --source-file" in capsys.readouterr().err


def test_generate_output_parser_falls_back_to_h_and_uses_ref_file(tmp_path):
    from lsg_text.generate_output import hypotheses_and_references, parse_generate_output

    lines = ["H-3\t-1.5\tonly tokens", "T-3\tt three", "H-0\t-0.1\tzero", "D-0\t-0.1\tZero decoded", "T-0\tt zero"]
    examples = parse_generate_output(lines)
    ids, hyps, refs = hypotheses_and_references(examples)
    assert (ids, hyps, refs) == ([0, 3], ["Zero decoded", "only tokens"], ["t zero", "t three"])
    ids, hyps, refs = hypotheses_and_references(examples, references=["r0", "r1", "r2", "r3"])
    assert refs == ["r0", "r3"]


def test_generate_to_rouge_two_files_and_mismatch(tmp_path, capsys):
    main = load_script("generate_to_rouge.py").main
    (tmp_path / "h").write_text("the cat sat\n")
    (tmp_path / "r").write_text("the cat ran\n")
    assert main(["--hyp", str(tmp_path / "h"), "--ref", str(tmp_path / "r"), "--json", str(tmp_path / "r.json")]) == 0
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["n"] == 1 and report["rouge2"] == pytest.approx(50.0) and report["rouge1"] == pytest.approx(200 / 3)
    capsys.readouterr()
    (tmp_path / "r2").write_text("a\nb\n")
    assert (
        main(["--hyp", str(tmp_path / "h"), "--ref", str(tmp_path / "r2"), "--json", str(tmp_path / "bad.json")]) == 2
    )
    err = capsys.readouterr().err
    assert f"--hyp {tmp_path / 'h'} has 1 lines, --ref {tmp_path / 'r2'} has 2" in err
    assert not (tmp_path / "bad.json").exists()


# ----------------------------------------------------------------------------- every script


@pytest.mark.parametrize(
    "name",
    [
        "jsonl_to_parallel.py",
        "spm_train.py",
        "spm_encode.py",
        "gpt2_encode.py",
        "generate_to_rouge.py",
        "make_synthetic_data.py",
    ],
)
def test_every_script_has_help(name, capsys):
    with pytest.raises(SystemExit) as exit_info:
        load_script(name).main(["--help"])
    assert exit_info.value.code == 0 and "usage:" in capsys.readouterr().out


def test_generate_to_rouge_ref_file_reports_skipped_examples(tmp_path, capsys):
    # Example 1 was dropped by --skip-invalid-size-inputs-valid-test: no lines at all.
    (tmp_path / "gen.out").write_text("H-2\t-1\tc d\nD-2\t-1\tc d\nH-0\t-1\ta b\nD-0\t-1\ta b\n")
    (tmp_path / "test.target").write_text("a b\nnever generated\nc d\n")
    rc = load_script("generate_to_rouge.py").main(
        [
            "--generate-output",
            str(tmp_path / "gen.out"),
            "--ref-file",
            str(tmp_path / "test.target"),
            "--output-dir",
            str(tmp_path / "ev"),
        ]
    )
    assert rc == 0 and "only 2 of the 3 references" in capsys.readouterr().err
    assert read_lines(tmp_path / "ev" / "ref.txt") == ["a b", "c d"]
    report = json.loads((tmp_path / "ev" / "rouge.json").read_text())
    assert report["n"] == 2 and report["skipped"] == 1 and report["rouge1"] == pytest.approx(100.0)


def test_generate_to_rouge_rejects_non_generate_output(tmp_path, capsys):
    (tmp_path / "gen.out").write_text("just a log line\n")
    assert (
        load_script("generate_to_rouge.py").main(
            ["--generate-output", str(tmp_path / "gen.out"), "--output-dir", str(tmp_path / "ev")]
        )
        == 2
    )
    assert f"{tmp_path / 'gen.out'}: no H-/D- lines" in capsys.readouterr().err
    assert not (tmp_path / "ev").exists()


@pytest.mark.parametrize(
    "script, env, message",
    [
        ("benchmarks/gpu_call.sh", {}, "gpu_call.sh: error: nope: expected check, collect or more"),
        ("benchmarks/device_torch.sh", {}, "device_torch.sh: error: no arguments (TESTS names the tests), got 'nope'"),
        ("examples/long_context/run.sh", dict(DATA="x"), "run.sh: error: DATA=x: expected make, only or reuse"),
        ("examples/long_range/run.sh", dict(SPLIT="x"), "run.sh: error: SPLIT must be test or valid, got 'x'"),
        (
            "scripts/torch_versions.sh",
            {},
            "torch_versions.sh: error: VERSION 'nope': expected a torch release such as 2.6.0",
        ),
    ],
)
def test_shell_refusals_are_one_line(tmp_path, script, env, message):
    """The shell scripts refuse through scripts/lib.sh's die: one line naming the script, exit 2, before any work."""
    full = dict(os.environ, OUT=str(tmp_path / "out"), **env)
    r = subprocess.run(["bash", os.path.join(REPO_ROOT, script), "nope"], env=full, capture_output=True, text=True)
    assert (r.returncode, r.stderr) == (2, message + "\n")
    assert not os.path.exists(tmp_path / "out")


# ----------------------------------------------------------------------------- refusals up front
# Each mistake gets one line, `prog: error: <flag or file>: ...`, exit status 2, and nothing is
# written or replaced.

LATIN1 = "caf\xe9 au lait\n".encode("latin-1")  # byte 3 is not UTF-8


def one_error_line(err, prog):
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"{prog}: error: "), err
    return lines[0]


@pytest.mark.parametrize(
    "content, message",
    [
        (LATIN1, "--inputs: {path}: not UTF-8 text (byte offset 3, line 1"),
        (b"", "--inputs {path}: no text"),
        (b" \n\n", "--inputs {path}: no text"),
    ],
)
def test_spm_train_refuses_unusable_text_up_front(tmp_path, capsys, content, message):
    path = tmp_path / "in.txt"
    path.write_bytes(content)
    out = tmp_path / "spm"
    rc = load_script("spm_train.py").main(["--inputs", str(path), "--model-prefix", str(out / "spm")])
    assert rc == 2 and message.format(path=path) in one_error_line(capsys.readouterr().err, "spm_train.py")
    assert not out.exists()  # no empty output folder either


def test_spm_train_failure_leaves_no_output_folder(tmp_path, capsys):
    (tmp_path / "t.txt").write_text("a tiny corpus. it has few words.\n" * 20)
    out = tmp_path / "new" / "spm"
    argv = ["--inputs", str(tmp_path / "t.txt"), "--model-prefix", str(out / "m"), "--vocab-size", "5000"]
    assert load_script("spm_train.py").main(argv) == 2
    assert "--vocab-size" in capsys.readouterr().err and files_in(tmp_path) == ["t.txt"]


@pytest.mark.parametrize("prefix", ["spm/", "existing"])
def test_spm_train_model_prefix_is_a_prefix(tmp_path, capsys, monkeypatch, prefix):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "existing").mkdir()
    (tmp_path / "t.txt").write_text("some text.\n")
    rc = load_script("spm_train.py").main(["--inputs", "t.txt", "--model-prefix", prefix])
    line = one_error_line(capsys.readouterr().err, "spm_train.py")
    example = os.path.join(prefix.rstrip("/"), "spm")
    assert rc == 2 and f"--model-prefix {prefix}: names a folder (--model-prefix is a prefix, e.g. {example}" in line
    assert files_in(tmp_path) == ["existing", "t.txt"] and files_in(tmp_path / "existing") == []


@pytest.mark.parametrize("script", ["key_recall.py", "generate_to_rouge.py"])
def test_json_report_never_overwrites_an_input(tmp_path, capsys, script):
    """--json and --jsonl differ by one letter: the report must not replace what it was made from."""
    victim = tmp_path / "test.jsonl"
    victim.write_text('{"document": "d", "summary": "s", "keys": []}\n')
    (tmp_path / "gen.out").write_text("H-0\t-1\ts\nD-0\t-1\ts\n")
    if script == "key_recall.py":
        argv = ["--jsonl", str(victim), "--generate-output", str(tmp_path / "gen.out")]
    else:
        argv = ["--hyp", str(victim), "--ref", str(victim)]
    before = victim.read_bytes()
    assert load_script(script).main(argv + ["--json", str(victim)]) == 2
    line = one_error_line(capsys.readouterr().err, script)
    assert f"{victim}: the --json would overwrite the input {victim}" in line
    assert victim.read_bytes() == before and files_in(tmp_path) == ["gen.out", "test.jsonl"]


@pytest.fixture()
def wrong_kinds(tmp_path):
    """afile (a file where a folder is expected) and emptydir (a folder where a file is)."""
    (tmp_path / "afile").write_text("keep me\n")
    (tmp_path / "emptydir").mkdir()
    (tmp_path / "in.txt").write_text("a line\n")
    return tmp_path


@pytest.mark.parametrize(
    "script, argv, flag, target, what",
    [
        ("gsg_preprocess.py", ["--format", "file", "--input", "train=in.txt"], "--output-dir", "afile", "not a folder"),
        (
            "make_synthetic_data.py",
            ["--train", "2", "--valid", "1", "--test", "1"],
            "--output-dir",
            "afile",
            "not a folder",
        ),
        ("jsonl_to_parallel.py", ["--input-dir", "."], "--output-dir", "afile", "not a folder"),
        ("jsonl_to_parallel.py", ["--input-dir", "."], "--output-dir", "afile/raw", "afile is a file"),
        ("generate_to_rouge.py", ["--generate-output", "in.txt"], "--output-dir", "afile", "not a folder"),
        ("generate_to_rouge.py", ["--hyp", "in.txt", "--ref", "in.txt"], "--json", "emptydir", "is a folder"),
        ("spm_encode.py", ["--model", "m.model", "--inputs", "in.txt"], "--outputs", "emptydir", "is a folder"),
        (
            "gpt2_encode.py",
            ["--encoder-json", "e", "--vocab-bpe", "v", "--inputs", "in.txt"],
            "--outputs",
            "emptydir",
            "is a folder",
        ),
    ],
)
def test_output_path_of_the_wrong_kind_is_refused_first(
    wrong_kinds, capsys, monkeypatch, script, argv, flag, target, what
):
    monkeypatch.chdir(wrong_kinds)
    assert load_script(script).main(argv + [flag, target]) == 2
    line = one_error_line(capsys.readouterr().err, script)
    assert line.startswith(f"{script}: error: {flag} {target}: ") and what in line
    assert files_in(wrong_kinds) == ["afile", "emptydir", "in.txt"] and files_in(wrong_kinds / "emptydir") == []
    assert (wrong_kinds / "afile").read_text() == "keep me\n"


@pytest.mark.parametrize(
    "script, argv, message",
    [
        ("spm_binarize.sh", ["--raw-dir", "raw", "--out-dir", "afile", "--vocab-size", "300"], "--out-dir afile"),
        ("preprocess.sh", ["--trainpref", "p", "--destdir", "afile"], "--destdir afile"),
    ],
)
def test_shell_output_folder_of_the_wrong_kind(wrong_kinds, script, argv, message):
    for name in ("raw/train.source", "raw/train.target", "p.source", "p.target"):
        os.makedirs(os.path.dirname(wrong_kinds / name), exist_ok=True)
        (wrong_kinds / name).write_text("a\n")
    cmd = ["bash", os.path.join(SCRIPTS, script), *argv]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=wrong_kinds)
    assert proc.returncode == 2
    assert (
        one_error_line(proc.stderr, script)
        == f"{script}: error: {message}: exists and is not a folder (choose another output folder)"
    )
    assert (wrong_kinds / "afile").read_text() == "keep me\n"


@pytest.mark.parametrize(
    "script, argv",
    [("spm_encode.py", ["--model", "m.model"]), ("gpt2_encode.py", ["--encoder-json", "e", "--vocab-bpe", "v"])],
)
def test_encode_refuses_an_output_given_twice(tmp_path, capsys, monkeypatch, script, argv):
    monkeypatch.chdir(tmp_path)
    for name in ("a", "b"):
        (tmp_path / name).write_text("x\n")
    rc = load_script(script).main(argv + ["--inputs", "a", "b", "--outputs", "o", "./o"])
    assert rc == 2 and "--outputs ./o: given twice (as o)" in one_error_line(capsys.readouterr().err, script)
    assert files_in(tmp_path) == ["a", "b"]


def test_key_recall_spm_model_that_is_not_one(tmp_path, capsys):
    (tmp_path / "t.jsonl").write_text('{"document": "d", "summary": "s", "keys": []}\n')
    (tmp_path / "gen.out").write_text("H-0\t-1\ts\nD-0\t-1\ts\n")
    (tmp_path / "spm.vocab").write_text("<s>\t0\n<pad>\t0\n")
    argv = ["--jsonl", str(tmp_path / "t.jsonl"), "--generate-output", str(tmp_path / "gen.out")]
    rc = load_script("key_recall.py").main(argv + ["--spm-model", str(tmp_path / "spm.vocab")])
    line = one_error_line(capsys.readouterr().err, "key_recall.py")
    assert rc == 2 and f"--spm-model: {tmp_path / 'spm.vocab'} is not a sentencepiece model" in line


@pytest.mark.parametrize(
    "keys,says",
    [
        ("[{}]", "a key {} is not an object with a whole token_offset >= 0"),
        ('["red fox"]', 'a key "red fox" is not an object'),
        ('[{"token_offset": -1, "colour": "red", "animal": "fox", "city": "Paris", "weekday": "Monday"}]', "is not"),
    ],
)
def test_key_recall_names_a_key_of_the_wrong_shape(tmp_path, capsys, keys, says):
    """A key that was only checked to sit in a list: KeyError or TypeError tracebacks."""
    (tmp_path / "t.jsonl").write_text('{"document": "d", "summary": "s", "keys": %s}\n' % keys)
    (tmp_path / "gen.out").write_text("H-0\t-1\ts\n")
    argv = ["--jsonl", str(tmp_path / "t.jsonl"), "--generate-output", str(tmp_path / "gen.out")]
    rc = load_script("key_recall.py").main(argv)
    line = one_error_line(capsys.readouterr().err, "key_recall.py")
    assert rc == 2 and f"{tmp_path / 't.jsonl'}:1: " in line and says in line, line


def test_key_recall_without_keys_and_with_a_generate_output_not_utf8(tmp_path, capsys):
    """No keys at all: recall n/a (it was a TypeError printing None); a --generate-output that is not
    UTF-8: one line with the byte's offset (a UnicodeDecodeError traceback)."""
    (tmp_path / "t.jsonl").write_text('{"document": "d", "summary": "s", "keys": []}\n')
    (tmp_path / "gen.out").write_text("H-0\t-1\ts\n")
    argv = ["--jsonl", str(tmp_path / "t.jsonl"), "--generate-output", str(tmp_path / "gen.out")]
    assert load_script("key_recall.py").main(argv) == 0
    assert "key recall n/a over 0 keys" in capsys.readouterr().out
    (tmp_path / "gen.out").write_bytes(b"H-0\t-1\t\xff\xfe s\n")
    assert load_script("key_recall.py").main(argv) == 2
    line = one_error_line(capsys.readouterr().err, "key_recall.py")
    assert f"--generate-output: {tmp_path / 'gen.out'}: not UTF-8 text (byte offset 7, line 1" in line, line


def test_plot_out_extension_and_the_path_written(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    plot = load_script("plot_attention_pattern.py")
    flags = ["--length", "64", "--block-size", "16", "--sparse-block-size", "16", "--no-matrix", "--out"]
    with pytest.raises(SystemExit) as exit_info:
        plot.main(flags + ["doc.txt"])
    line = one_error_line(capsys.readouterr().err, "plot_attention_pattern.py")
    assert exit_info.value.code == 2 and "--out doc.txt: matplotlib cannot write .txt files (use one of " in line
    plot.main(flags + ["pattern"])  # no extension: matplotlib's .png, and the message says so
    assert capsys.readouterr().out.startswith("wrote pattern.png: ") and files_in(tmp_path) == ["pattern.png"]
    (tmp_path / "pdir.png").mkdir()  # the name written is a folder: refused up front (a traceback after drawing)
    with pytest.raises(SystemExit) as exit_info:
        plot.main(flags + ["pdir"])
    line = one_error_line(capsys.readouterr().err, "plot_attention_pattern.py")
    assert exit_info.value.code == 2 and "--out pdir.png: is a folder" in line, line
    with pytest.raises(SystemExit) as exit_info:  # a seed torch cannot take: named, not its overflow
        plot.main(flags + ["p2", "--seed", str(2**64)])
    assert exit_info.value.code == 2 and "--seed" in capsys.readouterr().err


@pytest.mark.parametrize(
    "script,flags",
    [
        ("spm_train.py", ["--vocab-size", str(2**31)]),
        ("spm_train.py", ["--threads", str(2**31)]),
        ("spm_train.py", ["--seed", str(2**32)]),
        ("spm_encode.py", ["--threads", str(2**31)]),
    ],
)
def test_sentencepiece_counts_beyond_a_c_int_are_refused_by_flag(tmp_path, capsys, script, flags):
    """sentencepiece's own errors for these named no flag, or were a TypeError traceback."""
    main = load_script(script).main
    (tmp_path / "t.txt").write_text("a tiny corpus.\n")
    if script == "spm_train.py":
        argv = ["--inputs", str(tmp_path / "t.txt"), "--model-prefix", str(tmp_path / "m")]
    else:
        argv = [
            "--model",
            str(tmp_path / "m.model"),
            "--inputs",
            str(tmp_path / "t.txt"),
            "--outputs",
            str(tmp_path / "o"),
        ]
    with pytest.raises(SystemExit) as exit_info:
        main(argv + flags)
    assert exit_info.value.code == 2 and f"argument {flags[0]}" in capsys.readouterr().err
    assert files_in(tmp_path) == ["t.txt"]


@pytest.mark.parametrize(
    "dict_text, source, message",
    [
        (
            "<s>\t0\n<pad>\t0\n",
            b"a\n",
            "--dict dict.txt: not a fairseq dict.txt (line 1 is '<s>\\t0', expected '<token> <count>';",
        ),
        ("a 5\nb 3\na 1\n", b"a\n", "--dict dict.txt: line 3 lists 'a' a second time"),
        ("a 5\n", LATIN1, "--trainpref: p.source: not UTF-8 text (byte offset 3, line 1"),
    ],
)
def test_preprocess_checks_dict_and_text_before_fairseq(tmp_path, dict_text, source, message):
    (tmp_path / "dict.txt").write_text(dict_text)
    (tmp_path / "p.source").write_bytes(source)
    (tmp_path / "p.target").write_text("a\n")
    cmd = ["bash", os.path.join(SCRIPTS, "preprocess.sh"), "--trainpref", "p", "--destdir", "bin", "--dict", "dict.txt"]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp_path)
    errors = [line for line in proc.stderr.splitlines() if "error" in line or "Traceback" in line]
    assert proc.returncode == 2 and len(errors) == 1 and message in errors[0], proc.stderr
    assert files_in(tmp_path) == ["dict.txt", "p.source", "p.target"]


# ----------------------------------------------------------------------------- never replaced unasked


def test_gsg_preprocess_refuses_a_corpus_folder_without_force(tmp_path, capsys):
    """A second run into the same --output-dir replaced dict.txt and the splits it was given but kept
    the others (encoded with the old dictionary): refused without --force; --force leaves no old split."""
    script = load_script("gsg_preprocess.py")
    (tmp_path / "a.txt").write_text("One cat sat. Two dogs ran. Red birds sang.\nThe sun rose. The moon set.\n")
    (tmp_path / "b.txt").write_text("Green trees grew tall. Blue rivers flowed fast. Old hills stood still.\n")
    out = tmp_path / "gsg"
    common = ["--format", "lines", "--output-dir", str(out)]
    assert (
        script.main(common + ["--input", f"train={tmp_path / 'a.txt'}", "--input", f"valid={tmp_path / 'a.txt'}"]) == 0
    )
    before = {name: (out / name).read_bytes() for name in files_in(out)}
    assert "dict.txt" in before and "valid.gsg.tokens.npy" in before
    capsys.readouterr()
    again = common + ["--input", f"train={tmp_path / 'b.txt'}"]
    assert script.main(again) == 2
    line = one_error_line(capsys.readouterr().err, "gsg_preprocess.py")
    assert f"--output-dir {out}: already holds a GSG corpus (dict.txt, train.gsg." in line and "--force" in line
    assert {name: (out / name).read_bytes() for name in files_in(out)} == before  # nothing touched
    assert script.main(again + ["--force"]) == 0
    assert files_in(out) == ["dict.txt"] + [f"train.gsg.{p}.npy" for p in ("documents", "sentences", "tokens", "words")]
    assert (out / "dict.txt").read_bytes() != before["dict.txt"]
    assert not [n for n in os.listdir(out) if n.startswith(".")]  # no staging folder left
    # The dictionary read from the folder itself (--dict OUT/dict.txt) is not "replaced": no --force needed.
    (tmp_path / "keep").mkdir()
    (tmp_path / "keep" / "dict.txt").write_bytes(before["dict.txt"])
    keep = ["--format", "lines", "--output-dir", str(tmp_path / "keep"), "--dict", str(tmp_path / "keep" / "dict.txt")]
    assert script.main(keep + ["--input", f"train={tmp_path / 'a.txt'}"]) == 0
    assert (tmp_path / "keep" / "dict.txt").read_bytes() == before["dict.txt"]


@pytest.mark.parametrize(
    "content, message",
    [
        ("a 5\ngarbage line\n", "not a fairseq dict.txt (line 2 is 'garbage line'"),
        ("", "lists no token (every piece would be <unk>)"),
    ],
    ids=["damaged", "empty"],
)
def test_gsg_preprocess_refuses_a_dict_it_cannot_use(tmp_path, capsys, content, message):
    """--dict with a line fairseq cannot parse (its ValueError traceback before), or with no token
    (a corpus of <unk> before, exit 0): one line naming the flag and the file; nothing written."""
    script = load_script("gsg_preprocess.py")
    (tmp_path / "a.txt").write_text("One cat sat. Two dogs ran. Red birds sang.\n")
    (tmp_path / "dict.txt").write_text(content)
    argv = ["--format", "lines", "--input", f"train={tmp_path / 'a.txt'}", "--output-dir", str(tmp_path / "gsg")]
    assert script.main(argv + ["--dict", str(tmp_path / "dict.txt")]) == 2
    line = one_error_line(capsys.readouterr().err, "gsg_preprocess.py")
    assert f"--dict {tmp_path / 'dict.txt'}: {message}" in line
    assert not (tmp_path / "gsg").exists()


@pytest.mark.parametrize(
    "split, content, message",
    [
        (
            "valid.target",
            b"a\nb\n",
            "--raw-dir: line counts differ: {raw}/valid.source has 3 lines, {raw}/valid.target has 2 lines",
        ),
        ("test.source", LATIN1 + b"b\nc\n", "--raw-dir: {raw}/test.source: not UTF-8 text (byte offset 3, line 1"),
    ],
)
def test_spm_binarize_checks_raw_text_before_writing(tmp_path, split, content, message):
    """Both were found only after sentencepiece training and encoding, leaving OUT/spm and
    OUT/spm-enc behind; the line-count case exited 1 naming OUT/spm-enc files."""
    raw = tmp_path / "raw"
    raw.mkdir()
    for name in ("train", "valid", "test"):
        for side in ("source", "target"):
            (raw / f"{name}.{side}").write_text("a b c.\nd e f.\ng h i.\n")
    (raw / split).write_bytes(content)
    proc = run_script(
        "spm_binarize.sh", "--raw-dir", raw, "--out-dir", tmp_path / "out", "--vocab-size", 300, check=False
    )
    assert proc.returncode == 2 and message.format(raw=raw) in one_error_line(proc.stderr, "spm_binarize.sh")
    assert files_in(tmp_path) == ["raw"]


def test_preprocess_warns_when_the_text_was_not_encoded_for_the_dict(tmp_path):
    """Raw words binarized with a dictionary of other symbols: fairseq succeeds, mostly <unk>, and
    says so only in preprocess.log; preprocess.sh says it on stderr, naming the file and the share
    (6 of 11 tokens, the eos counted)."""
    for side in ("source", "target"):
        (tmp_path / f"train.{side}").write_text("the cat sat on the mat\na dog ran\n")
    (tmp_path / "dict.txt").write_text("the 5\ncat 3\n")
    r = subprocess.run(
        ["bash", os.path.join(SCRIPTS, "preprocess.sh"), "--trainpref", str(tmp_path / "train")]
        + ["--destdir", str(tmp_path / "bin"), "--dict", str(tmp_path / "dict.txt")],
        capture_output=True,
        text=True,
        env=dict(os.environ, PATH=f"{os.path.dirname(sys.executable)}:{os.environ['PATH']}"),
    )
    assert r.returncode == 0, r.stderr[-2000:]
    warning = f"preprocess.sh: warning: {tmp_path / 'train.source'}: 54.5% of the tokens are not in --dict (<unk>)"
    assert warning in r.stderr


def test_preprocess_refuses_to_leave_splits_beside_another_dictionary(tmp_path):
    """A rerun with --trainpref only and no --dict builds a new dictionary: the valid binaries of
    the first run, kept, would then read as other words without an error."""

    def preprocess(*flags):
        return run_script("preprocess.sh", "--destdir", tmp_path / "bin", *flags, check=False)

    for prefix, text in (("a", "the cat sat on the mat\n"), ("b", "a dog ran far away today\n")):
        for side in ("source", "target"):
            (tmp_path / f"{prefix}.{side}").write_text(text)
    assert preprocess("--trainpref", tmp_path / "a", "--validpref", tmp_path / "a").returncode == 0
    before = {p.name: p.read_bytes() for p in (tmp_path / "bin").iterdir()}
    r = preprocess("--trainpref", tmp_path / "b")
    assert r.returncode == 2 and r.stderr.splitlines()[-1] == (  # after fairseq-preprocess's log
        f"preprocess.sh: error: --destdir {tmp_path / 'bin'}: its split(s) valid were binarized with another "
        "dictionary than this run's; rerun with their prefixes too (--validpref, --testpref) or use another "
        "--destdir (nothing written)"
    )
    assert {p.name: p.read_bytes() for p in (tmp_path / "bin").iterdir()} == before
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".bin.tmp")]
    # the same dictionary (--dict), or every split again: the kept binaries stay readable
    assert preprocess("--trainpref", tmp_path / "b", "--dict", tmp_path / "bin" / "dict.source.txt").returncode == 0
    assert preprocess("--trainpref", tmp_path / "b", "--validpref", tmp_path / "b").returncode == 0
    assert (tmp_path / "bin" / "dict.source.txt").read_bytes() != before["dict.source.txt"]


def test_model_folder_refuses_before_writing_anything(tmp_path):
    """scripts/model_folder.sh (make demo's last step): a missing input, or a MODEL_DIR that holds
    something, is one line and leaves MODEL_DIR as it was (the summarizing itself: the long-context
    claim test)."""
    spm = tmp_path / "spm"
    spm.mkdir()
    (spm / "dict.txt").write_text("a 1\n")
    (spm / "spm.model").write_bytes(b"x")
    (tmp_path / "ck.pt").write_bytes(b"x")
    (tmp_path / "docs.txt").write_text("a document\n")
    kept = tmp_path / "kept"
    kept.mkdir()
    (kept / "notes.txt").write_text("mine\n")
    cases = [
        ([tmp_path / "nope.pt", spm, tmp_path / "m", tmp_path / "docs.txt"], f"{tmp_path / 'nope.pt'}: no such file"),
        ([tmp_path / "ck.pt", tmp_path, tmp_path / "m", tmp_path / "docs.txt"], f"{tmp_path / 'dict.txt'}: no such"),
        ([tmp_path / "ck.pt", spm, kept, tmp_path / "docs.txt"], f"MODEL_DIR {kept}: exists and is not an empty"),
        (
            [tmp_path / "ck.pt", spm, tmp_path / "docs.txt", tmp_path / "docs.txt"],
            f"MODEL_DIR {tmp_path / 'docs.txt'}: exists",
        ),
        ([tmp_path / "ck.pt", spm], "usage: model_folder.sh CHECKPOINT SPM_DIR MODEL_DIR DOCS (got 2 arguments)"),
    ]
    for args, expected in cases:
        r = run_script("model_folder.sh", *args, check=False)
        assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
        assert r.stderr.startswith(f"model_folder.sh: error: {expected}"), r.stderr
    assert not (tmp_path / "m").exists() and os.listdir(kept) == ["notes.txt"]
    assert (tmp_path / "docs.txt").read_text() == "a document\n"
    assert (
        "usage: bash scripts/model_folder.sh CHECKPOINT SPM_DIR MODEL_DIR DOCS"
        in run_script("model_folder.sh", "--help").stdout
    )
