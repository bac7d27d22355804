"""lsg_fairseq.device_policy: parameter groups in every precision, GPU flags refused without a GPU,
and running out of device memory as one line.

fairseq's flat ``--fp16`` path calls ``torch.cuda.current_device()`` only to key its flat buffer;
with that call answered on CPU (``flat_on_cpu``) the path runs here, which shows the upstream
behaviour the policy exists for: one flat, untagged float32 tensor, so LOCOST's SSM group is gone.
"""

import argparse
import os
import subprocess
import sys

import pytest
import torch
from fairseq import tasks
from fairseq.trainer import Trainer

import lsg_fairseq
from conftest import BIN, TINY_LOCOST, fairseq_cli, training_config, write_toy_dict
from lsg_fairseq import device_policy
from lsg_fairseq.optim.grouped_adam import GroupedAdam

LOCOST_TINY = [*TINY_LOCOST, "--max-source-positions", "128", "--max-target-positions", "64"]


def train_argv(data, save_dir, *flags):
    """fairseq-train's arguments for 1-2 CPU updates of the tiny LOCOST on ``data``."""
    return [str(data), "--user-dir", lsg_fairseq.user_dir(), "--task", "long_document_summarization",
            *LOCOST_TINY, "--truncate-target", "--lr", "1e-3", "--max-tokens", "2000", "--cpu",
            "--save-dir", str(save_dir), *flags]  # fmt: skip


def training_cfg(data, *flags, optimizer="grouped_adam"):
    argv = [
        str(data),
        "--task",
        "long_document_summarization",
        "--user-dir",
        lsg_fairseq.user_dir(),
        *LOCOST_TINY,
        "--criterion",
        "cross_entropy",
        "--optimizer",
        optimizer,
        "--lr",
        "1e-3",
        "--ssm-lr",
        "1e-4",
        "--weight-decay",
        "0.01",
        "--cpu",
        *flags,
    ]
    return training_config(argv)


def groups_of(cfg):
    """{group name: (tensors, lr, weight decay)} of the optimizer fairseq's trainer builds for ``cfg``."""
    task = tasks.setup_task(cfg.task)
    torch.manual_seed(0)
    trainer = Trainer(cfg, task, task.build_model(cfg.model), task.build_criterion(cfg.criterion))
    return {
        g.get("group_name", "default"): (len(g["params"]), g["lr"], g["weight_decay"])
        for g in trainer.optimizer.optimizer.param_groups
    }


@pytest.fixture
def flat_on_cpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)


def test_flat_fp16_merges_the_groups_upstream(tmp_path, flat_on_cpu, monkeypatch):
    """What fairseq does with --fp16's default flat grads: grouped_adam, were it to accept flat
    parameters, gets one untagged tensor (weight decay and the main lr on the SSM parameters)."""
    monkeypatch.setattr(GroupedAdam, "supports_flat_params", property(lambda self: True))
    groups = groups_of(training_cfg(write_toy_dict(tmp_path), "--fp16"))
    assert groups == {"default": (1, 1e-3, 0.01)}


def test_grouped_adam_refuses_flat_parameters(tmp_path, flat_on_cpu):
    with pytest.raises(RuntimeError, match="does not support flat params, please set --fp16-no-flatten-grads"):
        groups_of(training_cfg(write_toy_dict(tmp_path), "--fp16"))


