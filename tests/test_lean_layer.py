"""--lean-activations: the encoder layers of LSG-BART and LED keep less for backward and give the
same outputs and gradients as fairseq's own layer forward."""

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from conftest import build_task_and_model, load_script, toy_batch, write_toy_dict

from lsg_layers.modules.lean_ffn import (
    bool_dropout,
    dropout_with_mask,
    ffn_recompute_activation,
    masked_scale,
    where_dropout,
)

pytestmark = pytest.mark.usefixtures("single_thread")  # conftest: tiny tensors, one thread

OpCounter = load_script("benchmarks/op_count.py", "op_count").OpCounter  # dispatcher ops by name


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("activation", [F.gelu, torch.relu, torch.tanh])
def test_ffn_recompute_activation_matches_autograd(bias, activation):
    torch.manual_seed(0)
    fc1, fc2 = nn.Linear(6, 10, bias=bias).double(), nn.Linear(10, 6, bias=bias).double()
    x = torch.randn(3, 5, 6, dtype=torch.float64, requires_grad=True)
    params = [x] + list(fc1.parameters()) + list(fc2.parameters())
    fast = ffn_recompute_activation(x, fc1, fc2, activation)
    slow = fc2(activation(fc1(x)))
    assert torch.allclose(fast, slow, atol=1e-12)
    go = torch.randn_like(slow)
    for a, b in zip(torch.autograd.grad(fast, params, go), torch.autograd.grad(slow, params, go)):
        assert torch.allclose(a, b, atol=1e-12)
    assert torch.autograd.gradcheck(
        lambda x, w1, w2: ffn_recompute_activation(x, _Lin(w1), _Lin(w2), activation), (x, fc1.weight, fc2.weight)
    )


class _Lin:
    """A stand-in Linear for gradcheck: weight as an input, no bias."""

    def __init__(self, w):
        self.weight, self.bias = w, None


def test_ffn_keeps_only_input_and_hidden():
    fc1, fc2 = nn.Linear(8, 32), nn.Linear(32, 8)
    x = torch.randn(50, 8, requires_grad=True)
    sizes = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: sizes.append(t.numel()) or t, lambda t: t):
        ffn_recompute_activation(x, fc1, fc2, F.gelu)
    # x, fc1's output and the two weights: no activation output (another 50 x 32)
    assert sum(sizes) == 50 * 8 + 50 * 32 + 2 * 8 * 32


def test_bool_dropout_is_inverted_dropout_with_a_bool_mask():
    torch.manual_seed(0)
    x = torch.ones(200, 500, requires_grad=True)
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t.dtype) or t, lambda t: t):
        y = bool_dropout(x, 0.25)
    assert saved == [torch.bool]
    kept = y != 0
    assert abs(kept.float().mean().item() - 0.75) < 0.01
    assert torch.allclose(y[kept], torch.full_like(y[kept], 1 / 0.75))
    y.sum().backward()
    assert torch.equal(x.grad, kept.float() / 0.75)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("p", [0.1, 0.25, 0.5])
def test_bool_dropout_is_the_written_out_formula_bit_for_bit(dtype, p):
    x = (torch.randn(37, 129) * 3).to(dtype).requires_grad_(True)
    go = torch.randn(37, 129).to(dtype)
    out = {}
    for name, fn in (("fast", bool_dropout), ("reference", where_dropout)):
        torch.manual_seed(5)
        y = fn(x, p)
        (g,) = torch.autograd.grad(y, x, go)
        out[name] = (y, g)
    (y, g), (y_ref, g_ref) = out["fast"], out["reference"]
    # x * 0 is -0.0 for negative x where `where` gives +0.0: equal as numbers, not as bits
    assert y.dtype == dtype and torch.equal(y, y_ref) and torch.equal(g, g_ref)
    assert 0 < (y == 0).float().mean() < 2 * p


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16])
def test_dropout_with_mask_and_masked_scale_are_the_written_out_formula(dtype):
    """The forms a written-out backward uses (t5_layers.GatedGeluFFN): where_dropout's draw with its
    mask, and x * keep / (1 - p) for a mask already drawn, bit for bit; and the ops they take on
    CUDA (torch's native dropout and its backward), run here on CPU kernels in float32 and float64."""
    p = 0.3
    x = (torch.randn(41, 67) * 3).to(dtype)
    g = (torch.randn(41, 67) * 3).to(dtype)
    torch.manual_seed(9)
    out, keep = dropout_with_mask(x.clone(), p)
    torch.manual_seed(9)
    ref = where_dropout(x, p)
    assert keep.dtype == torch.bool and torch.equal(keep, ref != 0) and torch.equal(out, ref)
    expected = torch.where(keep, g, g.new_zeros(())) * (1 / (1 - p))
    assert torch.equal(masked_scale(g.clone(), keep, p), expected)
    if dtype in (torch.float32, torch.float64):
        torch.manual_seed(9)
        native_out, native_keep = torch.native_dropout(x, p, True)
        assert torch.equal(native_out, ref) and torch.equal(native_keep, keep)
        assert torch.equal(torch.ops.aten.native_dropout_backward(g, keep, 1 / (1 - p)), expected)


