"""Atomic, durable checkpoint writes, checkpoint errors that name the file, and the restore policies.

(``lsg_fairseq.checkpoint_io``, ``checkpoint_policy`` and the fixes ``fairseq_fixes.atomic_checkpoints``,
``checkpoint_errors``, ``restore_hooks``; each fix also run unpatched, through ``original``, to show
what it fixes.)

The kill tests are deterministic: a child process saves through fairseq's own functions with
``os.fsync`` replaced by "announce, then sleep", so the parent SIGKILLs it exactly between "all
bytes written" and "renamed into place". Stock fairseq's copy never fsyncs: there the child
announces itself half-way through the copy's ``os.sendfile`` (how ``shutil.copyfile`` copies on
Linux), the window in which stock fairseq's ``checkpoint_last.pt`` is half-written.
"""

import copy
import logging
import os
import re
import signal
import subprocess
import sys
import time

import pytest
import torch
from fairseq import checkpoint_utils, options, tasks
from fairseq.dataclass.utils import convert_namespace_to_omegaconf
from fairseq.file_io import PathManager

import lsg_fairseq  # noqa: F401  (installs the patches)
from lsg_fairseq.checkpoint_io import CheckpointError
from lsg_fairseq.fairseq_fixes._wrap import original
from lsg_text.errors import ConfigError

from conftest import FIXTURES, REPO_ROOT, TINY_DIMS, TINY_LOCOST

VOCAB = 40

KILL_CHILD = r"""
import os, sys, time
sys.path.insert(0, {repo!r})
import lsg_fairseq, torch
from fairseq import checkpoint_utils
from fairseq.file_io import PathManager
mode, src, dst, marker = sys.argv[1:5]
def hang(fd):
    open(marker, "w").close()
    time.sleep(600)
os.fsync = hang
if mode == "save":
    checkpoint_utils.torch_persistent_save({{"model": {{"w": torch.full((50000,), 2.0)}}}}, dst)
elif mode == "copy":
    PathManager.copy(src, dst, overwrite=True)
else:  # fairseq's own copy: half of the bytes, then the kill
    from lsg_fairseq.fairseq_fixes._wrap import original
    real_sendfile = os.sendfile
    def half_then_hang(out_fd, in_fd, offset, count):
        real_sendfile(out_fd, in_fd, offset, os.path.getsize(src) // 2)
        hang(out_fd)
    os.sendfile = half_then_hang
    original(PathManager, "copy")(src, dst, overwrite=True)
"""


def _kill_during_write(tmp_path, mode, src, dst):
    marker = tmp_path / "writing"
    script = tmp_path / "child.py"
    script.write_text(KILL_CHILD.format(repo=REPO_ROOT))
    proc = subprocess.Popen(
        [sys.executable, str(script), mode, str(src), str(dst), str(marker)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    deadline = time.time() + 120
    while not marker.exists():
        assert proc.poll() is None, proc.stderr.read().decode()[-2000:]
        assert time.time() < deadline, "child never reached fsync"
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL


def _old_checkpoint(path):
    torch.save({"model": {"w": torch.ones(3)}}, path)


@pytest.mark.parametrize("mode", ["save", "copy"])
def test_sigkill_during_write_keeps_previous_checkpoint(tmp_path, mode):
    """Kill while writing checkpoint_last.pt: the previous file stays complete and loadable."""
    last = tmp_path / "checkpoint_last.pt"
    _old_checkpoint(last)
    new = tmp_path / "checkpoint_1_6.pt"
    torch.save({"model": {"w": torch.full((50000,), 2.0)}}, new)
    _kill_during_write(tmp_path, mode, new, last)
    state = torch.load(last)
    assert torch.equal(state["model"]["w"], torch.ones(3))  # untouched, not half of the new one
    # the only trace is a hidden temp file, which the next successful write removes
    leftovers = [p.name for p in tmp_path.iterdir() if p.name.startswith(".checkpoint_last.pt.")]
    assert len(leftovers) == 1 and leftovers[0].endswith(".tmp")
    checkpoint_utils.torch_persistent_save({"model": {"w": torch.zeros(2)}}, str(last))
    assert torch.equal(torch.load(last)["model"]["w"], torch.zeros(2))
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".checkpoint_last.pt.")]