@pytest.fixture
def gpu_machine(monkeypatch):
    """vet_run as on a GPU machine (its CUDA refusals are tested below, on this one)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)


@pytest.mark.parametrize("flags", [["--fp16"], ["--memory-efficient-fp16"], ["--bf16"], ["--amp"]], ids=lambda f: f[0])
def test_ssm_group_survives_every_precision(tmp_path, flat_on_cpu, gpu_machine, flags):
    """After vet_run (what fairseq-train calls first), the SSM parameters keep their own lr and no
    weight decay; without it --fp16 would take the flat path (flat_on_cpu lets it run here)."""
    cfg = training_cfg(write_toy_dict(tmp_path), *flags)
    cfg.common.cpu = False
    device_policy.vet_run(cfg, "fairseq_cli.train")
    cfg.common.cpu = True  # the trainer itself runs on this CPU
    groups = groups_of(cfg)
    assert set(groups) == {"default", "ssm"}
    assert groups["ssm"][1:] == (pytest.approx(1e-4), 0.0) and groups["default"][1:] == (1e-3, 0.01)
    assert groups["ssm"][0] == 5  # log_dt, inv_A_real, A_imag, B, C of the one encoder layer


@pytest.mark.parametrize(
    "flags,optimizer,settled",
    [
        (["--fp16"], "grouped_adam", True),
        (["--fp16"], "adam", False),
        (["--memory-efficient-fp16"], "grouped_adam", False),
        (["--bf16"], "grouped_adam", False),
    ],
)
def test_vet_run_settles_non_flat_grads_for_grouped_adam_fp16_only(tmp_path, gpu_machine, flags, optimizer, settled):
    cfg = training_cfg(write_toy_dict(tmp_path), *flags, optimizer=optimizer)
    cfg.common.cpu = False
    device_policy.vet_run(cfg, "fairseq_cli.generate")  # not training: nothing to settle
    assert cfg.common.fp16_no_flatten_grads is False
    device_policy.vet_run(cfg, "fairseq_cli.train")
    assert cfg.common.fp16_no_flatten_grads is settled


@pytest.mark.parametrize(
    "flags,message",
    [
        (
            ["--fp16", "--optimizer", "adam"],
            "--fp16: fairseq's fp16 trainer keeps its float32 master weights in one "
            "flat CUDA tensor, and here --cpu is given; use --bf16 for half "
            "precision on a CPU (or add --fp16-no-flatten-grads)",
        ),
        (
            ["--amp", "--optimizer", "adam"],
            "--amp: fairseq's --amp is CUDA float16 autocast, and here (--cpu is "
            "given) it would train in float32 without a word; drop it, or use --bf16 "
            "for half precision on a CPU",
        ),
    ],
)
def test_gpu_precisions_are_refused_on_cpu_in_one_line(word_data, tmp_path, flags, message):
    """fairseq-train itself: one line, exit 2, before any work (no checkpoint folder)."""
    proc = subprocess.run(
        [fairseq_cli("fairseq-train"), *train_argv(word_data, tmp_path / "ck", "--max-update", "1", *flags)],
        capture_output=True,
        text=True,
        timeout=300,
        env=dict(os.environ, PATH=f"{BIN}:{os.environ['PATH']}"),
    )
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert proc.stderr.strip().splitlines()[-1] == f"fairseq-train: error: {message}"
    assert not (tmp_path / "ck").exists()


# ---------------------------------------------------------------- out of memory
def raise_oom(*args, **kwargs):
    raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 24.00 GiB")


def test_out_of_memory_in_a_step_is_explained():
    sample = {
        "net_input": {"src_tokens": torch.ones(3, 16384, dtype=torch.long)},
        "target": torch.ones(3, 200, dtype=torch.long),
    }
    with pytest.raises(device_policy.DeviceMemoryError) as e:
        with device_policy.explain_out_of_memory(sample, "training"):
            raise_oom()
    assert str(e.value) == (
        "device memory ran out in training on a batch of 3 documents of up to 16,384 source tokens (200 target "
        "tokens): lower --max-tokens (or --batch-size), pass --checkpoint-activations (activations recomputed in "
        "backward), or shorten the inputs with --max-source-positions (CUDA OOM. Tried to allocate 24.00 GiB)"
    )
    # fairseq's trainer skips a batch whose RuntimeError says "out of memory" and saves crash.pt for
    # anything but a RuntimeError: this one it re-raises as it is
    assert isinstance(e.value, RuntimeError) and "out of memory" not in str(e.value)
    with pytest.raises(KeyError):  # any other error is left alone
        with device_policy.explain_out_of_memory(sample, "training"):
            raise KeyError("not ours")


def test_an_enclosing_step_gives_its_own_flags_and_keeps_the_batch():
    """Validation's ROUGE generation runs inside fairseq-train's validation: the flags that shrink it
    are the -valid ones and --eval-rouge-args' beam, not fairseq-generate's; the batch and the
    allocator's words are the inner step's."""
    sample = {"net_input": {"src_tokens": torch.ones(2, 4096, dtype=torch.long)}}
    with pytest.raises(device_policy.DeviceMemoryError) as e:
        with device_policy.explain_out_of_memory(None, "validation", "lower --max-tokens-valid"):
            with device_policy.explain_out_of_memory(sample, "generation"):
                raise_oom()
    assert str(e.value) == (
        "device memory ran out in validation on a batch of 2 documents of up to 4,096 source tokens: lower "
        "--max-tokens-valid, or shorten the inputs with --max-source-positions (CUDA OOM. Tried to allocate 24.00 GiB)"
    )
    assert isinstance(e.value.__cause__, torch.OutOfMemoryError)


def test_each_stage_names_the_flags_of_its_commands():
    advice = device_policy.MEMORY_ADVICE
    assert "--checkpoint-activations" in advice["training"] and "--beam" in advice["generation"]
    assert "--max-tokens-valid" in advice["validation"] and "fairseq-validate: --max-tokens" in advice["validation"]


def run_in_process(main, argv, monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", argv)
    with pytest.raises(SystemExit) as e:
        main()
    return e.value.code, capsys.readouterr().err.strip().splitlines()


def test_fairseq_train_out_of_memory_is_one_line_and_writes_nothing(word_data, tmp_path, monkeypatch, capsys):
    from fairseq_cli import train

    from lsg_fairseq.models.locost import LOCOSTModel

    monkeypatch.setattr(LOCOSTModel, "forward", raise_oom)
    argv = ["fairseq-train", *train_argv(word_data, tmp_path / "ck", "--optimizer", "adam", "--max-update", "2")]
    code, err = run_in_process(train.cli_main, argv, monkeypatch, capsys)
    assert code == 2
    assert err[-1].startswith("fairseq-train: error: device memory ran out in training on a batch of ")
    assert "--checkpoint-activations" in err[-1] and "CUDA OOM. Tried to allocate" in err[-1]
    assert not (tmp_path / "ck").exists()  # fairseq-train's main had made it, empty


def test_generate_out_of_memory_is_one_line_and_leaves_no_partial_results(word_data, tmp_path, monkeypatch, capsys):
    """lsg-fairseq-generate --results-path: the run stops at its second batch with one line, and
    the half-written generate-valid.txt is removed."""
    from lsg_fairseq.cli import fairseq_wrappers
    from lsg_fairseq.models.locost import LOCOSTEncoder

    ck = tmp_path / "ck"
    subprocess.run(
        [fairseq_cli("fairseq-train"), *train_argv(word_data, ck, "--optimizer", "adam", "--max-update", "1")],
        check=True,
        capture_output=True,
        timeout=300,
    )
    real_encode = LOCOSTEncoder.forward
    calls = []

    def encoder_once(self, *args, **kwargs):  # the first batch generates, the second runs out of memory
        calls.append(1)
        if len(calls) > 1:
            raise_oom()
        return real_encode(self, *args, **kwargs)

    monkeypatch.setattr(LOCOSTEncoder, "forward", encoder_once)
    out = tmp_path / "results"
    code, err = run_in_process(
        lambda: fairseq_wrappers.generate(),
        [
            "lsg-fairseq-generate",
            str(word_data),
            "--path",
            str(ck / "checkpoint_last.pt"),
            "--gen-subset",
            "valid",
            "--max-source-positions",
            "128",
            "--max-target-positions",
            "64",
            "--truncate-target",
            "--beam",
            "1",
            "--max-len-b",
            "4",
            "--batch-size",
            "2",
            "--cpu",
            "--results-path",
            str(out),
        ],
        monkeypatch,
        capsys,
    )
    assert code == 2 and len(calls) == 2
    assert err[-1].startswith(
        "lsg-fairseq-generate: error: device memory ran out in generation on a batch of 2 documents"
    )
    assert "--beam" in err[-1]
    assert os.listdir(out) == []  # generate-valid.txt held the first batch: removed


# ---------------------------------------------------------------- divergence
def test_fairseq_train_divergence_is_one_line(word_data, tmp_path, monkeypatch, capsys):
    """fairseq's trainer raises FloatingPointError on NaN/Inf gradients, reruns the step under its
    NanDetector (which logs where the NaN appears) and ends in a traceback."""
    from fairseq.trainer import Trainer
    from fairseq_cli import train

    monkeypatch.setattr(Trainer, "clip_grad_norm", lambda self, clip_norm: torch.tensor(float("nan")))
    argv = ["fairseq-train", *train_argv(word_data, tmp_path / "ck", "--optimizer", "adam", "--max-update", "2")]
    code, err = run_in_process(train.cli_main, argv, monkeypatch, capsys)
    assert code == 2
    assert err[-1] == (
        "fairseq-train: error: training diverged (gradients are Nan/Inf): lower --lr, add warmup (--lr-scheduler "
        "inverse_sqrt --warmup-updates N), clip gradients (--clip-norm 1.0); the checkpoints saved before it in "
        "--save-dir are intact: resume with the new flags"
    )


def test_divergence_explained_for_training_only(word_data, tmp_path):
    cfg = training_cfg(word_data, "--clip-norm", "1.0")
    explained = device_policy.explain_divergence(cfg, "fairseq_cli.train", FloatingPointError("Minimum loss scale"))
    assert isinstance(explained, device_policy.TrainingDiverged) and "(Minimum loss scale)" in str(explained)
    assert "--clip-norm" not in str(explained) and "--bf16" not in str(explained)  # clipping is on, no fp16
    cfg.common.fp16 = True
    assert "train in --bf16" in str(device_policy.explain_divergence(cfg, "fairseq_cli.train", FloatingPointError()))
    assert device_policy.explain_divergence(cfg, "fairseq_cli.validate", FloatingPointError()) is None
    assert device_policy.explain_divergence(cfg, "fairseq_cli.train", KeyError("not ours")) is None


def test_cpu_on_a_machine_with_gpus_trains_in_one_process(word_data, tmp_path, monkeypatch, caplog):
    """fairseq-train's default --distributed-world-size counts the GPUs torch sees, also with --cpu:
    on a machine with two it spawned two CPU processes with fairseq's NCCL backend, and each failed
    ("Distributed package doesn't have NCCL built in", or no GPU for NCCL). Two GPUs counted here,
    the default's value given as fairseq would take it."""
    import logging

    from fairseq_cli import train

    for key in ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK", "SLURM_JOB_NODELIST"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setattr("torch.cuda.device_count", lambda: 2)
    flags = ["--optimizer", "adam", "--max-update", "1", "--distributed-world-size", "2"]
    monkeypatch.setattr(sys, "argv", ["fairseq-train", *train_argv(word_data, tmp_path / "ck", *flags)])
    with caplog.at_level(logging.INFO, logger="lsg_fairseq.device_policy"):
        train.cli_main()
    assert (tmp_path / "ck" / "checkpoint_last.pt").is_file()
    assert "--cpu: --distributed-world-size 2 (fairseq's default counts the GPUs torch sees)" in caplog.text