def test_bool_dropout_issues_one_op_each_way():
    """What a GPU's host issues for it: torch's own dropout (CUDA: one kernel), not five ops and three."""
    x = torch.randn(8, 16, requires_grad=True)
    go = torch.ones(8, 16)
    counts = {}
    for name, fn in (("fast", bool_dropout), ("reference", where_dropout)):
        with OpCounter() as forward:
            y = fn(x, 0.25)
        with OpCounter() as backward:
            torch.autograd.grad(y, x, go)
        counts[name] = (sum(forward.ops.values()), sum(backward.ops.values()) - backward.ops["detach"])
    assert counts["fast"] == (1, 1)
    assert counts["reference"] == (5, 3)  # the test's own yardstick: fails if the reference changes form


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_dropouts_on_cuda_are_torchs_fused_ones_in_every_dtype(dtype):
    """A CUDA tensor (a fake one: no device here) takes native_dropout and its backward, in half
    precision too."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        x = torch.empty(4, 8, dtype=dtype, device="cuda")
        with OpCounter() as drop:
            y = bool_dropout(x, 0.1)
        with OpCounter() as with_mask:
            out, keep = dropout_with_mask(x, 0.1)
        with OpCounter() as scale:
            grad = masked_scale(x, keep, 0.1)
    # "device": the fake mode's
    launched = [{name: k for name, k in c.ops.items() if name != "device"} for c in (drop, with_mask, scale)]
    assert launched == [{"native_dropout": 1}, {"native_dropout": 1}, {"native_dropout_backward": 1}]
    assert keep.dtype == torch.bool
    assert y.shape == out.shape == grad.shape == x.shape and y.dtype == out.dtype == grad.dtype == dtype


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    return write_toy_dict(tmp_path_factory.mktemp("lean_data"))


ARCH_FLAGS = {
    "lsg_bart_tiny": ["--block-size", "8", "--sparse-block-size", "8", "--sparsity-factor", "2"],
    "led_tiny": ["--attention-window", "8"],
}


def build(data_dir, arch, *flags):
    argv = (
        [
            data_dir,
            "--task",
            "long_document_summarization",
            "--arch",
            arch,
            "--encoder-embed-dim",
            "32",
            "--encoder-ffn-embed-dim",
            "64",
            "--max-source-positions",
            "512",
            "--max-target-positions",
            "64",
        ]
        + ARCH_FLAGS[arch]
        + list(flags)
    )
    return build_task_and_model(argv)[1]


@pytest.mark.parametrize("arch", sorted(ARCH_FLAGS))
def test_lean_training_step_equals_fairseq_forward(arch, data_dir):
    # dropout off (lean dropout draws its bool mask differently): lean and fairseq's forward must
    # give the same outputs and gradients, and lean must keep less for backward
    models = {
        lean: build(data_dir, arch, "--dropout", "0", "--lean-activations", lean).double().train()
        for lean in ("true", "false")
    }
    assert all(layer.lean for layer in models["true"].encoder.layers)
    assert not any(layer.lean for layer in models["false"].encoder.layers)
    src, lengths, prev = toy_batch(L=60, lengths=(60, 41))
    outs, grads, saved = {}, {}, {}
    for lean, m in models.items():
        sizes = []
        with torch.autograd.graph.saved_tensors_hooks(lambda t: sizes.append(t.numel()) or t, lambda t: t):
            out, _ = m(src, lengths, prev)
        saved[lean] = sum(sizes)
        out.square().mean().backward()
        outs[lean] = out
        grads[lean] = {n: p.grad for n, p in m.named_parameters() if p.grad is not None}
    assert torch.allclose(outs["true"], outs["false"], atol=1e-10)
    assert grads["true"].keys() == grads["false"].keys()
    for name, g in grads["true"].items():
        assert torch.allclose(g, grads["false"][name], atol=1e-9), name
    assert saved["true"] < 0.8 * saved["false"], saved


@pytest.mark.parametrize("arch", sorted(ARCH_FLAGS))
def test_lean_training_with_dropout_runs_and_eval_is_unchanged(arch, data_dir):
    lean = build(data_dir, arch, "--dropout", "0.3")
    plain = build(data_dir, arch, "--dropout", "0.3", "--lean-activations", "false")
    src, lengths, prev = toy_batch(L=60, lengths=(60, 41))
    out, _ = lean.train()(src, lengths, prev)
    out.sum().backward()
    assert all(torch.isfinite(p.grad).all() for p in lean.parameters() if p.grad is not None)
    with torch.no_grad():
        assert torch.equal(lean.eval()(src, lengths, prev)[0], plain.eval()(src, lengths, prev)[0])


def test_lean_flag_values(data_dir):
    assert not any(layer.lean for layer in build(data_dir, "led_tiny", "--lean-activations", "off").encoder.layers)
    with pytest.raises(SystemExit):
        build(data_dir, "lsg_bart_tiny", "--lean-activations", "maybe")


def test_long_source_cross_attention_equals_fairseq_path():
    from fairseq.modules.multihead_attention import MultiheadAttention

    from lsg_fairseq.models.cross_attention import LongSourceCrossAttention

    torch.manual_seed(0)
    fused = LongSourceCrossAttention(16, 4, kdim=16, vdim=16, encoder_decoder_attention=True).double().train()
    plain = MultiheadAttention(16, 4, kdim=16, vdim=16, encoder_decoder_attention=True).double().train()
    plain.load_state_dict(fused.state_dict())
    q = torch.randn(5, 2, 16, dtype=torch.float64, requires_grad=True)
    kv = torch.randn(40, 2, 16, dtype=torch.float64, requires_grad=True)
    pad = torch.zeros(2, 40, dtype=torch.bool)
    pad[1, 25:] = True
    outs, grads, saved = [], [], []
    for m in (fused, plain):
        sizes = []
        with torch.autograd.graph.saved_tensors_hooks(lambda t: sizes.append(t.numel()) or t, lambda t: t):
            out, w = m(q, kv, kv, key_padding_mask=pad, static_kv=True, need_weights=False)
        assert w is None
        outs.append(out)
        grads.append(torch.autograd.grad(out.square().sum(), [q, kv] + list(m.parameters())))
        saved.append(max(sizes))
    assert torch.allclose(outs[0], outs[1], atol=1e-6)
    for a, b in zip(*grads):  # fairseq's path takes its softmax in fp32: float64 agrees to ~1e-8
        assert torch.allclose(a, b, atol=1e-6), (a - b).abs().max()
    assert saved[0] < saved[1]  # fairseq keeps the (n*h, tgt, src) probabilities; the fused path does not
    # asking for weights keeps fairseq's path and its weights
    out, w = fused(q, kv, kv, key_padding_mask=pad, static_kv=True, need_weights=True)
    assert w is not None and torch.allclose(out, outs[1], atol=1e-12)  # the same fairseq path


def test_long_input_models_use_the_long_source_decoder(data_dir):
    from lsg_fairseq.models.cross_attention import LongSourceCrossAttention

    for arch in ARCH_FLAGS:
        model = build(data_dir, arch)
        assert all(isinstance(layer.encoder_attn, LongSourceCrossAttention) for layer in model.decoder.layers)


def _saved_bytes(fn):
    sizes = {}

    def pack(t):
        sizes[t.untyped_storage().data_ptr()] = (t.untyped_storage().nbytes(), t.dtype)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn()
    return out, sizes


def test_t5_training_cross_attention_recomputes_its_probabilities(monkeypatch):
    # LOCOST's decoder cross-attention in training: same outputs and gradients as the plain path
    # (the same dropout mask: RNG state restored in backward), without the (heads, T, S)
    # probabilities kept for backward
    from lsg_layers.modules import t5_layers

    attn = t5_layers.T5Attention(16, 4, 2, dropout=0.3).train()
    x = torch.randn(2, 5, 16, requires_grad=True)
    memory = torch.randn(2, 40, 16, requires_grad=True)
    bias = torch.zeros(2, 1, 1, 40).masked_fill(torch.rand(2, 1, 1, 40) < 0.2, torch.finfo(torch.float32).min)
    go = torch.randn(2, 5, 16)
    leaves = [x, memory] + list(attn.parameters())
    results = {}
    for name in ("checkpointed", "plain"):
        if name == "plain":
            monkeypatch.setattr(t5_layers, "checkpoint", lambda fn, *a, **kw: fn(*a))
        torch.manual_seed(7)
        out, saved = _saved_bytes(lambda: attn(x, memory=memory, bias=bias, static_kv=True))
        results[name] = (out, torch.autograd.grad(out, leaves, go), sum(b for b, _ in saved.values()))
    (a, ga, sa), (b, gb, sb) = results["checkpointed"], results["plain"]
    assert torch.equal(a, b) and all(torch.equal(u, v) for u, v in zip(ga, gb))
    probs = 2 * 2 * 5 * 40 * 4  # one (B, heads, T, S) float tensor
    assert sa <= sb - 2 * probs


def test_lean_dropout_keeps_a_bool_mask_and_is_dropout_elsewhere():
    from lsg_layers.modules.lean_ffn import LeanDropout

    drop = LeanDropout(0.25)
    x = torch.randn(64, 32, requires_grad=True)
    y, saved = _saved_bytes(lambda: drop(x))
    assert {dt for _, dt in saved.values()} == {torch.bool}  # no float mask kept
    kept = y != 0
    assert torch.allclose(y[kept], x[kept] / 0.75) and 0.6 < kept.float().mean() < 0.9
    drop.eval()
    assert torch.equal(drop(x), x)
    drop.train()
    with torch.no_grad():
        assert 0.6 < (drop(x) != 0).float().mean() < 0.9
