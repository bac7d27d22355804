"""led end to end: fairseq-train (led_tiny, per-layer windows, global ids, checkpoint activations)
then fairseq-generate from the saved checkpoint, through the command-line tools."""

import os
import subprocess

import torch

import lsg_fairseq
from conftest import BIN


def test_train_then_generate_cli(word_data, tmp_path):
    """fairseq-train (led_tiny, per-layer windows, checkpoint activations) then fairseq-generate."""
    save = tmp_path / "ckpt"
    env = dict(os.environ, OMP_NUM_THREADS="1")  # tiny model: threads only contend
    common = [
        "--user-dir",
        lsg_fairseq.user_dir(),
        "--task",
        "long_document_summarization",
        "--cpu",
        "--max-source-positions",
        "512",
        "--max-target-positions",
        "512",
    ]
    subprocess.run(
        [
            os.path.join(BIN, "fairseq-train"),
            str(word_data),
            *common,
            "--arch",
            "led_tiny",
            "--encoder-embed-dim",
            "16",
            "--encoder-ffn-embed-dim",
            "32",
            "--attention-window",
            "8,16",
            "--global-token-ids",
            "5",
            "--criterion",
            "cross_entropy",
            "--optimizer",
            "adam",
            "--lr",
            "0.001",
            "--max-tokens",
            "2048",
            "--max-update",
            "2",
            "--disable-validation",
            "--required-batch-size-multiple",
            "1",
            "--checkpoint-activations",
            "--save-dir",
            str(save),
            "--no-epoch-checkpoints",
            "--log-format",
            "simple",
            "--num-workers",
            "0",
        ],
        check=True,
        capture_output=True,
        text=True,
        env=env,
    )
    ckpt = torch.load(save / "checkpoint_last.pt", weights_only=True)
    assert ckpt["cfg"]["model"].attention_window == "8,16"
    assert "encoder.layers.1.self_attn.k_proj_global.weight" in ckpt["model"]
    res = subprocess.run(
        [
            os.path.join(BIN, "fairseq-generate"),
            str(word_data),
            *common,
            "--path",
            str(save / "checkpoint_last.pt"),
            "--gen-subset",
            "valid",
            "--beam",
            "2",
            "--max-len-b",
            "5",
            "--batch-size",
            "2",
            "--num-workers",
            "0",
        ],
        check=True,
        capture_output=True,
        text=True,
        env=env,
    )
    hyps = [line for line in res.stdout.splitlines() if line.startswith("H-")]
    assert len(hyps) == 4
