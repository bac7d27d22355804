"""Half precision in the layers (lsg_layers.modules.precision): the S4D kernel stays float32 under
autocast, and float16 activations that overflow a naive half forward stay finite and close to float32.

Each test builds activations that do overflow float16 on the way (checked in the test: the
guarded value itself, computed naively in half, is inf) and compares the half forward with the
float32 one. CPU autocast (float16 and bfloat16) stands in for fairseq's ``--amp`` (CUDA float16
autocast); ``model.half()`` is fairseq's ``--fp16``.
"""

import pytest
import torch

from lsg_layers.modules.locost_blocks import LOCOSTEncoderBlock
from lsg_layers.modules.paths import forced_path
from lsg_layers.modules.precision import cast_for_matmul, clamp_fp16, fp16_in_play, matmul_dtype, within_fp16
from lsg_layers.modules.s4d import S4D
from lsg_layers.modules.t5_layers import T5Attention, T5DenseGatedGelu
from lsg_layers.ops.ssm import vandermonde_blocked

pytestmark = pytest.mark.usefixtures("single_thread")
FP16_MAX = torch.finfo(torch.float16).max


def rel(a, b):
    a, b = a.double(), b.double()
    return ((a - b).norm() / b.norm()).item()


# ---------------------------------------------------------------- helpers
def test_fp16_in_play_and_clamps():
    x = torch.ones(3)
    assert not fp16_in_play(x) and fp16_in_play(x.half())
    with torch.autocast("cpu", dtype=torch.float16):
        assert fp16_in_play(x)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert not fp16_in_play(x)
    h = torch.tensor([1.0, float("inf"), -float("inf")], dtype=torch.float16)
    assert torch.equal(clamp_fp16(h), torch.tensor([1.0, FP16_MAX - 1000, -(FP16_MAX - 1000)], dtype=torch.float16))
    big = torch.tensor([1e30])
    assert clamp_fp16(big) is big  # float32: untouched
    assert within_fp16(torch.tensor([1e6, -1e6])).tolist() == [FP16_MAX, -FP16_MAX]


def test_matmul_dtype_is_the_one_linear_computes_in():
    x = torch.ones(2, 3)
    for dtype in (torch.float32, torch.bfloat16, torch.float16, torch.float64):
        assert matmul_dtype(x.to(dtype)) == dtype  # no autocast: the tensor's own
    for autocast in (torch.float16, torch.bfloat16):
        with torch.autocast("cpu", dtype=autocast):
            for dtype in (torch.float32, torch.bfloat16, torch.float16, torch.float64):
                w = torch.ones(4, 3, dtype=dtype)
                seen = torch.nn.functional.linear(x.to(dtype), w).dtype  # what autocast does
                assert matmul_dtype(x.to(dtype)) == seen, (autocast, dtype, seen)
    big = torch.tensor([1e6, -1e6, 1.0])
    assert cast_for_matmul(big, torch.float16).tolist() == [FP16_MAX, -FP16_MAX, 1.0]  # clamped, finite
    assert cast_for_matmul(big, torch.bfloat16).tolist() == big.bfloat16().tolist()  # bfloat16 holds 1e6


# ---------------------------------------------------------------- S4D
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_s4d_kernel_is_float32_under_autocast(dtype):
    torch.manual_seed(0)
    layer = S4D(32, 64)
    ref = layer.kernel.reference(1024)  # (2 H L) one exp per entry
    with torch.no_grad():
        plain = layer.kernel(1024, whole=True)
        with torch.autocast("cpu", dtype=dtype):
            guarded = layer.kernel(1024, whole=True)
            grouped = layer.kernel(1024)
            # the product unguarded: its bmm runs in half precision
            unguarded = vandermonde_blocked(*layer.kernel.discretize(), 1024)
    assert guarded.dtype == grouped.dtype == torch.float32
    assert torch.equal(guarded, plain)
    assert rel(guarded, ref) < 1e-5 and rel(grouped, ref) < 1e-5
    assert rel(unguarded, ref) > 1e-4  # what the guard prevents


