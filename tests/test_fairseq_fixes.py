"""lsg_fairseq.fairseq_fixes: the only place that patches fairseq/torch, installed once.

Each fix's own tests run the original function (kept by the patch) to show the upstream bug, then
the installed one: weights-only loading, one-line errors, the NaN detector, the workers' temp folder
and numpy 2's batch buckets here, atomic checkpoints, load errors and restore hooks in
test_checkpoint_io.py, bf16 (training off TPUs, inference) in test_bf16.py.
"""

import argparse
import math
import ast
import inspect
import os
import shutil
import subprocess
import sys
import tempfile

import pytest
import numpy as np
import torch
from fairseq import checkpoint_utils, options
from fairseq.data import LanguagePairDataset, bucket_pad_length_dataset, data_utils
from fairseq.dataclass import initialize
from fairseq.dataclass import utils as dataclass_utils
from fairseq.dataclass.utils import convert_namespace_to_omegaconf
from fairseq.distributed import utils as distributed_utils
from fairseq.file_io import PathManager
from fairseq.models.ema.ema import EMA
from fairseq.models.transformer.transformer_config import TransformerConfig
from fairseq.nan_detector import NanDetector
from fairseq.trainer import Trainer

import lsg_fairseq
from lsg_fairseq import fairseq_fixes
from lsg_text.errors import ConfigError
from lsg_fairseq.fairseq_fixes._wrap import original

PATCHED = [
    (checkpoint_utils, "torch_persistent_save"),
    (checkpoint_utils, "load_checkpoint_to_cpu"),
    (checkpoint_utils, "load_checkpoint"),
    (PathManager, "copy"),
    (options, "parse_args_and_arch"),
    (distributed_utils, "call_main"),
    (NanDetector, "add_hooks"),
    (TransformerConfig, "from_namespace"),
    (initialize, "add_defaults"),
    (data_utils, "get_buckets"),
    (bucket_pad_length_dataset, "get_buckets"),
    (LanguagePairDataset, "__init__"),
    (Trainer, "load_checkpoint"),
    (dataclass_utils, "_override_attr"),
    (EMA, "restore"),
]


def train_cfg(data, *flags):
    """fairseq-train's structured config of a stock transformer on ``data`` with ``flags``, as
    ``call_main`` receives it."""
    argv = [str(data), "--arch", "transformer", "--cpu", *flags]
    return convert_namespace_to_omegaconf(options.parse_args_and_arch(options.get_training_parser(), argv))


# fairseq's EpochBatchIterator with one data-loader worker (--num-workers 1, fairseq's default): main
# takes one batch and returns with the workers running, as fairseq-train's main does at its last update.
WORKER_RUN = """
import sys
import torch
from fairseq import options
from fairseq.data.iterators import EpochBatchIterator
from fairseq.dataclass.utils import convert_namespace_to_omegaconf
from fairseq.distributed import utils as distributed_utils
import lsg_fairseq
from lsg_fairseq.fairseq_fixes._wrap import original

running = []
def main(cfg):
    data = torch.utils.data.TensorDataset(torch.arange(8))
    batches = EpochBatchIterator(data, torch.utils.data.default_collate, [[0, 1], [2, 3]], num_workers=1)
    running.append(batches.next_epoch_itr(shuffle=False))
    assert next(running[-1])[0].tolist() == [0, 1]

argv = [sys.argv[2], "--arch", "transformer", "--cpu"]
cfg = convert_namespace_to_omegaconf(options.parse_args_and_arch(options.get_training_parser(), argv))
(original(distributed_utils, "call_main") if sys.argv[1] == "stock" else distributed_utils.call_main)(cfg, main)
"""


def test_polynomial_decay_without_total_num_update_decays_over_the_run(monkeypatch):
    """fairseq#4064: --lr-scheduler polynomial_decay without --total-num-update was hydra's
    ConfigCompositionException ("total_num_update=null") before any work; its dataclass's default
    is --max-update, which the fixed conversion keeps. A value given still wins."""
    from hydra.errors import ConfigCompositionException

    flags = ["--optimizer", "adam", "--lr-scheduler", "polynomial_decay", "--max-update", "7"]
    with monkeypatch.context() as stock:
        stock.setattr(dataclass_utils, "_override_attr", original(dataclass_utils, "_override_attr"))
        with pytest.raises(ConfigCompositionException, match="total_num_update=null"):
            train_cfg("data-bin", *flags)
    assert train_cfg("data-bin", *flags).lr_scheduler.total_num_update == 7
    assert train_cfg("data-bin", *flags, "--total-num-update", "3").lr_scheduler.total_num_update == 3
    # a field that may be None keeps the None given: translation's dataset_impl (II("dataset.dataset_impl"))
    assert train_cfg("data-bin", *flags).task.dataset_impl is None


