"""lsg_fairseq.fairseq_fixes.bf16_off_tpu: ``--bf16`` / ``--memory-efficient-bf16`` no longer take fairseq's TPU path.

Stock fairseq 0.12 sets ``tpu=True`` whenever bf16 is on and then calls ``xm.xla_device()`` on
None (fairseq#4696). With the plugin imported, fairseq's own trainer runs bf16 updates; checked on
CPU here (a GPU run was not available to this test suite).
"""

import math

import pytest
import torch
from fairseq import options, tasks

import lsg_fairseq
from lsg_fairseq.fairseq_fixes._wrap import original

from conftest import TINY_LSG_BART, training_config

TINY = [*TINY_LSG_BART, "--max-source-positions", "128", "--max-target-positions", "64", "--truncate-target"]


def argv(data, *flags):
    return [
        str(data),
        "--task",
        "long_document_summarization",
        "--user-dir",
        lsg_fairseq.user_dir(),
        *TINY,
        "--criterion",
        "cross_entropy",
        "--optimizer",
        "adam",
        "--lr",
        "1e-2",
        "--cpu",
        *flags,
    ]


def test_stock_parser_would_take_the_tpu_path(word_data):
    stock = original(options, "parse_args_and_arch")(options.get_training_parser(), argv(word_data, "--bf16"))
    assert stock.tpu is True  # the upstream bug the shim undoes
    patched = options.parse_args_and_arch(options.get_training_parser(), argv(word_data, "--bf16"))
    assert patched.tpu is False and patched.bf16 is True
    asked = options.parse_args_and_arch(options.get_training_parser(), argv(word_data, "--bf16", "--tpu"))
    assert asked.tpu is True  # an explicit --tpu is kept


def test_fp16_with_bf16_is_one_line_about_those_flags(word_data, capsys):
    """Stock: 'Cannot combine --fp16 and --tpu' (no --tpu was given), a ValueError traceback."""
    flags = argv(word_data, "--fp16", "--memory-efficient-bf16")
    with pytest.raises(ValueError, match="Cannot combine --fp16 and --tpu"):
        original(options, "parse_args_and_arch")(options.get_training_parser(), flags)
    with pytest.raises(SystemExit) as e:
        options.parse_args_and_arch(options.get_training_parser(), flags)
    err = capsys.readouterr().err
    assert e.value.code == 2 and "Traceback" not in err
    expected = "error: --fp16 and --bf16 cannot be combined (or their --memory-efficient- forms): give one"
    assert err.strip().splitlines()[-1].endswith(expected)
    with pytest.raises(ValueError, match="Cannot combine --fp16 and --tpu"):  # --tpu asked: fairseq's own
        options.parse_args_and_arch(options.get_training_parser(), flags + ["--tpu"])


@pytest.mark.parametrize(
    "flag,optimizer", [("--memory-efficient-bf16", "MemoryEfficientFP16Optimizer"), ("--bf16", "FP16Optimizer")]
)
def test_bf16_training_steps_on_cpu(word_data, flag, optimizer):
    from fairseq.trainer import Trainer

    cfg = training_config(argv(word_data, flag))
    task = tasks.setup_task(cfg.task)
    task.load_dataset("train")
    torch.manual_seed(0)
    model = task.build_model(cfg.model)
    trainer = Trainer(cfg, task, model, task.build_criterion(cfg.criterion))
    assert trainer.model.encoder.global_embeddings.weight.dtype == torch.bfloat16
    ds = task.dataset("train")
    before = trainer.model.encoder.layers[0].self_attn.q_proj.weight.detach().clone()
    losses = []
    for start in (0, 2):
        log = trainer.train_step([ds.collater([ds[i] for i in range(start, start + 2)])])
        losses.append(log["loss"])
    assert type(trainer.optimizer).__name__ == optimizer
    assert all(math.isfinite(x) for x in losses)
    after = trainer.model.encoder.layers[0].self_attn.q_proj.weight
    assert after.dtype == torch.bfloat16 and not torch.equal(after, before)  # bf16 weights were updated