def overflowing_s4d(seed=0, H=16):
    """An S4D whose convolution exceeds float16's range (D k ~ 6e4 x 10) while the gated product
    does not (the gate q is ~1e-3)."""
    torch.manual_seed(seed)
    layer = S4D(H, 8)
    with torch.no_grad():
        layer.D.fill_(6e4)  # float16 holds it
        layer.k_proj.weight.mul_(20)
        layer.q_proj.weight.mul_(1e-3)
        layer.q_proj.bias.fill_(1e-3)
    return layer


@pytest.mark.parametrize("path", ["cpu", "whole"])
@pytest.mark.parametrize("grad", [False, True])
def test_s4d_half_forward_stays_finite_where_the_convolution_overflows(path, grad):
    layer = overflowing_s4d()
    u = torch.randn(2, 40, 16)
    mask = torch.zeros(2, 40, dtype=torch.bool)
    mask[1, 30:] = True
    with forced_path(layer, path), torch.set_grad_enabled(grad):
        ref = layer(u, mask)  # float32
        k = layer.k_proj(u).masked_fill(mask.unsqueeze(-1), 0)
        assert torch.isinf((layer.D * k).half()).any()  # the convolution (D k alone) overflows float16
        half = layer.half()
        out = half(u.half(), mask)
    assert out.dtype == torch.float16 and torch.isfinite(out).all()
    assert rel(out, ref) < 1e-2


def test_s4d_under_fp16_autocast_trains_finite_and_close():
    layer = overflowing_s4d().train()
    u = torch.randn(2, 40, 16)
    ref = layer(u)
    ref.sum().backward()
    ref_grad = layer.kernel.C.grad.clone()
    layer.zero_grad()
    with torch.autocast("cpu", dtype=torch.float16):
        out = layer(u)
    out.float().sum().backward()
    assert torch.isfinite(out).all() and rel(out, ref) < 1e-2
    assert torch.isfinite(layer.kernel.C.grad).all() and rel(layer.kernel.C.grad, ref_grad) < 1e-2


def test_s4d_bf16_under_fp16_autocast_stores_the_clamped_product_in_float16():
    """A bfloat16 model under float16 autocast (fairseq's --amp over a --bf16 checkpoint): the gated
    product, clamped to 65504, is what the float16 output projection reads. Stored in bfloat16 it
    would round up to 65536 and become inf in that projection; each path, with and without autograd,
    stores it in float16 and agrees with the others."""
    assert torch.isinf(torch.tensor(FP16_MAX).bfloat16().half())  # the rounding the store avoids
    torch.manual_seed(0)
    layer = S4D(16, 8).bfloat16()
    with torch.no_grad():
        layer.k_proj.weight.zero_()
        layer.k_proj.bias.fill_(100.0)
        layer.q_proj.weight.zero_()
        layer.q_proj.bias.fill_(1000.0)  # gated products ~1e5 and more: past float16's range
        layer.output_linear.weight.fill_(1e-4)  # 16 clamped values projected stay finite
        layer.output_linear.bias.zero_()
    u = torch.randn(2, 40, 16).bfloat16()
    outs = {}
    for path in ("cpu", "whole"):
        for grad in (False, True):
            with forced_path(layer, path), torch.set_grad_enabled(grad), torch.autocast("cpu", dtype=torch.float16):
                outs[path, grad] = layer(u).float()
    for key, out in outs.items():
        assert torch.isfinite(out).all(), key
        assert rel(out, outs["whole", True]) < 1e-2, key