def test_install_is_idempotent_and_keeps_the_originals():
    installed = [getattr(owner, name) for owner, name in PATCHED]
    assert all(original(owner, name) is not fn for (owner, name), fn in zip(PATCHED, installed))
    fairseq_fixes.install()
    assert [getattr(owner, name) for owner, name in PATCHED] == installed  # not wrapped twice
    assert original(PathManager, "copy").__name__ == "copy"  # a staticmethod stays one, name kept
    assert isinstance(inspect.getattr_static(TransformerConfig, "from_namespace"), classmethod)  # so a classmethod
    assert original(TransformerConfig, "from_namespace").__self__ is TransformerConfig


UPSTREAM = ("fairseq", "fairseq_cli", "torch")


def _upstream_names(tree):
    """Names a file binds to fairseq/torch modules or objects (``import torch.nn as nn``, ``from
    fairseq import checkpoint_utils``, ``from fairseq.models import BARTModel``, ...)."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names if a.name.split(".")[0] in UPSTREAM}
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] in UPSTREAM:
            names |= {a.asname or a.name for a in node.names}
    return names


def test_nothing_outside_fairseq_fixes_patches_fairseq_or_torch():
    """No assignment to (or setattr on) a fairseq/torch module or class anywhere else in the package."""
    package = os.path.dirname(lsg_fairseq.__file__)
    offenders = []
    for folder, _, files in os.walk(package):
        if os.path.basename(folder) == "fairseq_fixes":
            continue
        for name in files:
            if not name.endswith(".py"):
                continue
            path = os.path.join(folder, name)
            tree = ast.parse(open(path, encoding="utf-8").read())
            imported = _upstream_names(tree)
            for node in ast.walk(tree):
                targets = node.targets if isinstance(node, ast.Assign) else []
                hit = [
                    t
                    for t in targets
                    if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id in imported
                ]
                if (
                    isinstance(node, ast.Call)
                    and getattr(node.func, "id", None) == "setattr"
                    and node.args
                    and isinstance(node.args[0], ast.Name)
                    and node.args[0].id in imported
                ):
                    hit.append(node)
                offenders += [f"{os.path.relpath(path, package)}:{h.lineno}" for h in hit]
    assert offenders == []


def test_train_without_arch_is_argparses_error_not_a_bare_runtime_error(capsys):
    """fairseq#4326: the stock parse raises ``RuntimeError()`` with no message; the installed one
    says what argparse says of a missing required flag, exit status 2. With --arch nothing changes."""
    argv = ["data-bin", "--task", "translation"]
    with pytest.raises(RuntimeError) as stock:
        original(options, "parse_args_and_arch")(options.get_training_parser(), argv)
    assert stock.value.args == ()
    with pytest.raises(SystemExit) as e:
        options.parse_args_and_arch(options.get_training_parser(), argv)
    err = capsys.readouterr().err
    assert e.value.code == 2 and "error: the following arguments are required: --arch/-a" in err
    assert "Traceback" not in err
    with_arch = options.parse_args_and_arch(options.get_training_parser(), argv + ["--arch", "transformer"])
    assert with_arch.arch == "transformer"


def test_validate_without_task_is_argparses_error_not_a_key_error(capsys):
    """fairseq-validate's parser has no default task: the stock parse looks None up in the task
    registry (``KeyError: None``); the installed one says argparse's missing-flag line, exit 2."""
    argv = ["data-bin", "--path", "m.pt"]
    with pytest.raises(KeyError) as stock:
        original(options, "parse_args_and_arch")(options.get_validation_parser(), argv)
    assert stock.value.args == (None,)
    with pytest.raises(SystemExit) as e:
        options.parse_args_and_arch(options.get_validation_parser(), argv)
    err = capsys.readouterr().err
    assert e.value.code == 2 and "error: the following arguments are required: --task" in err
    assert options.parse_args_and_arch(options.get_validation_parser(), argv + ["--task", "translation"]).task