def test_stock_copy_killed_leaves_a_truncated_checkpoint_last(tmp_path):
    """What atomic_checkpoints fixes (fairseq#2684): fairseq's copy writes checkpoint_last.pt in place."""
    last = tmp_path / "checkpoint_last.pt"
    _old_checkpoint(last)
    new = tmp_path / "checkpoint_1_6.pt"
    torch.save({"model": {"w": torch.full((50000,), 2.0)}}, new)
    _kill_during_write(tmp_path, "stock-copy", new, last)
    assert 0 < last.stat().st_size < new.stat().st_size  # neither the old file nor the new one
    with pytest.raises(Exception, match="central directory|zip archive"):
        torch.load(last)


def test_stock_save_is_not_durable(tmp_path, monkeypatch):
    """fairseq's torch_persistent_save renames without fsync (a node crash can leave an empty file)."""
    synced = []
    monkeypatch.setattr(os, "fsync", synced.append)
    original(checkpoint_utils, "torch_persistent_save")({"model": {"w": torch.ones(3)}}, str(tmp_path / "a.pt"))
    assert synced == []
    checkpoint_utils.torch_persistent_save({"model": {"w": torch.ones(3)}}, str(tmp_path / "b.pt"))
    assert len(synced) == 2  # the file, then its folder


def test_copy_is_complete_and_keeps_mode(tmp_path):
    src, dst = tmp_path / "a.pt", tmp_path / "b.pt"
    torch.save({"model": {"w": torch.arange(10.0)}}, src)
    assert PathManager.copy(str(src), str(dst), overwrite=True)
    assert dst.read_bytes() == src.read_bytes()
    assert oct(dst.stat().st_mode & 0o777) == oct(0o666 & ~_umask())


def _umask():
    m = os.umask(0)
    os.umask(m)
    return m


def test_failed_save_leaves_old_file_and_no_temp(tmp_path):
    last = tmp_path / "checkpoint_last.pt"
    _old_checkpoint(last)

    class Unpicklable:
        def __reduce__(self):
            raise RuntimeError("boom half-way")

    with pytest.raises(RuntimeError, match="boom half-way"):
        checkpoint_utils.torch_persistent_save({"model": {"w": torch.ones(1000)}, "x": Unpicklable()}, str(last))
    assert torch.equal(torch.load(last)["model"]["w"], torch.ones(3))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint_last.pt"]


# ----------------------------------------------------------------------------- load errors
@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("ckpt_io_data")
    with open(d / "dict.txt", "w") as f:
        for i in range(4, VOCAB - 1):
            f.write(f"{i} 1\n")
    return str(d)


LSG_TINY = [
    "--arch",
    "lsg_bart_tiny",
    "--encoder-embed-dim",
    "16",
    "--encoder-ffn-embed-dim",
    "32",
    "--encoder-layers",
    "1",
    "--decoder-layers",
    "1",
    "--block-size",
    "8",
    "--sparse-block-size",
    "8",
    "--max-target-positions",
    "32",
]
LOCOST_TINY = [*TINY_LOCOST, "--max-target-positions", "32"]


def build_trainer(data_dir, save_dir, *flags):
    from fairseq.trainer import Trainer

    argv = [
        data_dir,
        "--task",
        "long_document_summarization",
        "--user-dir",
        lsg_fairseq.user_dir(),
        "--criterion",
        "cross_entropy",
        "--optimizer",
        "adam",
        "--lr",
        "1e-3",
        "--cpu",
        "--save-dir",
        str(save_dir),
        *flags,
    ]
    args = options.parse_args_and_arch(options.get_training_parser(), argv)
    cfg = convert_namespace_to_omegaconf(args)
    task = tasks.setup_task(cfg.task)
    model = task.build_model(cfg.model)
    return cfg, Trainer(cfg, task, model, task.build_criterion(cfg.criterion))