@pytest.mark.parametrize(
    "autocast", [None, torch.bfloat16, torch.float16], ids=["off", "bf16_autocast", "fp16_autocast"]
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64])
def test_s4d_paths_agree_in_every_dtype_under_every_autocast(dtype, autocast):
    """Each model dtype under each CPU autocast: the CPU path without autograd (its output projection
    in two batches of columns, ``out += y_b W_b^T`` after the first, which autocast leaves alone), the
    whole-tensor path and the training path return the dtype ``nn.Linear`` would (autocast's, float64
    excepted) and agree to the half types' rounding."""
    torch.manual_seed(0)
    layer = S4D(16, 8).eval()
    with torch.no_grad():
        layer.kernel.log_dt[:8] = 2.5  # these channels decay within a few steps: a second decay group
    layer.min_projection_channels = 4  # one projection batch per group
    assert [len(idx) for idx, _, _ in layer.kernel_groups(40)] == [8, 8]
    layer = layer.to(dtype)
    u = torch.randn(2, 40, 16).to(dtype)
    mask = torch.zeros(2, 40, dtype=torch.bool)
    mask[1, 30:] = True
    outs = {}
    for path in ("cpu", "whole"):
        for grad in (False, True):
            on = autocast is not None
            with (
                forced_path(layer, path),
                torch.set_grad_enabled(grad),
                torch.autocast("cpu", dtype=autocast, enabled=on),
            ):
                outs[path, grad] = layer(u, mask)
    expected = autocast if autocast is not None and dtype != torch.float64 else dtype
    assert {out.dtype for out in outs.values()} == {expected}
    exact = expected in (torch.float32, torch.float64)
    for key, out in outs.items():
        assert rel(out, outs["whole", True]) < (1e-6 if exact else 1e-2), key


# ---------------------------------------------------------------- T5 layers
def overflowing_ffn(seed=0):
    """A gated-GeLU FFN whose output (wo's) exceeds float16's range: |y| ~ 1e5."""
    torch.manual_seed(seed)
    ffn = T5DenseGatedGelu(16, 64)
    with torch.no_grad():
        ffn.wo.weight.mul_(3e5)  # |w| < 4e4: float16 holds the weights
    return ffn


@pytest.mark.parametrize("grad", [False, True])
def test_t5_ffn_half_keeps_wo_in_float32(grad):
    ffn = overflowing_ffn()
    h = torch.randn(2, 5, 16)
    with torch.set_grad_enabled(grad):
        ref = ffn(h)
        assert torch.isinf(ref.half()).any()
        out = ffn.half()(h.half())
    assert out.dtype == torch.float32 and torch.isfinite(out).all()  # HF T5: wo's output is float32
    assert rel(out, ref) < 1e-2


def test_t5_ffn_half_gradients_match_float32():
    """The custom backward with wo in float32 (weights of ordinary size: gradients this large
    would overflow float16 whatever the layer does; fairseq's loss scaler is for those)."""
    torch.manual_seed(0)
    ffn = T5DenseGatedGelu(16, 64)
    h = torch.randn(2, 5, 16)
    ref = ffn(h)
    grads = torch.autograd.grad(ref.sum(), [ffn.wi_0.weight, ffn.wo.weight])
    half = ffn.half()
    hh = h.half().requires_grad_(True)
    out = half(hh)
    got = torch.autograd.grad(out.sum(), [half.wi_0.weight, half.wo.weight, hh])
    assert [g.dtype for g in got] == [torch.float16] * 3
    for g, r in zip(got, grads):
        assert torch.isfinite(g).all() and rel(g, r) < 2e-2


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_t5_ffn_trains_under_autocast(dtype):
    """Under autocast the FFN runs the plain expression (the custom backward would recompute
    without autocast and meet half gradients with float32 weights: a dtype error)."""
    torch.manual_seed(0)
    ffn = T5DenseGatedGelu(16, 64, dropout=0.0).train()
    h = torch.randn(2, 5, 16)
    ref_grad = torch.autograd.grad(ffn(h).sum(), ffn.wi_1.weight)[0]
    with torch.autocast("cpu", dtype=dtype):
        out = ffn(h)
    (grad,) = torch.autograd.grad(out.float().sum(), ffn.wi_1.weight)
    assert grad.dtype == torch.float32 and rel(grad, ref_grad) < 3e-2


def big_scores(autocast: bool):
    """q, k, v (1, 2 heads, T, 8) whose scores q k^T pass float16's range: multiples of 64 of small
    integers, exact in float16, so the float32 reference sees the very same inputs."""
    g = torch.Generator().manual_seed(0)
    q, k = (64.0 * torch.randint(-8, 9, (1, 2, n, 8), generator=g) for n in (5, 9))
    v = torch.randn(1, 2, 9, 8, generator=g)
    return (q, k, v) if autocast else (q.half(), k.half(), v.half())


