"""Crash-safe training: SIGKILL fairseq-train mid-epoch, rerun the same command, check it resumed.

fairseq's resume semantics (checkpoint_utils.load_checkpoint): the same command finds
``--save-dir/checkpoint_last.pt`` and restores the weights, the optimizer (Adam moments and step),
the lr scheduler, the update count and the position inside the epoch (``iterations_in_epoch``),
so the updates after the checkpoint are recomputed exactly as the killed run computed them
(dropout off, fixed seed: fairseq reseeds each update with seed + num_updates).
"""

import json
import os
import signal
import subprocess
import sys
import time

import torch

import lsg_fairseq
from conftest import BIN, TINY_LSG_BART

SAVE_EVERY, KILL_AFTER, MAX_UPDATE = 3, 5, 6

# The first run is fairseq-train's own cli_main with the same argv, plus one hook: before the
# update after KILL_AFTER it announces itself and waits, so that the SIGKILL lands at a known
# point (mid-epoch, two updates after the last checkpoint) however fast or slow the machine is.
STALLING_TRAIN = r"""
import sys, time
import fairseq_cli.train as train_cli
from fairseq.trainer import Trainer

marker, kill_after = sys.argv[1], int(sys.argv[2])
original = Trainer.train_step

def train_step(self, *args, **kwargs):
    if self.get_num_updates() >= kill_after:
        sys.stdout.flush()
        open(marker, "w").close()
        time.sleep(600)
    return original(self, *args, **kwargs)

Trainer.train_step = train_step
sys.argv = ["fairseq-train"] + sys.argv[3:]
train_cli.cli_main()
"""


def train_cmd(data, save_dir):
    return [
        os.path.join(BIN, "fairseq-train"),
        str(data),
        "--user-dir",
        lsg_fairseq.user_dir(),
        "--task",
        "long_document_summarization",
        *TINY_LSG_BART,
        "--max-source-positions",
        "128",
        "--max-target-positions",
        "64",
        "--truncate-target",
        "--dropout",
        "0",
        "--attention-dropout",
        "0",
        "--criterion",
        "cross_entropy",
        "--optimizer",
        "adam",
        "--lr",
        "1e-3",
        "--batch-size",
        "1",
        "--max-update",
        str(MAX_UPDATE),
        "--save-interval-updates",
        str(SAVE_EVERY),
        "--validate-interval-updates",
        str(SAVE_EVERY),
        "--no-epoch-checkpoints",
        "--save-dir",
        str(save_dir),
        "--cpu",
        "--num-workers",
        "0",
        "--log-format",
        "json",
        "--log-interval",
        "1",
        "--seed",
        "1",
    ]


def env():
    e = {k: v for k, v in os.environ.items() if k != "TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD"}
    e["OMP_NUM_THREADS"] = "1"
    return e


def updates(log: str) -> dict:
    """num_updates -> the train_inner record fairseq logged for it."""
    out = {}
    for line in log.splitlines():
        if "| train_inner |" in line:
            rec = json.loads(line.split("| train_inner |", 1)[1])
            out[int(rec["num_updates"])] = rec
    return out


def load(path):
    return torch.load(path, map_location="cpu", weights_only=False)


def adam_step(state) -> int:
    steps = {int(s["step"]) for s in state["last_optimizer_state"]["state"].values()}
    assert len(steps) == 1, steps
    return steps.pop()


def test_sigkill_mid_epoch_then_same_command_resumes(word_data, tmp_path):
    save_dir = tmp_path / "ckpt"
    cmd = train_cmd(word_data, save_dir)
    log_path, marker, script = tmp_path / "killed.log", tmp_path / "stalled", tmp_path / "stalling_train.py"
    script.write_text(STALLING_TRAIN)
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            [sys.executable, str(script), str(marker), str(KILL_AFTER), *cmd[1:]],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env(),
            cwd=tmp_path,
        )
        deadline = time.time() + 240
        while not marker.exists():
            assert proc.poll() is None, log_path.read_text()[-3000:]
            assert time.time() < deadline, "training too slow to reach the kill point"
            time.sleep(0.1)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    killed_log = log_path.read_text()
    killed = updates(killed_log)
    assert max(killed) == KILL_AFTER and "done training" not in killed_log

    # What the kill left: the checkpoint of update 3, mid-epoch (12 examples, batch 1), complete.
    last = load(save_dir / "checkpoint_last.pt")
    assert last["optimizer_history"][-1]["num_updates"] == SAVE_EVERY
    assert last["extra_state"]["train_iterator"]["epoch"] == 1
    assert last["extra_state"]["train_iterator"]["iterations_in_epoch"] == SAVE_EVERY
    assert adam_step(last) == SAVE_EVERY
    assert os.path.exists(save_dir / "checkpoint_best.pt")

    # The same command again.
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env(), cwd=tmp_path, timeout=300)
    resumed_log = proc.stdout + proc.stderr
    assert proc.returncode == 0, resumed_log[-3000:]
    assert f"checkpoint_last.pt (epoch 1 @ {SAVE_EVERY} updates)" in resumed_log
    resumed = updates(resumed_log)
    assert min(resumed) == SAVE_EVERY + 1 and max(resumed) == MAX_UPDATE  # counting went on
    # Updates between the checkpoint and the kill are recomputed identically: same weights
    # (loss), same batch at the same epoch position ("update" = fraction of the epoch), same
    # optimizer state and lr (the second one's loss and gnorm depend on Adam's moments).
    for n in range(SAVE_EVERY + 1, KILL_AFTER + 1):
        for key in ("loss", "gnorm", "update", "lr", "wpb"):
            assert resumed[n][key] == killed[n][key], (n, key, resumed[n], killed[n])

    final = load(save_dir / "checkpoint_last.pt")
    assert final["optimizer_history"][-1]["num_updates"] == MAX_UPDATE
    assert adam_step(final) == MAX_UPDATE  # one optimizer state across the kill, not a reset one
    best = load(save_dir / "checkpoint_best.pt")
    assert best["optimizer_history"][-1]["num_updates"] in (SAVE_EVERY, MAX_UPDATE)
    assert best["extra_state"]["val_loss"] == best["extra_state"]["best"]  # it is the best one
    # and it is a usable model, loaded the way fairseq-generate loads it
    from fairseq import checkpoint_utils

    models, _, task = checkpoint_utils.load_model_ensemble_and_task([str(save_dir / "checkpoint_best.pt")])
    assert type(models[0]).__name__ == "LSGBARTModel" and task.cfg._name == "long_document_summarization"
    assert not [p for p in os.listdir(save_dir) if p.endswith(".tmp")]