def save(data_dir, tmp_path, name, *flags):
    cfg, trainer = build_trainer(data_dir, tmp_path, *flags)
    path = str(tmp_path / name)
    trainer.consolidate_optimizer()  # what checkpoint_utils.save_checkpoint does first
    trainer.save_checkpoint(path, {"train_iterator": {"epoch": 1}})
    return path


@pytest.fixture(scope="module")
def saved(data_dir, tmp_path_factory):
    d = tmp_path_factory.mktemp("saved")
    return {
        "lsg64": save(data_dir, d, "lsg64.pt", *LSG_TINY, "--max-source-positions", "64"),
        "locost": save(data_dir, d, "locost.pt", *LOCOST_TINY, "--max-source-positions", "64"),
    }


@pytest.mark.parametrize("damage", ["truncated", "empty", "garbage", "zip_head"])
def test_corrupt_checkpoint_named_on_load(saved, tmp_path, damage):
    data = open(saved["lsg64"], "rb").read()
    bad = tmp_path / "bad.pt"
    damaged = {"truncated": data[: len(data) // 2], "empty": b"", "garbage": b"\x80junk" * 50, "zip_head": b"PK"}
    bad.write_bytes(damaged[damage])
    with pytest.raises(CheckpointError, match=r"bad\.pt: truncated or corrupt checkpoint"):
        checkpoint_utils.load_checkpoint_to_cpu(str(bad))


@pytest.mark.parametrize(
    "content",
    [b"\n\x0c\n\x03<s>\x15\x00\x00\x00\x00 a sentencepiece model", b"the 796\n, 512\n"],
    ids=["spm_model", "dict_txt"],
)
def test_a_file_of_another_kind_is_not_called_damaged(tmp_path, content):
    """A tokenizer model or a dictionary given as the checkpoint: no restart from an earlier
    checkpoint mends it, so the error says what the file is not, and how it begins."""
    other = tmp_path / "other.pt"
    other.write_bytes(content)
    with pytest.raises(CheckpointError) as e:
        checkpoint_utils.load_checkpoint_to_cpu(str(other))
    assert str(e.value).startswith(f"{other}: not a checkpoint (not a torch.save file; it begins {content[:12]!r});")
    assert "truncated" not in str(e.value) and "weights_only" not in str(e.value)


def test_stock_load_error_names_no_file(saved, tmp_path):
    """What checkpoint_errors fixes (fairseq#2684): torch's error for a truncated file, no name."""
    data = open(saved["lsg64"], "rb").read()
    bad = tmp_path / "bad.pt"
    bad.write_bytes(data[: len(data) // 2])
    with pytest.raises(Exception) as e:
        original(checkpoint_utils, "load_checkpoint_to_cpu")(str(bad))
    assert not isinstance(e.value, CheckpointError)
    assert "bad.pt" not in str(e.value) + " ".join(getattr(e.value, "__notes__", []))


def test_corrupt_checkpoint_named_on_restore(data_dir, saved, tmp_path):
    data = open(saved["lsg64"], "rb").read()
    bad = tmp_path / "bad.pt"
    bad.write_bytes(data[: len(data) - 100])  # a copy cut short by a kill
    cfg, trainer = build_trainer(
        data_dir, tmp_path / "run", *LSG_TINY, "--max-source-positions", "64", "--restore-file", str(bad)
    )
    with pytest.raises(CheckpointError, match=r"bad\.pt: truncated or corrupt checkpoint"):
        checkpoint_utils.load_checkpoint(cfg.checkpoint, trainer)


def test_other_load_errors_get_the_file_name(tmp_path):
    from fractions import Fraction

    path = tmp_path / "weird.pt"
    # a complete archive whose content weights_only loading refuses (a global not allowlisted)
    torch.save({"model": {}, "x": Fraction(1, 3)}, path)
    with pytest.raises(Exception) as e:
        checkpoint_utils.load_checkpoint_to_cpu(str(path))
    assert not isinstance(e.value, CheckpointError)  # not called corrupt: it is a complete file
    assert "Fraction" in str(e.value)
    assert any(str(path) in note for note in getattr(e.value, "__notes__", []))


def test_missing_restore_file_refused_not_trained_from_scratch(data_dir, tmp_path):
    cfg, trainer = build_trainer(
        data_dir,
        tmp_path / "run",
        *LSG_TINY,
        "--max-source-positions",
        "64",
        "--restore-file",
        str(tmp_path / "typo.pt"),
    )
    with pytest.raises(FileNotFoundError, match=r"--restore-file .*typo\.pt: no such file.*from scratch"):
        checkpoint_utils.load_checkpoint(cfg.checkpoint, trainer)


def test_missing_continue_once_refused_not_trained_from_scratch(data_dir, tmp_path, saved):
    """--continue-once (a first launch resumes from it) was never checked: a typo trained from
    scratch, exit 0, and a checkpoint of other attention settings loaded, where --restore-file is
    refused for both."""
    flags = [*LSG_TINY, "--max-source-positions", "64"]
    cfg, trainer = build_trainer(data_dir, tmp_path / "run", *flags, "--continue-once", str(tmp_path / "typo.pt"))
    with pytest.raises(FileNotFoundError, match=r"^--continue-once .*typo\.pt: no such file; fairseq would silently"):
        checkpoint_utils.load_checkpoint(cfg.checkpoint, trainer)
    from lsg_fairseq.checkpoint_policy import restore_path

    cfg, trainer = build_trainer(data_dir, tmp_path / "run2", *flags, "--continue-once", saved["lsg64"])
    assert restore_path(cfg.checkpoint, trainer) == saved["lsg64"]  # what the settings check reads


def test_a_first_launch_does_not_write_over_another_runs_checkpoints(data_dir, tmp_path, saved):
    """A rerun of a training saved with --no-last-checkpoints (no checkpoint_last.pt to resume from)
    started from scratch and wrote over checkpoint_best.pt and checkpointN.pt without a word. Refused,
    naming the newest; a --restore-file the user names, --no-save, and a resume from
    checkpoint_last.pt go on."""
    import shutil

    run = tmp_path / "run"
    run.mkdir()
    for name in ("checkpoint1.pt", "checkpoint_best.pt", "checkpoint2.pt"):  # saved in this order
        shutil.copy(saved["lsg64"], run / name)
        os.utime(run / name, (time.time(), time.time() + len(os.listdir(run))))
    flags = [*LSG_TINY, "--max-source-positions", "64"]
    cfg, trainer = build_trainer(data_dir, run, *flags)
    with pytest.raises(ConfigError) as e:
        checkpoint_utils.load_checkpoint(cfg.checkpoint, trainer)
    assert str(e.value) == (
        f"--save-dir {run} holds another run's checkpoints (checkpoint2.pt, checkpoint_best.pt, checkpoint1.pt) "
        "and no checkpoint_last.pt to resume from (--no-last-checkpoints writes none): this run would start from "
        f"scratch and write over them. Resume with --restore-file {run / 'checkpoint2.pt'}, or give an empty --save-dir"
    )
    cfg, trainer = build_trainer(data_dir, run, *flags, "--finetune-from-model", saved["lsg64"])
    with pytest.raises(ConfigError, match=f"would start from {re.escape(saved['lsg64'])} and write over them"):
        checkpoint_utils.load_checkpoint(cfg.checkpoint, trainer)
    from lsg_fairseq.checkpoint_policy import check_restore

    for more in (["--restore-file", str(run / "checkpoint2.pt")], ["--no-save"]):
        cfg, trainer = build_trainer(data_dir, run, *flags, *more)
        check_restore(cfg.checkpoint, trainer)  # what load_checkpoint's hook calls first (this folder has no data)
    shutil.copy(saved["lsg64"], run / "checkpoint_last.pt")
    cfg, trainer = build_trainer(data_dir, run, *flags)
    check_restore(cfg.checkpoint, trainer)  # a resume


def test_a_stop_min_lr_the_schedule_starts_below_is_refused_on_a_first_launch(data_dir, tmp_path, saved):
    """fairseq-train compares --stop-min-lr with the learning rate before every epoch, the first
    included: inverse_sqrt warms up from 0 by default, so --stop-min-lr 1e-9 stopped it before its
    first update, exit 0 (fairseq#2523). Refused where the schedule starts anew; a resume reads the
    checkpoint's own rate, and a --warmup-init-lr above the floor starts above it."""
    import shutil

    flags = [*LSG_TINY, "--max-source-positions", "64", "--stop-min-lr", "1e-9"]
    warmup = ["--lr-scheduler", "inverse_sqrt", "--warmup-updates", "10"]
    cfg, trainer = build_trainer(data_dir, tmp_path / "a", *flags, *warmup)
    with pytest.raises(ConfigError) as e:
        checkpoint_utils.load_checkpoint(cfg.checkpoint, trainer)
    assert str(e.value) == (
        "--stop-min-lr 1e-09: this run's learning rate starts at 0 (--lr-scheduler inverse_sqrt), so fairseq-train "
        "would stop before its first update, exit 0; give a lower --stop-min-lr (fairseq's default -1 never "
        "stops), or a --warmup-init-lr above it"
    )
    cfg, trainer = build_trainer(
        data_dir, tmp_path / "b", *LSG_TINY, "--max-source-positions", "64", "--stop-min-lr", "1e-2"
    )
    with pytest.raises(ConfigError, match=r"^--stop-min-lr 0.01: this run's learning rate starts at 0.001 \(--lr-sch"):
        checkpoint_utils.load_checkpoint(cfg.checkpoint, trainer)  # fixed: --lr 1e-3 from the start
    cfg, trainer = build_trainer(data_dir, tmp_path / "c", *flags, *warmup, "--warmup-init-lr", "1e-7")
    trainer.task.check_restore(cfg.checkpoint, trainer)  # what load_checkpoint's hook calls first
    (tmp_path / "d").mkdir()
    shutil.copy(saved["lsg64"], tmp_path / "d" / "checkpoint_last.pt")
    cfg, trainer = build_trainer(data_dir, tmp_path / "d", *flags, *warmup)
    trainer.task.check_restore(cfg.checkpoint, trainer)  # a resume: the checkpoint's rate


def test_missing_restore_file_trains_from_scratch_without_the_hooks(word_data, tmp_path):
    """fairseq's own load_checkpoint (no task hooks) takes a typo for "start fresh"."""
    cfg, trainer = build_trainer(
        str(word_data),
        tmp_path / "run",
        *LSG_TINY,
        "--max-source-positions",
        "64",
        "--truncate-target",
        "--restore-file",
        str(tmp_path / "typo.pt"),
    )
    extra_state, epoch_itr = original(checkpoint_utils, "load_checkpoint")(cfg.checkpoint, trainer)
    assert extra_state is None and epoch_itr.epoch == 1 and trainer.get_num_updates() == 0


STOCK_TRANSFORMER = [
    "--task",
    "translation",
    "--source-lang",
    "source",
    "--target-lang",
    "target",
    "--arch",
    "transformer",
    *TINY_DIMS,
    "--max-source-positions",
    "8192",
    "--max-target-positions",
    "1024",
]  # SumPubMed documents


def test_stock_task_keeps_fairseq_restore_behaviour(word_data, tmp_path):
    """The refusal is this plugin's policy: a translation run in the same process starts fresh."""
    cfg, trainer = build_trainer(
        str(word_data), tmp_path / "run", *STOCK_TRANSFORMER, "--restore-file", str(tmp_path / "x.pt")
    )
    assert type(trainer.task).__name__ == "TranslationTask"
    extra_state, epoch_itr = checkpoint_utils.load_checkpoint(cfg.checkpoint, trainer)  # the hooked one
    assert extra_state is None and epoch_itr.epoch == 1


def test_other_arch_checkpoint_on_restore_named(data_dir, saved, tmp_path):
    other = saved["locost"]
    cfg, trainer = build_trainer(
        data_dir, tmp_path / "run", *LSG_TINY, "--max-source-positions", "64", "--restore-file", other
    )
    with pytest.raises(CheckpointError) as e:
        checkpoint_utils.load_checkpoint(cfg.checkpoint, trainer)
    msg = str(e.value)
    assert "locost.pt: the checkpoint does not fit the model this run builds (--arch lsg_bart_tiny)" in msg
    assert "It was saved by --arch locost_tiny: pass that --arch" in msg
    assert "Missing key(s)" in msg  # fairseq's own detail is kept


@pytest.mark.parametrize(
    "flags,expected",
    [
        (  # fairseq's AssertionError "Criterion does not match"
            ["--criterion", "label_smoothed_cross_entropy"],
            "lsg64.pt was trained with the criterion CrossEntropyCriterion (--criterion cross_entropy), this run's is "
            "LabelSmoothedCrossEntropyCriterion: resume with that criterion, or pass --reset-optimizer",
        ),
        (  # its AssertionError "Optimizer does not match"
            ["--optimizer", "grouped_adam"],
            "lsg64.pt was trained with the optimizer FairseqAdam (--optimizer adam), this run's is GroupedAdam: resume "
            "with that optimizer, or pass --reset-optimizer",
        ),
        (  # the scheduler's KeyError: 'best'
            ["--lr-scheduler", "inverse_sqrt"],
            "lsg64.pt was trained with another learning-rate schedule than --lr-scheduler inverse_sqrt (its saved "
            "state lacks best): resume with its --lr-scheduler, or pass --reset-lr-scheduler",
        ),
    ],
)
def test_another_criterion_optimizer_or_schedule_on_resume_named(data_dir, saved, tmp_path, flags, expected):
    restore = ["--max-source-positions", "64", "--restore-file", saved["lsg64"]]
    cfg, trainer = build_trainer(data_dir, tmp_path / "run", *LSG_TINY, *restore, *flags)
    with pytest.raises(CheckpointError) as e:
        checkpoint_utils.load_checkpoint(cfg.checkpoint, trainer)
    assert expected in str(e.value)
    reset = {"reset_lr_scheduler": True} if "--lr-scheduler" in flags else {"reset_optimizer": True}
    trainer.load_checkpoint(saved["lsg64"], **reset)  # what the message advises loads


def test_max_source_positions_above_position_table_named(data_dir, saved, tmp_path):
    short = saved["lsg64"]
    cfg, trainer = build_trainer(
        data_dir, tmp_path / "run", *LSG_TINY, "--max-source-positions", "256", "--restore-file", short
    )
    with pytest.raises(CheckpointError) as e:
        checkpoint_utils.load_checkpoint(cfg.checkpoint, trainer)
    msg = str(e.value)
    assert "position table holds 64 positions but --max-source-positions 256 needs 258 rows" in msg
    assert "lsg-fairseq-convert" in msg and "It was saved by" not in msg  # same arch: not blamed


@pytest.mark.parametrize(
    "model_cfg,expected",
    [
        ({"arch": "lsg_bart_tiny", "_name": "lsg_bart"}, "lsg_bart_tiny (model lsg_bart)"),  # fairseq-train
        ({"_name": "lsg_bart_base"}, "lsg_bart_base"),  # fairseq-hydra-train: the arch as _name alone
        ({}, "unknown"),
    ],
)
def test_the_restore_message_reads_the_arch_of_either_trainer(model_cfg, expected):
    """A hydra checkpoint was "saved by --arch None (model lsg_bart_base)"."""
    from lsg_fairseq.checkpoint_policy import _arch_of

    assert _arch_of({"cfg": {"model": model_cfg}}) == expected


def test_matching_checkpoint_still_restores(data_dir, saved, tmp_path):
    """The checks must not refuse what fairseq accepts: same arch and size restores fine."""
    good = saved["lsg64"]
    cfg, trainer = build_trainer(
        data_dir,
        tmp_path / "run",
        *LSG_TINY,
        "--max-source-positions",
        "64",
        "--restore-file",
        good,
        "--reset-dataloader",
    )
    torch.nn.init.zeros_(trainer.model.encoder.global_embeddings.weight)
    trainer.load_checkpoint(good)
    saved = torch.load(good, weights_only=False)["model"]["encoder.global_embeddings.weight"]
    assert torch.equal(trainer.model.encoder.global_embeddings.weight, saved) and saved.abs().sum() > 0


def test_fairseq_save_checkpoint_writes_every_file_atomically(word_data, tmp_path, fsynced):
    """fairseq's own save_checkpoint (first file, then copies to best/last) goes through the patches."""
    save_dir = tmp_path / "ckpt"
    cfg, trainer = build_trainer(
        str(word_data),
        save_dir,
        *LSG_TINY,
        "--max-source-positions",
        "64",
        "--truncate-target",
        "--save-interval-updates",
        "1",
    )
    epoch_itr = trainer.get_train_iterator(epoch=1)
    epoch_itr.next_epoch_itr(shuffle=False)  # as fairseq-train does before its first save
    synced = fsynced  # from here on
    synced.clear()
    checkpoint_utils.save_checkpoint(cfg.checkpoint, trainer, epoch_itr, val_loss=1.0)
    written = sorted(p.name for p in save_dir.iterdir())
    assert written == ["checkpoint_1_0.pt", "checkpoint_best.pt", "checkpoint_last.pt"]
    for name in written:  # each was fsynced as a hidden temp file, then renamed
        assert any(s.startswith(f".{name}.") and s.endswith(".tmp") for s in synced), (name, synced)
    assert synced.count(save_dir.name) == 3  # and the folder after each rename
    a, b = (save_dir / "checkpoint_1_0.pt").read_bytes(), (save_dir / "checkpoint_last.pt").read_bytes()
    assert a == b


def test_safetensors_file_named_as_hf_weights():
    """An HF model.safetensors given as a fairseq checkpoint: said to be HF weights to convert, not
    "truncated or corrupt" (it is not a zip archive either)."""
    path = os.path.join(FIXTURES, "lsg", "bart_plain", "hf", "model.safetensors")
    with pytest.raises(
        CheckpointError, match=r"model\.safetensors: HF weights \(safetensors\), not a fairseq checkpoint"
    ):
        checkpoint_utils.load_checkpoint_to_cpu(path)


def test_store_ema_from_a_checkpoint_without_one_starts_from_its_weights(data_dir, saved, tmp_path, monkeypatch):
    """fairseq deletes state["model"] once loaded, then re-reads it to start an EMA the checkpoint
    lacks: KeyError 'model' (a converted model fine-tuned with --store-ema). With the fix the EMA
    starts from the checkpoint's weights, in fp32 too with --ema-fp32."""
    from lsg_fairseq.fairseq_fixes._wrap import original

    # another seed: the model (and the EMA copied from it) starts from other weights than the checkpoint's
    flags = (*LSG_TINY, "--max-source-positions", "64", "--store-ema", "--ema-fp32", "--seed", "7")
    cfg, trainer = build_trainer(data_dir, tmp_path / "stock", *flags)
    with monkeypatch.context() as stock:
        stock.setattr(checkpoint_utils, "load_checkpoint_to_cpu", original(checkpoint_utils, "load_checkpoint_to_cpu"))
        with pytest.raises(KeyError, match="model"):
            trainer.load_checkpoint(saved["lsg64"])
    cfg, trainer = build_trainer(data_dir, tmp_path / "fixed", *flags)
    weights = torch.load(saved["lsg64"], map_location="cpu", weights_only=False)["model"]
    assert not torch.equal(
        trainer.ema.get_model().state_dict()["encoder.embed_tokens.weight"], weights["encoder.embed_tokens.weight"]
    )
    trainer.load_checkpoint(saved["lsg64"])
    ema = trainer.ema.get_model().state_dict()
    assert all(torch.equal(ema[k], weights[k]) for k in weights), "the EMA is not the checkpoint's weights"
    assert all(torch.equal(trainer.ema.fp32_params[k], weights[k].float()) for k in trainer.ema.fp32_params)
    assert "ema" not in torch.load(saved["lsg64"], map_location="cpu", weights_only=False)["extra_state"]


@pytest.mark.parametrize("arch", ["lsg_bart_tiny", "led_tiny"])
def test_an_ema_of_pre_ln_layers_keeps_their_final_layer_norms(data_dir, tmp_path, monkeypatch, caplog, arch):
    """fairseq's EMA step leaves the "version" buffers out of what it loads into its model, whose
    upgrade then reads the pre-LN encoder and decoder as version 1 and drops their final LayerNorms.
    With the fix an EMA copied from the model (decay 0) computes what the model computes, and its
    state dict (what a checkpoint saves as ``extra_state["ema"]``) is the model's. An EMA saved with
    the bug is not restored: the EMA keeps the model's weights, with a warning."""
    from fairseq.models.ema.ema import EMA

    from lsg_fairseq.fairseq_fixes._wrap import original

    flags = LSG_TINY if arch == "lsg_bart_tiny" else ["--arch", "led_tiny", "--attention-window", "8"]
    flags = [*flags, "--max-source-positions", "64", "--store-ema", "--dropout", "0"]
    _, trainer = build_trainer(data_dir, tmp_path, *flags, "--encoder-normalize-before", "--decoder-normalize-before")
    model = trainer.model.eval()
    tokens = torch.randint(4, VOCAB - 1, (2, 24))
    lengths = torch.full((2,), 24)
    prev = torch.randint(4, VOCAB - 1, (2, 5))

    def ema_after_a_step():
        ema = EMA(model, trainer.cfg.ema)
        ema._set_decay(0.0)  # the EMA becomes a copy of the model
        ema._step_internal(model)
        return ema.get_model().eval()

    with monkeypatch.context() as stock:
        stock.setattr(EMA, "restore", original(EMA, "restore"))
        broken = ema_after_a_step()
    assert broken.encoder.layer_norm is None and broken.decoder.layer_norm is None  # the bug, shown
    fixed = ema_after_a_step()
    assert fixed.state_dict().keys() == model.state_dict().keys()
    assert all(torch.equal(fixed.state_dict()[k], v) for k, v in model.state_dict().items())
    # an EMA saved with the bug (version 1, no final LayerNorms), restored on a resume: not loaded
    ema = EMA(model, trainer.cfg.ema)
    with caplog.at_level(logging.WARNING, logger="lsg_fairseq.fairseq_fixes.ema_keeps_versions"):
        ema.restore(broken.state_dict())
    assert ema.get_model().encoder.layer_norm is not None and "saved without its final LayerNorms" in caplog.text
    assert all(torch.equal(ema.get_model().state_dict()[k], v) for k, v in model.state_dict().items())
    frozen = copy.deepcopy(model).requires_grad_(False)  # as the EMA's: frozen weights may take another path
    with torch.no_grad():
        expected = frozen(tokens, lengths, prev)[0]
        assert torch.equal(fixed(tokens, lengths, prev)[0], expected)
        assert not torch.allclose(broken(tokens, lengths, prev)[0], expected)
