"""lsg_text stays fairseq-free, the scripts use it without path games, and its atomic writes.

The import checks run in fresh interpreters: this test process has long imported fairseq and
torch, so only a new ``sys.modules`` can show what importing ``lsg_text`` pulls in.
"""

import json
import os
import pkgutil
import re
import shutil
import subprocess
import sys

import pytest

import lsg_text
from lsg_text.atomic import atomic_files, atomic_outputs

from conftest import FIXTURES, REPO_ROOT

SCRIPTS = os.path.join(REPO_ROOT, "scripts")
HEAVY = ("fairseq", "torch", "lsg_fairseq")
# Imports torch and the attention modules at the top: it exists to run them.
NEEDS_MODELS = {"plot_attention_pattern.py"}


def fresh_python(code: str, cwd: str) -> dict:
    """Run ``code`` in a new interpreter; it prints a JSON object as its last line."""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=cwd, timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_importing_every_lsg_text_module_imports_no_fairseq_or_torch(tmp_path):
    modules = sorted(f"lsg_text.{m.name}" for m in pkgutil.iter_modules(lsg_text.__path__))
    expected = {"lsg_text.fileio", "lsg_text.atomic", "lsg_text.errors", "lsg_text.argtypes", "lsg_text.gsg"}
    assert expected <= set(modules)
    loaded = fresh_python(
        "import importlib, json, sys\n"
        f"for name in ['lsg_text'] + {modules!r}:\n"
        "    importlib.import_module(name)\n"
        f"print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in {HEAVY!r})))",
        cwd=str(tmp_path),  # not the checkout: the installed package is what scripts get
    )
    assert loaded == []


def _script_files():
    """The files of scripts/ (not the ``__pycache__`` that running the suite leaves there)."""
    return sorted(name for name in os.listdir(SCRIPTS) if os.path.isfile(os.path.join(SCRIPTS, name)))


def _runnable_files():
    """scripts/, and the Python of benchmarks/ and examples/ (run as files too)."""
    paths = [os.path.join(SCRIPTS, name) for name in _script_files()]
    for top in ("benchmarks", "examples"):
        for folder, _, files in os.walk(os.path.join(REPO_ROOT, top)):
            paths += [os.path.join(folder, name) for name in sorted(files) if name.endswith(".py")]
    return paths


def test_no_script_plays_path_games():
    """No bootstrap module, no sys.path edits, no fake modules planted in sys.modules: scripts,
    benchmarks and examples import the installed packages."""
    path_edit = re.compile(r"sys\.path\s*(\.(insert|append|extend)\b|\[|=|\+=)|sys\.modules\s*\[[^]]*\]\s*=|_bootstrap")
    offenders = []
    for path in _runnable_files():
        with open(path, encoding="utf-8", errors="replace") as f:
            offenders += [f"{path}:{i}: {line.strip()}" for i, line in enumerate(f, 1) if path_edit.search(line)]
    assert "_bootstrap.py" not in _script_files()
    assert offenders == []


@pytest.mark.parametrize("name", [n for n in _script_files() if n.endswith(".py") and n not in NEEDS_MODELS])
def test_script_help_from_another_folder_without_fairseq(tmp_path, name):
    """Run as ``python /path/to/scripts/x.py --help`` from elsewhere: works, and loads no fairseq,
    torch or model registration (what made data preparation cost seconds per call)."""
    script = os.path.join(SCRIPTS, name)
    loaded = fresh_python(
        "import json, runpy, sys\n"
        f"sys.argv = [{script!r}, '--help']\n"
        "try:\n"
        f"    runpy.run_path({script!r}, run_name='__main__')\n"
        "except SystemExit as e:\n"
        "    assert e.code in (0, None), e.code\n"
        f"print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in {HEAVY!r})))",
        cwd=str(tmp_path),
    )
    assert loaded == []