def test_training_across_slurm_nodes_without_a_port_is_one_line(word_data, tmp_path, monkeypatch, capsys):
    """fairseq reads the nodes from SLURM, then, with no --distributed-port, starts each node on its
    own and asserts "world size is 16 but have 8 available devices" in every task (the README's
    SLURM recipe gives the port; forgetting it was that traceback). One node needs none."""
    from fairseq_cli import train

    for key in ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK", "SLURM_STEP_NODELIST"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("SLURM_JOB_NODELIST", "gpu[01-02]")
    monkeypatch.setenv("SLURM_NNODES", "2")
    flags = ["--optimizer", "adam", "--max-update", "1", "--distributed-world-size", "16"]
    argv = ["fairseq-train", *train_argv(word_data, tmp_path / "ck", *flags)]
    code, err = run_in_process(train.cli_main, argv, monkeypatch, capsys)
    assert code == 2 and not (tmp_path / "ck").exists()
    assert err[-1] == (
        "fairseq-train: error: --distributed-port is required to train across the 2 SLURM nodes (any free port, "
        "the same in every task, e.g. --distributed-port 12345): without it fairseq starts each node on its own "
        "and fails (README, 'Distributed')"
    )
    from lsg_fairseq.device_policy import check_slurm_port

    given = argparse.Namespace(distributed_world_size=16, distributed_init_method=None, distributed_port=12345)
    check_slurm_port(given)  # the README's recipe
    monkeypatch.setenv("SLURM_NNODES", "1")
    check_slurm_port(argparse.Namespace(**{**vars(given), "distributed_port": -1}))  # one node: fairseq's own port


def test_more_processes_than_gpus_without_a_launcher_is_one_line(word_data, tmp_path, monkeypatch, capsys):
    """fairseq's own: "world size is 2 but have 0 available devices" (an AssertionError) once it
    tries to spawn one process per GPU."""
    from fairseq_cli import train

    for key in ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK", "SLURM_JOB_NODELIST"):
        monkeypatch.delenv(key, raising=False)
    flags = ["--optimizer", "adam", "--max-update", "1", "--distributed-world-size", "2"]
    argv = ["fairseq-train", *train_argv(word_data, tmp_path / "ck", *flags)]
    code, err = run_in_process(train.cli_main, argv, monkeypatch, capsys)
    assert code == 2 and not (tmp_path / "ck").exists()
    assert err[-1].startswith(
        "fairseq-train: error: --distributed-world-size 2: fairseq starts one process per GPU itself, and torch "
        "sees 0; launch the processes with torchrun (GPUs), or on CPUs start each one with --distributed-rank R"
    )
