"""A step of the example scripts that fails is named, with the end of the log its messages went to.

Their training and decoding write to log files; under `set -e` a failed step used to end the script
with exit 1 and no word (a CUDA out-of-memory, a mistyped MODEL_FLAGS), and long_range/run.sh's
parallel runs ignored a failure in the last batch until a `cp` of a missing file. scripts/lib.sh's
``failed`` is the one message (spm_binarize.sh's too); these tests run the steps against tools that
fail. long_range/run.sh's parallel runs failing: tests/test_long_range.py::test_long_range_experiment_smoke,
on its data."""

import os
import stat
import subprocess
import sys

from conftest import REPO_ROOT

ERROR = "RuntimeError: CUDA out of memory (from the test)"


def failing_tools(folder):
    """A VENV whose fairseq-train and fairseq-generate print a traceback's end and exit 1."""
    bin_dir = folder / "bin"
    bin_dir.mkdir(parents=True)
    for tool in ("fairseq-train", "fairseq-generate"):
        path = bin_dir / tool
        path.write_text(f'#!/bin/sh\necho "Traceback (most recent call last):" >&2\necho "{ERROR}" >&2\nexit 1\n')
        path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return folder


def test_a_failed_training_or_decoding_names_its_log(tmp_path):
    venv = failing_tools(tmp_path / "venv")
    out = tmp_path / "out"
    env = dict(os.environ, VENV=str(venv), OUT=str(out), DEVICE="cpu")
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env["PATH"]  # python, after the fake tools
    for step, what, log in [
        ("train x data 2 --lr 1e-3", "training x", out / "runs" / "x" / "train.log"),
        ("greedy_generate bin c.pt test 4096 s.model $OUT/g.out", "generating with c.pt", out / "g.err"),
        ("evaluate row c.pt 4096", "generating with c.pt", out / "eval" / "row" / "generate.err"),
    ]:
        r = subprocess.run(
            ["bash", "-c", f"set -euo pipefail; source examples/long_context/common.sh; prog=t; {step}; echo went on"],
            cwd=REPO_ROOT,
            env=env,
            capture_output=True,
            text=True,
        )
        assert (r.returncode, r.stdout) == (2, ""), (step, r.stdout, r.stderr)
        lines = r.stderr.splitlines()
        assert lines[0] == f"t: error: {what} failed; the end of {log}:", (step, r.stderr)
        assert lines[-1] == f"  | {ERROR}", (step, r.stderr)


def test_the_message_leaves_out_gnu_times_report(tmp_path):
    """run_small.sh times its decoding with /usr/bin/time -v, whose report follows the error."""
    log = tmp_path / "generate.err"
    log.write_text(f"{ERROR}\nCommand exited with non-zero status 1\n\tCommand being timed: x\n\tElapsed: 0:01\n")
    r = subprocess.run(
        ["bash", "-c", f"source scripts/lib.sh; prog=t; failed decoding {log}"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
    )
    assert r.returncode == 2
    assert r.stderr.splitlines() == [
        f"t: error: decoding failed; the end of {log}:",
        f"  | {ERROR}",
        "  | Command exited with non-zero status 1",
    ]


def test_spm_binarize_names_a_failed_binarization(tmp_path):
    """spm_binarize.sh's third step writes to OUT/preprocess.log; its failure is the same one message
    (it was the log's last 5 lines, with no name, and exit 1)."""
    raw = tmp_path / "raw"
    raw.mkdir()
    for split in ("train", "valid", "test"):
        for side in ("source", "target"):
            lines = [f"the {side} line {i} of {split} says a few words" for i in range(30)]
            (raw / f"{split}.{side}").write_text("\n".join(lines) + "\n")
    tools = tmp_path / "tools"
    tools.mkdir()
    fake = tools / "fairseq-preprocess"
    fake.write_text(f'#!/bin/sh\necho "{ERROR}" >&2\nexit 1\n')
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    env = {k: v for k, v in os.environ.items() if k != "PYTHON"}
    env["PATH"] = f"{tools}{os.pathsep}{os.path.dirname(sys.executable)}{os.pathsep}{env['PATH']}"
    out = tmp_path / "out"
    args = ["--raw-dir", str(raw), "--out-dir", str(out), "--vocab-size", "40", "--", "--soft-vocab-limit"]
    r = subprocess.run(
        ["bash", "scripts/spm_binarize.sh", *args], cwd=REPO_ROOT, env=env, capture_output=True, text=True
    )
    assert r.returncode == 2, r.stderr
    log = out / "preprocess.log"
    assert f"spm_binarize.sh: error: preprocess.sh failed; the end of {log}:" in r.stderr
    tail = r.stderr.split(f"the end of {log}:\n")[1].splitlines()
    assert f"  | {ERROR}" in tail and tail[-1].startswith("  | preprocess.sh: error: fairseq-preprocess failed"), tail


def test_retrieval_64k_names_its_failed_step(tmp_path):
    """examples/locost/retrieval_64k.sh writes every step's messages to one steps.log; a failed step is
    lib.sh's one message with the step's name (it was an ERR trap naming a line number, exit 1), and
    no table is written. A VENV whose python fails makes its first step fail."""
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    python = venv / "bin" / "python"
    python.write_text(f'#!/bin/sh\necho "{ERROR}" >&2\nexit 1\n')
    python.chmod(python.stat().st_mode | stat.S_IXUSR)
    out = tmp_path / "lc"
    (out / "runs" / "locost").mkdir(parents=True)
    (out / "runs" / "locost" / "checkpoint_last.pt").write_bytes(b"")
    table = tmp_path / "retrieval.md"
    env = dict(os.environ, VENV=str(venv), OUT=str(out), DEVICE="cpu", REPORT=str(table))
    r = subprocess.run(
        ["bash", "examples/locost/retrieval_64k.sh"], cwd=REPO_ROOT, env=env, capture_output=True, text=True
    )
    log = out / "locost_64k" / "steps.log"
    assert r.returncode == 2, r.stderr
    assert r.stderr.splitlines() == [
        f"retrieval_64k.sh: error: making the documents failed; the end of {log}:",
        f"  | {ERROR}",
    ]
    assert not table.exists()