def test_script_runs_from_another_folder(tmp_path):
    """A real run (not just --help) with relative paths resolved against the caller's folder."""
    r = subprocess.run(
        [
            sys.executable,
            os.path.join(SCRIPTS, "make_synthetic_data.py"),
            "--output-dir",
            "synth",
            "--train",
            "2",
            "--valid",
            "1",
            "--test",
            "1",
            "--min-tokens",
            "200",
            "--max-tokens",
            "300",
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert sorted(os.listdir(tmp_path / "synth")) == ["test.jsonl", "train.jsonl", "valid.jsonl"]
    with open(tmp_path / "synth" / "train.jsonl", encoding="utf-8") as f:
        assert len([json.loads(line) for line in f]) == 2


# ----------------------------------------------------------------------------- atomic writes
def _umask():
    m = os.umask(0)
    os.umask(m)
    return m


def test_atomic_files_commit_all_or_none(tmp_path):
    a, b = tmp_path / "a.bin", tmp_path / "sub" / "b.bin"
    a.write_bytes(b"old")
    with pytest.raises(RuntimeError):
        with atomic_files([str(a), str(b)]) as (fa, fb):
            fa.write(b"new a")
            fb.write(b"new b")
            raise RuntimeError("fails after both were written")
    assert a.read_bytes() == b"old" and not b.exists()
    assert sorted(os.listdir(tmp_path)) == ["a.bin", "sub"] and os.listdir(tmp_path / "sub") == []
    with atomic_files([str(a), str(b)]) as (fa, fb):
        fa.write(b"new a")
        fb.write(b"new b")
    assert a.read_bytes() == b"new a" and b.read_bytes() == b"new b"
    assert oct(b.stat().st_mode & 0o777) == oct(0o666 & ~_umask())  # not mkstemp's 0600
    assert sorted(os.listdir(tmp_path)) == ["a.bin", "sub"]


def test_atomic_outputs_are_fsynced_as_temps_then_the_folder(tmp_path, fsynced):
    synced = fsynced
    paths = [str(tmp_path / "train.source"), str(tmp_path / "train.target")]
    with atomic_outputs(paths) as outs:
        for out in outs:
            out.write("line\n")
    assert [s.split(".")[1:3] for s in synced[:2]] == [["train", "source"], ["train", "target"]]
    assert all(s.startswith(".") and s.endswith(".tmp") for s in synced[:2])
    assert synced[2:] == [tmp_path.name]  # one folder, synced once after both renames


def test_stale_temps_of_the_same_path_only_are_removed(tmp_path):
    """A SIGKILLed writer leaves ``.NAME.XXXXXXXX.tmp``; the next write of NAME removes it, but
    never the temp of another file whose name starts with NAME (``NAME.v2``, being written)."""
    stale = tmp_path / ".out.txt.abcd1234.tmp"
    other = tmp_path / ".out.txt.v2.abcd1234.tmp"
    stale_folder = tmp_path / ".out.txt.wxyz6789.tmp"
    for p in (stale, other):
        p.write_text("partial")
    stale_folder.mkdir()
    (stale_folder / "x").write_text("partial")
    with atomic_outputs([str(tmp_path / "out.txt")]) as (out,):
        out.write("done\n")
    assert sorted(os.listdir(tmp_path)) == [other.name, "out.txt"]


@pytest.mark.parametrize("script", ["spm_encode.py", "gpt2_encode.py"])
def test_encoders_refuse_unpaired_inputs_and_outputs(tmp_path, script):
    src = tmp_path / "a.txt"
    src.write_text("x\n")
    r = subprocess.run(
        [
            sys.executable,
            os.path.join(SCRIPTS, script),
            "--inputs",
            str(src),
            str(src),
            "--outputs",
            str(tmp_path / "a.out"),
        ]
        + (["--model", "m"] if script == "spm_encode.py" else ["--encoder-json", "e", "--vocab-bpe", "v"]),
        capture_output=True,
        text=True,
        cwd=str(tmp_path),
        timeout=120,
    )
    assert r.returncode == 2
    assert r.stderr.strip().endswith("--inputs has 2 paths but --outputs has 1; give one output per input")
    assert os.listdir(tmp_path) == ["a.txt"]  # nothing written


def test_gpt2_encode_refuses_to_write_over_its_own_bpe_files(tmp_path):
    """--outputs naming --vocab-bpe (or --encoder-json) replaced the BPE merges with the encoded ids,
    exit 0 (spm_encode.py already counted its --model among the inputs)."""
    shutil.copy(os.path.join(FIXTURES, "lsg", "bart_plain", "hf", "vocab.json"), tmp_path / "encoder.json")
    shutil.copy(os.path.join(FIXTURES, "lsg", "bart_plain", "hf", "merges.txt"), tmp_path / "vocab.bpe")
    (tmp_path / "in.txt").write_text("hello world\n")
    before = (tmp_path / "vocab.bpe").read_bytes()
    for target in ("vocab.bpe", "encoder.json"):
        r = subprocess.run(
            [sys.executable, os.path.join(SCRIPTS, "gpt2_encode.py"), "--encoder-json", "encoder.json"]
            + ["--vocab-bpe", "vocab.bpe", "--inputs", "in.txt", "--outputs", target],
            capture_output=True,
            text=True,
            cwd=str(tmp_path),
        )
        assert r.returncode == 2 and f"would overwrite the input {target}" in r.stderr, r.stderr
    assert (tmp_path / "vocab.bpe").read_bytes() == before
