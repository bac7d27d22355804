"""scripts/device_flags.sh: DEVICE / PRECISION of the shell pipelines (make demo, the examples).

The flags for every combination, the refusals, and one bf16 training + generation through
examples/long_context/common.sh's ``train`` on CPU (the half-precision path a GPU run takes too).
"""

import os
import subprocess

import pytest
import torch

from conftest import BIN, REPO_ROOT

SHOW = 'source scripts/device_flags.sh; echo "$DEVICE|${TRAIN_DEVICE_FLAGS[*]}|${GENERATE_DEVICE_FLAGS[*]}"'


def flags(path_first=BIN, **env):
    full = dict(os.environ, PATH=f"{path_first}:{os.environ['PATH']}", **env)
    return subprocess.run(
        ["bash", "-euo", "pipefail", "-c", SHOW], cwd=REPO_ROOT, env=full, capture_output=True, text=True
    )


def fake_python(folder, answer: str) -> str:
    """A PATH folder whose ``python`` prints ``answer`` to device_flags.sh's GPU question ("yes" on a
    GPU machine, "torch <version>" without one), so both answers are checked on any machine."""
    fake = folder / "python"
    fake.write_text(f"#!/bin/sh\necho '{answer}'\n")
    fake.chmod(0o755)
    return str(folder)


@pytest.fixture
def seen_gpu(tmp_path):
    return fake_python(tmp_path, "yes")


def test_cuda_is_refused_where_torch_sees_no_gpu(tmp_path):
    proc = flags(path_first=fake_python(tmp_path, "torch 2.13.0+cpu"), DEVICE="cuda")
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.strip().endswith(
        "error: DEVICE=cuda: torch 2.13.0+cpu sees no CUDA GPU here; use DEVICE=cpu (or auto)"
    )


@pytest.mark.parametrize(
    "device,precision,expected",
    [
        ("cpu", "fp32", "cpu|--cpu|--cpu"),
        ("cpu", "bf16", "cpu|--cpu --bf16|--cpu --bf16"),
        ("cuda", "fp32", "cuda|--distributed-world-size 1|--distributed-world-size 1"),
        ("cuda", "bf16", "cuda|--distributed-world-size 1 --bf16|--distributed-world-size 1 --bf16"),
        ("cuda", "fp16", "cuda|--distributed-world-size 1 --fp16|--distributed-world-size 1 --fp16"),
    ],
)
def test_flags_for_each_device_and_precision(device, precision, expected, seen_gpu):
    proc = flags(path_first=seen_gpu if device == "cuda" else BIN, DEVICE=device, PRECISION=precision)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == expected


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU: DEVICE=cuda is valid here")
def test_cuda_without_a_gpu_is_refused_before_any_work(tmp_path):
    """DEVICE=cuda where torch sees no GPU: one line, exit 2, from the demo itself (nothing made)."""
    env = dict(
        os.environ,
        PATH=f"{BIN}:{os.environ['PATH']}",
        DEVICE="cuda",
        OUT=str(tmp_path / "demo"),
        VENV=os.path.dirname(BIN),
    )
    proc = subprocess.run(
        ["bash", "scripts/demo.sh"], cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.strip() == (
        f"demo.sh: error: DEVICE=cuda: torch {torch.__version__} sees no CUDA GPU here; use DEVICE=cpu (or auto)"
    )
    assert not (tmp_path / "demo").exists()


def test_auto_picks_the_gpu_when_torch_sees_one():
    proc = flags(DEVICE="auto")
    expected = "cuda" if torch.cuda.is_available() else "cpu"
    assert proc.returncode == 0 and proc.stdout.split("|")[0] == expected
    assert flags().stdout == proc.stdout  # auto and fp32 are the defaults


@pytest.mark.parametrize(
    "env,message",
    [
        ({"DEVICE": "cpu", "PRECISION": "fp16"}, "PRECISION=fp16 needs DEVICE=cuda (on CPU use PRECISION=bf16)"),
        ({"DEVICE": "tpu"}, "DEVICE=tpu: expected auto, cpu or cuda"),
        ({"PRECISION": "half"}, "PRECISION=half: expected fp32, bf16 or fp16"),
    ],
)
def test_bad_values_are_refused_in_one_line(env, message):
    proc = flags(**env)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.strip().endswith(f"error: {message}") and len(proc.stderr.strip().splitlines()) == 1


def test_bf16_training_and_generation_through_the_example_recipe(word_data, tmp_path):
    """common.sh's ``train`` with PRECISION=bf16 on CPU (2 updates), then fairseq-generate with the
    same flags: the checkpoint holds bf16 weights and the hypotheses come out."""
    script = f"""
        source examples/long_context/common.sh
        train bf16 {word_data} 2 --lr 1e-3 --arch lsg_bart_tiny --max-source-positions 256 --block-size 16 \\
            --sparse-block-size 16 --encoder-layers 1 --decoder-layers 1
        fairseq-generate {word_data} --user-dir "$USER_DIR" --task long_document_summarization \\
            --path "$OUT/runs/bf16/checkpoint_last.pt" --gen-subset valid --max-source-positions 256 \\
            --max-target-positions 128 --truncate-target --beam 1 --max-len-b 8 --batch-size 2 \\
            "${{GENERATE_DEVICE_FLAGS[@]}}" > "$OUT/generate.out" 2> "$OUT/generate.err"
    """
    env = dict(os.environ, OUT=str(tmp_path), VENV=os.path.dirname(BIN), DEVICE="cpu", PRECISION="bf16")
    proc = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", script], cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stderr[-3000:] + open(tmp_path / "runs/bf16/train.log").read()[-3000:]
    state = torch.load(tmp_path / "runs/bf16/checkpoint_last.pt", map_location="cpu", weights_only=False)
    assert state["cfg"]["common"]["bf16"] is True
    hyps = [line for line in open(tmp_path / "generate.out") if line.startswith("H-")]
    assert len(hyps) == 4  # every valid document
