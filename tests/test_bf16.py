"""lsg_fairseq.fairseq_fixes.bf16_off_tpu: ``--bf16`` / ``--memory-efficient-bf16`` no longer take fairseq's TPU path.

Stock fairseq 0.12 sets ``tpu=True`` whenever bf16 is on and then calls ``xm.xla_device()`` on
None (fairseq#4696). With the plugin imported, fairseq's own trainer runs bf16 updates; checked on
CPU here (a GPU run was not available to this test suite).
"""

import math

import pytest
import torch
from fairseq import options, tasks

# imported here, not in a test: each sets up fairseq's root logging handler on sys.stdout when it is
# first imported or run, and a test's capsys stream is closed after it (a later test's log lines
# then end in "--- Logging error ---"); so no capsys in the test that runs them either
from fairseq_cli import generate, interactive, validate

import lsg_fairseq
from lsg_fairseq.fairseq_fixes._wrap import original

from conftest import TINY_LSG_BART, training_config
from test_bad_inputs import tiny_checkpoint  # noqa: F401  (a fixture)

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


@pytest.mark.parametrize("command", ["generate", "interactive", "validate"])
def test_bf16_inference_runs_the_models_in_bfloat16(
    word_data,
    tiny_checkpoint,  # noqa: F811  (the fixture imported above)
    monkeypatch,
    encoder_dtypes,
    command,
):
    """fairseq's inference commands cast their models for --fp16 only: under --bf16 the encoder ran
    in float32 (the stock command, shown first), now in bfloat16 (fairseq_fixes/bf16_inference.py)."""
    import io
    import sys

    # as when the command imports the plugin through --user-dir (or lsg-fairseq-generate, after
    # importing fairseq_cli.generate): the fixes of a command's main are installed once it is loaded
    lsg_fairseq.fairseq_fixes.install()
    seen = encoder_dtypes
    module = {"generate": generate, "interactive": interactive, "validate": validate}[command]
    argv = [f"fairseq-{command}", str(word_data), "--user-dir", lsg_fairseq.user_dir(), "--path", tiny_checkpoint]
    argv += ["--task", "long_document_summarization", "--cpu", "--bf16", "--max-source-positions", "128"]
    argv += ["--max-target-positions", "64", "--truncate-source", "--truncate-target"]
    argv += {
        "generate": ["--gen-subset", "valid", "--max-len-b", "3", "--beam", "2", "--batch-size", "2"],
        "interactive": ["--max-len-b", "3", "--beam", "2"],
        "validate": ["--valid-subset", "valid", "--batch-size", "2"],
    }[command]
    monkeypatch.setattr(sys, "argv", argv)

    def run():
        monkeypatch.setattr(sys, "stdin", io.StringIO("a document\n"))
        module.cli_main()

    with monkeypatch.context() as stock:
        stock.setattr(module, "main", original(module, "main"))
        run()
    assert seen and set(seen) == {torch.float32}, seen  # the upstream behaviour
    seen.clear()
    run()
    assert seen and set(seen) == {torch.bfloat16}, seen