@pytest.mark.parametrize("autocast", [False, True])
def test_t5_attention_scores_in_float32_where_float16_would_overflow(autocast):
    attn = T5Attention(16, 8, 2)
    q, k, v = big_scores(autocast)
    assert torch.isinf(torch.matmul(q.half(), k.half().transpose(-1, -2))).any()  # what a half matmul gives
    ref = attn._attend(q.float(), k.float(), v.float(), None)
    if autocast:
        with torch.autocast("cpu", dtype=torch.float16):
            out = attn._attend(q, k, v, None)
    else:
        out = attn._attend(q, k, v, None)
    assert torch.isfinite(out).all() and rel(out, ref) < 1e-3


def test_locost_block_half_forward_matches_float32():
    """An encoder block (SSM + FFN, both overflowing) in float16: finite and close to float32."""
    torch.manual_seed(0)
    block = LOCOSTEncoderBlock(16, 8, 64)
    with torch.no_grad():
        block.layer[1].DenseReluDense.wo.weight.mul_(3e5)
        ssm = block.layer[0].ssm_layer
        ssm.D.fill_(6e4)
        ssm.k_proj.weight.mul_(20)
        ssm.q_proj.weight.mul_(1e-3)
        ssm.q_proj.bias.fill_(1e-3)
    x = torch.randn(2, 30, 16)
    with torch.no_grad():
        ref = block(x)
        assert ref.abs().max() > FP16_MAX
        out = block.half()(x.half())
    assert torch.isfinite(out).all() and rel(out, ref) < 1e-2


def _attention_inputs(dtype, beam: int, T: int, S: int, padded: bool):
    """q (2, 4 heads, beam*T, 16), k, v (2, 4, S, 16) and a bias as the decoder makes them: the
    position bias with the causal mask (self-attention), or the padding mask (cross-attention);
    scores of T5's unscaled size (tens)."""
    g = torch.Generator().manual_seed(beam * 100 + T)
    q = 2.0 * torch.randn(2, 4, beam * T, 16, generator=g, dtype=torch.float64)
    k, v = (
        torch.randn(2, 4, S, 16, generator=g, dtype=torch.float64),
        torch.randn(2, 4, S, 16, generator=g, dtype=torch.float64),
    )
    neg = torch.finfo(torch.float32).min
    if padded:  # cross-attention: source 1 padded past S // 2
        bias = torch.zeros(2, 1, 1, S)
        bias[1, ..., S // 2 :] = neg
    else:  # self-attention at the last T of S positions
        bias = 3.0 * torch.randn(1, 4, T, S, generator=g)
        bias = bias.masked_fill(torch.arange(S)[None, :] > torch.arange(S - T, S)[:, None], neg)
    return (q.to(dtype), k.to(dtype), v.to(dtype)), (q, k, v), bias


@pytest.mark.parametrize(
    ("beam", "T", "S", "padded"), [(1, 1, 9, False), (1, 7, 7, False), (3, 1, 40, True), (1, 5, 40, True)]
)
def test_fused_t5_attention_equals_the_reference(beam, T, S, padded):
    """Eval-mode T5 attention as one SDPA call (``T5Attention.fused``) against HF's operations
    (``reference``): float32 to rounding; bfloat16 no further from the float64 result than HF's own
    bfloat16 arithmetic (which rounds the scores to bfloat16 where the fused kernel keeps them in
    float32, and adds the bias in float32 where the kernel takes it in bfloat16)."""
    attn = T5Attention(64, 16, 4).eval()
    for dtype, bound in ((torch.float32, 1e-6), (torch.bfloat16, None)):
        (q, k, v), exact_in, bias = _attention_inputs(dtype, beam, T, S, padded)
        assert attn.fused(q)
        fused, ref = attn._attend(q, k, v, bias), attn.reference(q, k, v, bias)
        exact = attn.reference(*exact_in, bias.double())  # float64 throughout
        assert fused.dtype == ref.dtype == dtype and fused.shape == ref.shape
        if bound is not None:
            assert rel(fused, ref) < bound, rel(fused, ref)
        else:
            assert 0 < rel(fused, exact) <= 1.25 * rel(ref, exact), (rel(fused, exact), rel(ref, exact))
    assert not attn.train().fused(q) and not attn.eval().fused(
        q.half()
    )  # dropout; float16's range (HF's float32 scores)
