"""Half precision (bf16 / fp16) models: what has no half-precision kernel runs in float32 inside them.

On a GPU, cuFFT computes half precision only for power-of-two sizes and S4D's kernels need float32
phases; pocketfft (CPU) has no half precision at all. So S4D's convolution runs in float32 on
every path (the SSM parameters stay float32 when the model is cast, ``S4DKernel._apply``) and
casts back. Checked on CPU, on both layer paths (``lsg_layers.modules.paths``): every FFT sees
float32, a bf16/fp16 model's logits stay close to the float32 model's, gradients are finite, and
fairseq's own ``--bf16`` trainer steps every arch.
"""

import math

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from conftest import TINY_LOCOST, TOY_LSG, build_task_and_model, toy_batch, training_config, write_toy_dict
from lsg_layers.modules.paths import forced_path
from lsg_layers.modules.s4d_kernel import SSM_PARAMETER_NAMES

ARCHS = {"bart_tiny": [], "lsg_bart_tiny": TOY_LSG, "led_tiny": ["--attention-window", "8"], "locost_tiny": []}
FFT_OPS = ("_fft_r2c", "_fft_c2r", "_fft_c2c")


class FFTDtypes(TorchDispatchMode):
    """The dtypes of every FFT's input in the block."""

    def __init__(self):
        super().__init__()
        self.seen = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.overloadpacket.__name__ in FFT_OPS:
            self.seen.append(args[0].dtype)
        return func(*args, **(kwargs or {}))


def half_supported(dtype) -> bool:
    """Whether this torch build runs ``dtype`` GEMMs on CPU (bf16 always; fp16 on recent builds)."""
    try:
        torch.ones(2, 2, dtype=dtype) @ torch.ones(2, 2, dtype=dtype)
        return True
    except RuntimeError:
        return False


CASES = (
    [(arch, torch.bfloat16, path) for arch in ("lsg_bart_tiny", "led_tiny", "locost_tiny") for path in ("cpu", "whole")]
    + [(arch, torch.float16, "whole") for arch in ("lsg_bart_tiny", "led_tiny", "locost_tiny")]
    + [("bart_tiny", torch.bfloat16, "cpu")]
)  # (fp16 on the CPU paths: same kernels as bf16 there)


@pytest.mark.parametrize("arch,dtype,path", CASES, ids=[f"{a}-{str(d)[6:]}-{p}" for a, d, p in CASES])
def test_half_precision_model_matches_float32_and_runs_ffts_in_float32(arch, dtype, path, tmp_path):
    if not half_supported(dtype):
        pytest.skip(f"this torch build has no CPU {dtype} matmul")
    data = write_toy_dict(tmp_path)
    _, model = build_task_and_model(
        [
            data,
            "--task",
            "long_document_summarization",
            "--arch",
            arch,
            "--max-source-positions",
            "64",
            "--dropout",
            "0",
        ]
        + ARCHS[arch]
    )
    src, lengths, prev = toy_batch(L=45, lengths=(45, 30))
    model.train()
    with forced_path(model, path):
        ref = model(src, lengths, prev)[0].float()
        model.to(dtype)
        with FFTDtypes() as ffts:
            logits = model(src, lengths, prev)[0]
            logits.float().logsumexp(-1).sum().backward()
    assert logits.dtype == dtype
    # bf16 keeps 8 bits of mantissa: logits of O(1-10) agree to a few 1e-2 after a 4-layer model
    scale = ref.abs().max()
    assert (logits.float() - ref).abs().max() < 0.05 * scale, ((logits.float() - ref).abs().max(), scale)
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    assert grads and all(torch.isfinite(g).all() for g in grads)
    if arch.startswith("locost"):
        assert ffts.seen and set(ffts.seen) <= {torch.float32, torch.complex64}, set(ffts.seen)
        kernel = model.encoder.block[0].layer[0].ssm_layer.kernel
        assert kernel.A_imag.dtype == torch.float32  # the SSM parameters stay float32 in a half model
    else:
        assert not ffts.seen


WORD_TINY = [
    "--encoder-embed-dim",
    "16",
    "--encoder-ffn-embed-dim",
    "32",
    "--decoder-embed-dim",
    "16",
    "--decoder-ffn-embed-dim",
    "32",
    "--encoder-layers",
    "1",
    "--decoder-layers",
    "1",
    "--max-source-positions",
    "128",
    "--max-target-positions",
    "64",
    "--truncate-target",
]


@pytest.mark.parametrize(
    "model",
    [
        ["--arch", "led_tiny", *WORD_TINY, "--attention-window", "16"],
        [*TINY_LOCOST, "--max-source-positions", "128", "--max-target-positions", "64", "--truncate-target"],
    ],
    ids=["led_tiny", "locost_tiny"],
)
def test_fairseq_bf16_trainer_steps_every_arch(word_data, model):
    """fairseq's own trainer with --bf16 (FP16Optimizer, bf16 weights and fp32 master copies);
    lsg_bart_tiny: tests/test_bf16.py."""
    import lsg_fairseq
    from fairseq import tasks
    from fairseq.trainer import Trainer

    argv = [
        str(word_data),
        "--task",
        "long_document_summarization",
        "--user-dir",
        lsg_fairseq.user_dir(),
        *model,
        "--criterion",
        "cross_entropy",
        "--optimizer",
        "adam",
        "--lr",
        "1e-2",
        "--cpu",
        "--bf16",
    ]
    cfg = training_config(argv)
    task = tasks.setup_task(cfg.task)
    task.load_dataset("train")
    torch.manual_seed(0)
    trainer = Trainer(cfg, task, task.build_model(cfg.model), task.build_criterion(cfg.criterion))
    ds = task.dataset("train")
    ssm = {n: p for n, p in trainer.model.named_parameters() if n.rsplit(".", 1)[-1] in SSM_PARAMETER_NAMES}
    before = {n: p.detach().clone() for n, p in ssm.items()}
    losses = [trainer.train_step([ds.collater([ds[i] for i in range(s, s + 2)])])["loss"] for s in (0, 2)]
    assert type(trainer.optimizer).__name__ == "FP16Optimizer"
    assert all(math.isfinite(x) for x in losses), losses
    assert next(trainer.model.parameters()).dtype == torch.bfloat16
    # LOCOST's SSM parameters are not cast (S4DKernel._apply) and take their float32 master's steps:
    # Adam's ~1e-2 steps on A_imag (pi * n up to 3 pi at d_state 8) are below bf16's spacing there (1/16)
    assert all(p.dtype == torch.float32 for p in ssm.values()), {n: p.dtype for n, p in ssm.items()}
    assert all(not torch.equal(p, before[n]) for n, p in ssm.items())
    assert ("locost" in model[1]) == bool(ssm)