def test_weights_only_load_needs_the_allowlist(tmp_path):
    """fairseq#5603/#5610: torch >= 2.6 refuses what every legacy-arch fairseq checkpoint holds."""
    path = str(tmp_path / "legacy.pt")
    torch.save({"cfg": {"model": argparse.Namespace(arch="bart_base")}, "model": {}}, path)
    stock = subprocess.run(
        [sys.executable, "-c", "import sys, torch; torch.load(sys.argv[1])", path],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert stock.returncode != 0 and "argparse.Namespace" in stock.stderr  # torch alone, no plugin
    assert torch.load(path)["cfg"]["model"].arch == "bart_base"  # weights_only, with the allowlist


def test_call_main_prints_our_refusals_as_one_line(tmp_path, capsys, monkeypatch):
    cfg = train_cfg(tmp_path)

    def main(cfg):
        raise ConfigError("--block-size must be >= 1, got 0")

    with pytest.raises(ConfigError):  # stock: the refusal escapes as a traceback
        original(distributed_utils, "call_main")(cfg, main)
    monkeypatch.setattr(sys, "argv", ["fairseq-train"])
    with pytest.raises(SystemExit) as e:
        distributed_utils.call_main(cfg, main)
    assert e.value.code == 2
    assert capsys.readouterr().err == "fairseq-train: error: --block-size must be >= 1, got 0\n"

    def bug(cfg):
        raise KeyError("not ours")

    with pytest.raises(KeyError):  # anything else keeps its traceback
        distributed_utils.call_main(cfg, bug)


def test_a_run_with_data_loader_workers_leaves_no_temp_folder(tmp_path):
    """fairseq's data-loader workers are terminated at exit; one that sent a batch had made a
    ``pymp-*`` folder of its own and leaves it in the temp dir (stock ``call_main``). Under the
    fix the workers use the main process's folder, which it removes when it exits."""
    left = {}
    for run in ("stock", "fixed"):
        # the system's temp dir, not tmp_path: a worker's socket path inside it must stay within
        # AF_UNIX's 108 bytes (under pytest-xdist's longer tmp_path the worker's feeder thread dies
        # with "AF_UNIX path too long" and the loader waits for its batch forever)
        tmp = tempfile.mkdtemp(prefix=f"{run}-")
        try:
            env = dict(os.environ, TMPDIR=tmp)
            proc = subprocess.run(
                [sys.executable, "-c", WORKER_RUN, run, str(tmp_path)],
                env=env,
                capture_output=True,
                text=True,
                timeout=120,
            )
            assert proc.returncode == 0, proc.stderr[-2000:]
            left[run] = sorted(name[:5] for name in os.listdir(tmp) if name.startswith("pymp-"))
        finally:
            shutil.rmtree(tmp)
    assert left == {"stock": ["pymp-"], "fixed": []}


def test_a_run_without_workers_makes_no_temp_folder(tmp_path, monkeypatch):
    """The folder is made for runs with workers only: a process that ends without its exit handlers
    (killed, or a forked rank's ``os._exit``) would leave one made for nothing."""
    from lsg_fairseq.fairseq_fixes import worker_temp_dir

    made = []
    monkeypatch.setattr(worker_temp_dir.multiprocessing.util, "get_temp_dir", lambda: made.append(1) or "/tmp/pymp-x")
    for workers in (0, 2):
        ran = []
        distributed_utils.call_main(
            train_cfg(tmp_path, "--num-workers", str(workers)), lambda cfg: ran.append(cfg.dataset.num_workers)
        )
        assert ran == [workers] and len(made) == (workers > 0)
    main = worker_temp_dir._temp_dir_made_first(lambda args: args.num_workers)  # fairseq-generate's namespace
    assert main(argparse.Namespace(num_workers=0)) == 0 and len(made) == 1
    assert main(argparse.Namespace(num_workers=1)) == 1 and len(made) == 2


def test_a_temp_folder_too_long_for_the_workers_sockets_is_one_line(tmp_path, monkeypatch, capsys):
    """Under a TMPDIR whose workers' socket paths pass AF_UNIX's 107 bytes, fairseq's loader waits
    for its first batch forever; the run is refused in one line instead, before main."""
    from lsg_fairseq.fairseq_fixes import worker_temp_dir

    cfg, ran = train_cfg(tmp_path, "--num-workers", "2"), []
    monkeypatch.setattr(sys, "argv", ["fairseq-train"])
    fits = "/" + "t" * (worker_temp_dir.SOCKET_PATH_MAX - worker_temp_dir.SOCKET_NAME - 1)  # 107 bytes with a socket
    monkeypatch.setattr(worker_temp_dir.multiprocessing.util, "get_temp_dir", lambda: fits)
    distributed_utils.call_main(cfg, ran.append)
    assert len(ran) == 1
    folder = fits + "t"  # one byte more
    monkeypatch.setattr(worker_temp_dir.multiprocessing.util, "get_temp_dir", lambda: folder)
    with pytest.raises(SystemExit) as e:
        distributed_utils.call_main(cfg, ran.append)
    assert e.value.code == 2 and len(ran) == 1
    assert capsys.readouterr().err == (
        f"fairseq-train: error: --num-workers 2: the temp folder {folder} is too long a path for the data-loader "
        "workers' sockets (AF_UNIX: 107 bytes; the workers would wait forever): set TMPDIR to a shorter folder, "
        "or --num-workers 0\n"
    )


def test_nan_detector_reaches_the_backward_pass(tmp_path, monkeypatch, caplog):
    """fairseq's trainer reruns a step whose gradients are NaN/Inf under NanDetector. With its
    legacy backward hook on every module, calling an encoder (which returns a dict of lists) raises
    StopIteration; hooked on leaves only, the step runs and the first NaN gradient is reported."""
    from conftest import TINY_DIMS, TOY_LSG, build_task_and_model, toy_batch, write_toy_dict

    argv = [write_toy_dict(tmp_path), "--task", "long_document_summarization", "--arch", "lsg_bart_tiny"]
    _, model = build_task_and_model([*argv, *TINY_DIMS, *TOY_LSG])
    src, lengths, prev = toy_batch()

    def step():
        out, _ = model(src, lengths, prev)
        out.sum().backward()

    with monkeypatch.context() as stock:
        stock.setattr(NanDetector, "add_hooks", original(NanDetector, "add_hooks"))
        with pytest.raises(StopIteration), NanDetector(model):  # the upstream failure, at the encoder's return
            step()
    with torch.no_grad():  # a NaN in the output projection: its forward output and every gradient below
        model.decoder.output_projection.weight[5, 0] = float("nan")
    with NanDetector(model):
        step()
    reports = [r.getMessage() for r in caplog.records if r.name == "fairseq.nan_detector"]
    assert any(m.startswith("NaN detected in output of") and m.endswith("backward") for m in reports), reports


def test_a_training_does_not_start_from_the_last_ones_best_score(word_data, tmp_path, monkeypatch):
    """fairseq keeps the best validation score on ``save_checkpoint`` itself: a second training in
    one process was held to the first one's best (here 0.0, as a perfect loss would leave), and
    wrote no checkpoint_best.pt; with the fix it writes one, carrying its own score."""
    from fairseq_cli import train
    from test_bad_inputs import validated_training

    def trained(save_dir):
        argv = validated_training(word_data, tmp_path / save_dir, "loss")
        monkeypatch.setattr(sys, "argv", ["fairseq-train", *argv])
        checkpoint_utils.save_checkpoint.best = 0.0  # what an earlier training in this process left
        train.cli_main()
        return tmp_path / save_dir / "ck"

    with monkeypatch.context() as stock:
        stock.setattr(distributed_utils, "call_main", original(distributed_utils, "call_main"))
        ck = trained("stock")
    assert (ck / "checkpoint_last.pt").is_file() and not (ck / "checkpoint_best.pt").exists()
    ck = trained("fixed")
    extra = torch.load(ck / "checkpoint_best.pt", map_location="cpu", weights_only=False)["extra_state"]
    assert extra["best"] == extra["val_loss"] > 0.0


def lower_percentiles(sizes, num_buckets):
    """fairseq's bucket bounds, by hand: the sizes sorted, the one at rank floor(q (n-1)) for each
    q in 1/N .. N/N (numpy's "lower" percentile), without repeats."""
    ranked = sorted(sizes)
    ranks = [math.floor(i / num_buckets * (len(ranked) - 1) + 1e-9) for i in range(1, num_buckets + 1)]
    return sorted({ranked[r] for r in ranks})


@pytest.mark.skipif(np.lib.NumpyVersion(np.__version__) < "2.4.0", reason="numpy < 2.4 still takes interpolation=")
def test_batch_buckets_on_numpy_2():
    """--num-batch-buckets: fairseq's get_buckets passes np.percentile an argument numpy 2.4 removed,
    and LanguagePairDataset types its counts np.compat.long (removed in numpy 2.0). Both failed any
    run with the flag; the fixed ones bucket as fairseq meant to."""
    sizes = np.array([5, 9, 9, 12, 30, 31, 64, 100, 101, 250])
    with pytest.raises(TypeError, match="interpolation"):
        original(data_utils, "get_buckets")(sizes, 4)
    for holder in (data_utils, bucket_pad_length_dataset):
        for n in (1, 2, 4, 7, 10):
            assert holder.get_buckets(sizes, n).tolist() == lower_percentiles(sizes, n)

    from fairseq.data import Dictionary

    vocab = Dictionary()
    src = [torch.full((n,), 10) for n in (3, 7, 4, 12)]
    tgt = [torch.full((n,), 11) for n in (2, 5, 9, 1)]
    args = (src, np.array([len(s) for s in src]), vocab, tgt, np.array([len(t) for t in tgt]), vocab)
    with pytest.raises(AttributeError, match="compat"):
        stock = LanguagePairDataset.__new__(LanguagePairDataset)
        original(LanguagePairDataset, "__init__")(stock, *args, num_buckets=2)
    pair = LanguagePairDataset(*args, num_buckets=2)
    src_buckets, tgt_buckets = lower_percentiles([3, 7, 4, 12], 2), lower_percentiles([2, 5, 9, 1], 2)
    assert pair.src_sizes.tolist() == [min(b for b in src_buckets if b >= n) for n in (3, 7, 4, 12)]
    assert pair.tgt_sizes.tolist() == [min(b for b in tgt_buckets if b >= n) for n in (2, 5, 9, 1)]
    assert pair.bucketed_num_tokens.tolist() == [max(s, t) for s, t in zip(pair.src_sizes, pair.tgt_sizes)]
    assert [n for _, n in pair.buckets] == sorted(set(pair.bucketed_num_tokens.tolist()))
    assert pair[0]["source"].tolist() == [vocab.pad(), 10, 10, 10]  # padded to its bucket, on the left by default
    right = LanguagePairDataset(*args, left_pad_source=False, num_buckets=2)
    assert right[0]["source"].tolist() == [10, 10, 10, vocab.pad()]
    assert LanguagePairDataset(*args).buckets is None  # no flag, no buckets: fairseq's own path


def test_device_id_is_the_gpu_a_one_process_run_uses(tmp_path, monkeypatch, capsys):
    """fairseq sets the device from --device-id only where it starts distributed training: a run of
    one process built everything on GPU 0 whatever --device-id said. The GPUs are stood in for
    (four seen, the current device recorded); the original call_main never sets it."""
    import torch

    from lsg_fairseq.fairseq_fixes._wrap import original

    current = [0]
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: current[0])
    monkeypatch.setattr(torch.cuda, "set_device", lambda d: current.__setitem__(0, d))
    monkeypatch.setattr(sys, "argv", ["fairseq-train"])

    ran_on = []

    def main(cfg):
        ran_on.append(current[0])

    cfg = train_cfg(tmp_path, "--distributed-world-size", "1", "--device-id", "3")
    cfg.common.cpu = False  # the stand-in GPUs
    original(distributed_utils, "call_main")(cfg, main)
    distributed_utils.call_main(cfg, main)
    assert ran_on == [0, 3]  # fairseq's: GPU 0
    current[0] = 0
    cfg.distributed_training.device_id = 4
    with pytest.raises(SystemExit) as e:
        distributed_utils.call_main(cfg, main)
    assert e.value.code == 2 and ran_on == [0, 3]
    assert capsys.readouterr().err == "fairseq-train: error: --device-id 4: torch sees 4 GPUs (0 to 3)\n"
    # fairseq's default is $LOCAL_RANK, which a scheduler may set for a process that sees one GPU
    monkeypatch.setenv("LOCAL_RANK", "4")
    distributed_utils.call_main(cfg, main)
    assert ran_on == [0, 3, 0]
