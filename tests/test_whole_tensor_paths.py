"""The whole-tensor paths (what a GPU runs; ``lsg_layers.modules.paths``), forced on CPU.

- values and gradients against the slow references (S4D here and, with LSG/LED, through the
  ``layer_path`` fixture of their reference tests, and every conformance fixture on both paths);
- launches: the aten ops one layer issues (torch's dispatch mode) do not grow with the length and
  stay under a bound (the CPU paths issue thousands: they cut the work into cache-sized pieces);
- no host-device synchronisation: each path runs forward and backward on ``meta`` tensors, which
  have no data, so any ``.item()``, ``.tolist()``, ``.cpu()``, ``bool(tensor)`` or data-dependent
  shape (``nonzero``, boolean indexing) raises there.
"""

import pytest
import torch
import torch.nn as nn

from conftest import TOY_LSG, build_task_and_model, load_script, toy_batch, write_toy_dict
from lsg_layers.modules import s4d as s4d_module
from lsg_layers.modules import s4d_cache, s4d_kernel
from lsg_layers.modules.longformer_attention import LongformerSelfAttention
from lsg_layers.modules.lsg_attention import LSGSelfAttention
from lsg_layers.modules.lsg_config import SPARSITY_TYPES
from lsg_layers.modules.paths import PathChoice, forced_path
from lsg_layers.modules.s4d import S4D
from lsg_layers.ops.ssm import next_fast_len
from test_s4d import _direct_conv, _masked_batch, _perturbed_layer, _recurrent

# ------------------------------------------------------------------------------ S4D values and gradients


def _whole(layer):
    layer.path = "whole"
    return layer


@pytest.mark.parametrize("length", [1, 5, 16, 37, 100])
def test_s4d_whole_path_equals_direct_conv_and_recurrence(length):
    layer = _whole(_perturbed_layer(H=8, N=8)).eval()
    u, mask = _masked_batch(8, length, (length + 1) // 2)
    with torch.no_grad():
        fast = layer(u, mask)
        direct = _direct_conv(layer, u, mask)
        rec = _recurrent(layer, u, mask)
    keep = ~mask[..., None]
    assert torch.allclose(fast * keep, direct * keep, atol=2e-5), (fast - direct).abs().max()
    assert torch.allclose(fast * keep, rec * keep, atol=2e-5), (fast - rec).abs().max()


def test_s4d_whole_path_equals_cpu_path_cached_cold_and_in_chunks(monkeypatch):
    layer = _perturbed_layer(H=8, N=8).eval()
    u, mask = _masked_batch(8, 60, 41)
    with torch.no_grad():
        cpu = layer(u, mask)
        _whole(layer)
        cached = layer(u, mask)
        assert list(layer._spectra) == [120] and layer.cached_kernel_bytes() == 8 * 61 * 8  # (H F/2+1) complex64
        shorter = layer(u[:, :33], mask[:, :33])  # another FFT size (72): another spectrum
        layer.kernel_cache_mb = 0
        layer.clear_kernel_cache()
        cold = layer(u, mask)
        assert layer.cached_kernel_bytes() == 0
        monkeypatch.setattr(s4d_module, "WHOLE_FFT_ELEMS", 2 * 120 * 3)  # 3 channels per FFT chunk
        monkeypatch.setattr(s4d_kernel, "WHOLE_KERNEL_ELEMS", 1)  # one channel per kernel product
        chunked = layer(u, mask)
    keep = ~mask[..., None]
    for other in (cached, cold, chunked):
        assert torch.allclose(cpu * keep, other * keep, atol=1e-5), (cpu - other).abs().max()
    with torch.no_grad():
        layer.path = "cpu"
        assert torch.allclose(shorter, layer(u[:, :33], mask[:, :33]), atol=1e-5)


def _channel_major_against_transposed(layer, u, mask, F, autocast):
    with torch.no_grad(), torch.autocast("cpu", dtype=autocast or torch.bfloat16, enabled=autocast is not None):
        assert layer._plain_projections()
        fast = layer(u, mask)
        reference = layer._whole_transposed(u, mask, F)  # projections in (B, L, H)
        hook = layer.q_proj.register_forward_pre_hook(lambda module, args: None)
        fallback = layer(u, mask)  # the layer's own transposed form (a hooked projection takes it)
        hook.remove()
    assert torch.equal(fallback, reference)
    assert fast.dtype == reference.dtype and fast.shape == u.shape
    assert torch.isfinite(fast).all()
    # every position, padding included: k is zero there, the gate and the convolution are not
    return ((fast - reference).float().abs().max() / reference.float().abs().max()).item()


@pytest.mark.parametrize(
    "dtype, autocast",
    [
        (torch.float32, None),
        (torch.bfloat16, None),
        (torch.float32, torch.bfloat16),
        (torch.float16, None),
        (torch.float32, torch.float16),
        (torch.bfloat16, torch.float16),
        (torch.float64, torch.bfloat16),
    ],
    ids=["fp32", "bf16", "bf16_autocast", "fp16", "fp16_autocast", "bf16_under_fp16_autocast", "fp64_autocast"],
)
@pytest.mark.parametrize("chunks", [1, 3], ids=["one_chunk", "three_chunks"])
def test_s4d_channel_major_equals_the_transposed_form(dtype, autocast, chunks, monkeypatch):
    """The GPU's no-grad S4D call (projections writing k^T and q^T, no transposing copy) against
    the transposed form it replaced, the same function in another layout: float32 to 1e-6, half
    precision to its rounding; padding, a batch of two, the channels in one FFT chunk and in three.
    A bfloat16 model under float16 autocast stores its gated product in float16 (as its matmuls
    run); float64 under autocast stays float64 (autocast leaves it alone)."""
    layer = _whole(_perturbed_layer(H=9, N=8)).eval()
    u, mask = _masked_batch(9, 50, 31)
    F = next_fast_len(100)
    monkeypatch.setattr(s4d_module, "WHOLE_FFT_ELEMS", 2 * F * (9 // chunks))
    fp16 = torch.float16 in (dtype, autocast)
    if fp16:  # gated products past float16's range, clamped by both forms (within_fp16)
        u = u * 3000
        with torch.no_grad():
            layer.output_linear.weight.mul_(1e-3)  # the projection of the clamped values stays finite
    layer, u = layer.to(dtype), u.to(dtype)
    diff = _channel_major_against_transposed(layer, u, mask, F, autocast)
    exact = (dtype == torch.float32 and autocast is None) or dtype == torch.float64
    assert diff <= (1e-6 if exact else 2e-2), diff
    if fp16:  # without the clamp the same call overflows: the clamp was exercised
        monkeypatch.setattr(s4d_module, "within_fp16", lambda x: x)
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.float16, enabled=autocast is not None):
            assert not torch.isfinite(layer(u, mask)).all()


@pytest.mark.parametrize("autocast", [None, torch.bfloat16], ids=["fp32", "bf16_autocast"])
def test_s4d_channel_major_takes_inputs_that_are_not_contiguous(autocast):
    """u stored time-first (a transpose of a (L, B, H) tensor, as fairseq's encoders hold it): the
    call reads it through a view, and agrees with the transposed form."""
    layer = _whole(_perturbed_layer(H=9, N=8)).eval()
    u, mask = _masked_batch(9, 50, 31)
    u = u.transpose(0, 1).contiguous().transpose(0, 1)
    assert not u.is_contiguous()
    diff = _channel_major_against_transposed(layer, u, mask, next_fast_len(100), autocast)
    assert diff <= (1e-6 if autocast is None else 2e-2), diff


@pytest.mark.parametrize("kind", ["subclass", "forward_hook", "pre_hook"])
def test_s4d_whole_path_keeps_the_transposed_form_for_other_projections(kind):
    """A projection whose forward is not nn.Linear's (a quantized or wrapped one, or a hook on a
    plain one) is called as a module: the channel-major call, which reads the weights, is not taken."""

    class Scaled(nn.Linear):  # e.g. a quantized or wrapped projection: only its forward is known
        def forward(self, x):
            return 2 * super().forward(x)

    layer = _whole(_perturbed_layer(H=8, N=8)).eval()
    u, mask = _masked_batch(8, 40, 25)
    with torch.no_grad():
        plain = layer(u, mask)
        if kind == "subclass":
            wrapped = Scaled(8, 8)
            wrapped.load_state_dict(layer.q_proj.state_dict())
            layer.q_proj = wrapped
        elif kind == "forward_hook":
            layer.q_proj.register_forward_hook(lambda module, args, out: 2 * out)
        else:
            layer.q_proj.register_forward_pre_hook(lambda module, args: None)  # sees the call: no change
        assert not layer._plain_projections()
        changed = layer(u, mask)
    keep = ~mask[..., None]
    bias = layer.output_linear.bias
    factor = 1 if kind == "pre_hook" else 2  # the gate is linear in q: twice the gate, twice k's convolution
    assert torch.allclose((changed - bias) * keep, factor * (plain - bias) * keep, atol=1e-5)


@pytest.mark.parametrize("kind", ["forward_hook", "pre_hook"])
def test_s4d_whole_path_calls_its_projections_under_a_global_hook(kind):
    """A global module hook (``register_module_forward_hook``, as activation loggers install) sees
    every module's call, so the channel-major call, which would skip the projections', is not taken."""
    module_api = nn.modules.module
    register = {
        "forward_hook": module_api.register_module_forward_hook,
        "pre_hook": module_api.register_module_forward_pre_hook,
    }[kind]
    layer = _whole(_perturbed_layer(H=8, N=8)).eval()
    u, mask = _masked_batch(8, 40, 25)
    seen = []
    handle = register(lambda module, *args: seen.append(module))
    try:
        assert not layer._plain_projections()
        with torch.no_grad():
            layer(u, mask)
    finally:
        handle.remove()
    assert layer._plain_projections()
    projections = [layer.k_proj, layer.q_proj, layer.output_linear]
    assert all(any(m is p for m in seen) for p in projections)


def test_kernel_spectra_cache_by_fft_size_least_recently_used_out():
    """Lengths that share an FFT size share one spectrum, lengths across sizes get their own, the
    budget evicts the least recently used one, and every output equals the uncached layer's and
    the dense reference's; a change of D (folded into the spectra) or of a kernel parameter
    invalidates them."""
    from test_s4d import _dense_reference

    cached = _whole(_perturbed_layer(H=6, N=8)).eval()
    plain = _whole(_perturbed_layer(H=6, N=8, kernel_cache_mb=0)).eval()
    one = 6 * (next_fast_len(2 * 40) // 2 + 1) * 8  # bytes of the spectrum for 40 tokens (F = 80)
    cached.kernel_cache_mb = 2.5 * one / 2**20  # room for two spectra of about that size
    lengths = [40, 39, 33, 40, 50, 25]  # F: 80, 80, 72, 80, 100, 50
    with torch.no_grad():
        for length in lengths:
            u, mask = _masked_batch(6, length, length - 7)
            out = cached(u, mask)
            keep = ~mask[..., None]
            assert torch.allclose(out * keep, plain(u, mask) * keep, atol=1e-5)
            assert torch.allclose(out * keep, _dense_reference(cached, u, mask) * keep, atol=1e-5)
            assert cached.cached_kernel_bytes() <= 2.5 * one
        # 80 was used after 72, then 100 evicted 72, then 50 evicted the least recent of 80 and 100
        assert list(cached._spectra) == [100, 50]
        spectrum = cached._spectra[50]
        u, mask = _masked_batch(6, 25, 20)
        assert torch.equal(cached(u, mask), cached(u, mask)) and cached._spectra[50] is spectrum  # a hit
        cached.D.add_(1.0)
        plain.D.add_(1.0)
        moved = cached(u, mask)
        assert cached._spectra[50] is not spectrum and torch.allclose(moved, plain(u, mask), atol=1e-5)
        cached.kernel.log_dt.add_(0.1)
        plain.kernel.log_dt.add_(0.1)
        assert torch.allclose(cached(u, mask), plain(u, mask), atol=1e-5)


def test_spectra_budget_follows_the_device():
    layer = S4D(4, 8).eval()
    assert layer.kernel_cache_mb is None  # the arch default: sized for the device
    with torch.no_grad():
        assert layer.cache_budget(torch.device("cpu")) == s4d_cache.KERNEL_CACHE_MB * 2**20
        assert layer.cache_budget(torch.device("meta")) == s4d_cache.GPU_KERNEL_CACHE_MB * 2**20
        layer.kernel_cache_mb = 7.0  # --ssm-kernel-cache-mb overrides on every device
        assert layer.cache_budget(torch.device("meta")) == 7 * 2**20
    assert layer.cache_budget(torch.device("cpu")) == 0  # autograd on: no cache
    # 64K tokens of a base layer fit the GPU default
    assert 768 * (next_fast_len(2 * 65536) // 2 + 1) * 8 <= s4d_cache.GPU_KERNEL_CACHE_MB * 2**20


def test_whole_kernels_equal_the_naive_formula(monkeypatch):
    kernel = _perturbed_layer(H=6, N=8).kernel
    for elems in (s4d_kernel.WHOLE_KERNEL_ELEMS, 1):  # one product, then one channel at a time
        monkeypatch.setattr(s4d_kernel, "WHOLE_KERNEL_ELEMS", elems)
        with torch.no_grad():
            whole = kernel(50, whole=True)
        assert torch.allclose(whole, kernel.reference(50), atol=1e-5), (whole - kernel.reference(50)).abs().max()


# ------------------------------------------------------------------------------ whole models, both paths
TINY = {"lsg_bart_tiny": TOY_LSG, "led_tiny": ["--attention-window", "8", "--global-token-ids", "7"], "locost_tiny": []}


@pytest.mark.parametrize("arch", sorted(TINY))
def test_models_give_the_same_outputs_and_gradients_on_both_paths(arch, tmp_path):
    """Encoder output, logits and every parameter's gradient of a tiny model, CPU paths vs the
    whole-tensor ones (padding in the batch; LED with a global token id, i.e. the synchronising
    global selection, and LSG with sparse tokens)."""
    data = write_toy_dict(tmp_path)
    task, model = build_task_and_model(
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
        + TINY[arch]
    )
    src, lengths, prev = toy_batch(L=45, lengths=(45, 30))
    results = {}
    for path in ("cpu", "whole"):
        with forced_path(model, path):
            model.eval()
            with torch.no_grad():
                out = model.encoder(src, src_lengths=lengths)
            pad = out["encoder_padding_mask"][0].t()[..., None] if out["encoder_padding_mask"] else None
            enc = out["encoder_out"][0] if pad is None else out["encoder_out"][0].masked_fill(pad, 0)
            model.train()
            model.zero_grad()
            logits = model(src, lengths, prev)[0]
            logits.float().logsumexp(-1).sum().backward()
            results[path] = [enc, logits.detach()] + [p.grad.clone() for p in model.parameters() if p.grad is not None]
    assert len(results["cpu"]) == len(results["whole"]) > 10
    for a, b in zip(results["cpu"], results["whole"]):  # (encoder outputs at padding are unspecified)
        assert torch.allclose(a, b, rtol=1e-4, atol=1e-5), (a - b).abs().max()
    assert all(m.__dict__.get("path") is None for m in model.modules() if isinstance(m, PathChoice))


@pytest.mark.parametrize("windows,plans", [("8", 1), ("8,16", 2)])
def test_led_encoder_builds_one_whole_plan_per_window_and_forward(windows, plans, tmp_path, monkeypatch):
    """The whole path's key index and mask are built once per encoder forward for the layers of one
    window (each layer rebuilt them), one per window when the layers' windows differ; the encoder
    output equals the CPU path's."""
    data = write_toy_dict(tmp_path)
    args = [data, "--task", "long_document_summarization", "--arch", "led_tiny", "--max-source-positions", "64"]
    _, model = build_task_and_model(args + ["--dropout", "0", "--attention-window", windows, "--global-token-ids", "7"])
    built = []
    original = LongformerSelfAttention._whole_plan
    monkeypatch.setattr(LongformerSelfAttention, "_whole_plan", lambda *a: built.append(1) or original(*a))
    src, lengths, _ = toy_batch(L=45, lengths=(45, 30))
    model.eval()
    outs = {}
    for path in ("cpu", "whole"):
        with forced_path(model, path), torch.no_grad():
            out = model.encoder(src, src_lengths=lengths)
        outs[path] = out["encoder_out"][0].masked_fill(out["encoder_padding_mask"][0].t()[..., None], 0)
    assert len(model.encoder.layers) == 2 and len(built) == plans
    assert torch.allclose(outs["cpu"], outs["whole"], atol=1e-5), (outs["cpu"] - outs["whole"]).abs().max()
    with forced_path(model, "whole"), torch.no_grad():
        model.encoder(src, src_lengths=lengths)
    assert len(built) == 2 * plans  # a new forward (its own padding and globals): its own plans


def test_forced_path_restores_what_was_set():
    model = nn.Sequential(S4D(4, 4), S4D(4, 4))
    model[1].path = "cpu"
    with forced_path(model, "whole"):
        assert [m.path for m in model] == ["whole", "whole"]
    assert model[0].path == "auto" and model[1].path == "cpu"
    with pytest.raises(ValueError, match="path must be one of"):
        with forced_path(model, "gpu"):
            pass


# ------------------------------------------------------------------------------ launches
# the counter of benchmarks/op_count.py: dispatcher ops by name, and those that launch a kernel
OpCounter = load_script("benchmarks/op_count.py", "op_count").OpCounter


def _launches(run, layer, length, device, grad):
    """Ops (non-view) of one call of ``layer`` on a ``length``-token input, forward (+ backward)."""
    layer.train(grad)
    torch.manual_seed(0)
    x = run.make_input(length, device)
    with OpCounter() as counter, torch.set_grad_enabled(grad):
        out = run.call(layer, x)
        if grad:
            out.float().sum().backward()
    return counter.launches


class S4DRun:
    """A locost_base SSM layer (H 768, N 512). Counted on ``meta`` tensors: the same dispatcher ops
    as on CPU (FFTs and GEMMs are leaf ops on every device; checked at 1K below) without generating
    ~2 GiB of base-size kernel temporaries on a CI machine."""

    device = "meta"
    # forward: projections (3 GEMMs), discretisation and one blocked Vandermonde product (~40),
    # the circular kernel and 3 FFTs (~15), gate; backward about as many again (the product's
    # gradients written out, ~55: ops.ssm.BlockedVandermonde; autograd after a recompute took ~130)
    bound = {False: 90, True: 220}

    @staticmethod
    def make(device):
        return _whole(S4D(768, 512)).to(device)

    @staticmethod
    def make_input(length, device):
        return torch.randn(1, length, 768, device=device, requires_grad=True)

    @staticmethod
    def call(layer, x):
        return layer(x, torch.zeros(x.shape[:2], dtype=torch.bool, device=x.device))


class LSGRun:
    """An lsg_bart_base attention layer (block 128, sparse block 128, factor 4, norm, 1 global)."""

    device = "cpu"
    # projections (4 GEMMs), the norm selection and its gather (~15), global rows' attention, the
    # block gathers and one SDPA, masks (~20); backward about twice that
    bound = {False: 80, True: 240}

    @staticmethod
    def make(device):
        return _whole(
            LSGSelfAttention(64, 4, block_size=128, sparse_block_size=128, sparsity_factor=4, sparsity_type="norm")
        ).to(device)

    @staticmethod
    def make_input(length, device):
        return torch.randn(length + 1, 1, 64, device=device, requires_grad=True)

    @staticmethod
    def call(layer, x):
        return layer(x, key_padding_mask=torch.zeros(x.shape[1], x.shape[0], dtype=torch.bool))[0]


class LEDRun:
    """An led_base attention layer (window 1,024, first token global, as the LED encoder passes it)."""

    device = "cpu"
    # projections (7 GEMMs), band and global masks (~25), one gather and one SDPA for the local
    # rows, the global rows' softmax and their write-back; backward about twice that
    bound = {False: 90, True: 260}

    @staticmethod
    def make(device):
        return _whole(LongformerSelfAttention(64, 4, 1024)).to(device)

    @staticmethod
    def make_input(length, device):
        return torch.randn(length, 1, 64, device=device, requires_grad=True)

    @staticmethod
    def call(layer, x):
        first = (torch.zeros(1, 1, dtype=torch.long), torch.ones(1, 1, dtype=torch.bool))
        return layer(x, key_padding_mask=torch.zeros(1, x.shape[0], dtype=torch.bool), global_index=first)[0]


# what an LED layer issues to know the batch: its padding, its global positions and where their
# rows go (the plan's work: WholePlan)
LED_BATCH_OPS = {"ones", "bitwise_not", "full_like", "zeros", "scatter_", "where", "arange"}


@pytest.mark.parametrize("T", [4096, 4000], ids=["whole_blocks", "padded"])
def test_led_later_layers_issue_nothing_for_the_batch(T):
    """With the encoder's per-forward dict, the first LED layer builds the plan and a later layer
    issues only its own work (projections, one gather each for keys and values, one SDPA, the
    global rows' products and write-back): ~23 launches instead of ~36 when each layer found the
    batch's padding and globals again, and ~80 ops in all (the global rows' products as batched
    matrix products, not einsums: ~100 before). On a GPU at batch 1 every op is host time."""
    layer = LEDRun.make("cpu").eval()
    x = LEDRun.make_input(T, "cpu").detach()
    kw = dict(
        key_padding_mask=torch.zeros(1, T, dtype=torch.bool),
        global_index=(torch.zeros(1, 1, dtype=torch.long), torch.ones(1, 1, dtype=torch.bool)),
        block_masks={},
    )
    with torch.no_grad():
        with OpCounter() as first:
            reference = layer(x, **kw)[0]
        with OpCounter() as later:
            out = layer(x, **kw)[0]
    assert LED_BATCH_OPS & set(first.ops), "the first layer builds the plan"
    assert not LED_BATCH_OPS & set(later.ops), {op: later.ops[op] for op in LED_BATCH_OPS & set(later.ops)}
    # one pad, of the layer's input to whole blocks, where T needs it (the first also pads the masks)
    assert later.ops["constant_pad_nd"] == int(T % layer.block_size > 0)
    assert later.launches <= 24 and sum(later.ops.values()) <= 82, later.ops
    assert torch.equal(out, reference)


@pytest.mark.parametrize("grad", [False, True], ids=["no_grad", "fwd_bwd"])
@pytest.mark.parametrize("run", [S4DRun, LSGRun, LEDRun], ids=["s4d", "lsg", "led"])
def test_launches_do_not_grow_with_length(run, grad):
    """Attention layers are counted at width 64: no op of theirs depends on the width, only on the
    block structure, which is the base models' (block 128 / window 1,024) at 4K and 16K tokens."""
    counts = [_launches(run, run.make(run.device), length, run.device, grad) for length in (4096, 16384)]
    assert counts[1] <= counts[0], f"launches grow with the length: {counts}"
    assert counts[0] <= run.bound[grad], f"{counts[0]} launches > bound {run.bound[grad]}"


def test_meta_counts_equal_cpu_counts_for_s4d():
    """The S4D count above runs on meta tensors: the same ops as on CPU (here at 1K tokens)."""
    for grad in (False, True):
        counts = [_launches(S4DRun, S4DRun.make(device), 1024, device, grad) for device in ("cpu", "meta")]
        assert counts[0] == counts[1], counts


def test_cpu_paths_launch_many_more_ops():
    """What the whole-tensor paths are for: the CPU path of the same S4D layer at 4K issues
    thousands of ops (decay groups x channel chunks x tiles)."""
    layer = S4D(768, 512)
    layer.path = "cpu"
    cpu = _launches(S4DRun, layer, 4096, "cpu", grad=False)
    assert cpu > 20 * S4DRun.bound[False], cpu


# ------------------------------------------------------------------------------ no host-device sync
def _runs_on_meta(layer, x, **kwargs):
    out = layer(x, **kwargs)
    out = out[0] if isinstance(out, tuple) else out
    out.float().sum().backward()
    return out


@pytest.mark.parametrize("training", [False, True])
def test_s4d_whole_path_never_reads_device_values(training):
    layer = _whole(S4D(64, 16)).to("meta").train(training)
    x = torch.randn(2, 300, 64, device="meta", requires_grad=True)
    with torch.set_grad_enabled(True):
        _runs_on_meta(layer, x, padding_mask=torch.zeros(2, 300, dtype=torch.bool, device="meta"))
    layer.eval()
    with torch.no_grad():  # the no-grad convolution and the kernel cache
        assert layer(x, torch.zeros(2, 300, dtype=torch.bool, device="meta")).shape == (2, 300, 64)


@pytest.mark.parametrize("stype", SPARSITY_TYPES)
def test_lsg_whole_path_never_reads_device_values(stype):
    layer = (
        _whole(
            LSGSelfAttention(
                64, 4, num_global_tokens=2, block_size=16, sparse_block_size=16, sparsity_factor=4, sparsity_type=stype
            )
        )
        .to("meta")
        .train()
    )
    x = torch.randn(2 + 200, 2, 64, device="meta", requires_grad=True)
    _runs_on_meta(layer, x, key_padding_mask=torch.zeros(2, 202, dtype=torch.bool, device="meta"))


@pytest.mark.parametrize("globals_per_row", [0, 1, 3])
def test_led_whole_path_never_reads_device_values(globals_per_row):
    layer = _whole(LongformerSelfAttention(64, 4, 32)).to("meta").train()
    x = torch.randn(300, 2, 64, device="meta", requires_grad=True)
    index = None
    if globals_per_row:
        index = (
            torch.zeros(2, globals_per_row, dtype=torch.long, device="meta"),
            torch.ones(2, globals_per_row, dtype=torch.bool, device="meta"),
        )
    _runs_on_meta(layer, x, key_padding_mask=torch.zeros(2, 300, dtype=torch.bool, device="meta"), global_index=index)


def test_led_encoder_finds_the_first_token_on_the_device(tmp_path):
    """The LED encoder's default global selection (first real token) reads nothing on the host."""
    data = write_toy_dict(tmp_path)
    _, model = build_task_and_model(
        [
            data,
            "--task",
            "long_document_summarization",
            "--arch",
            "led_tiny",
            "--max-source-positions",
            "64",
            "--attention-window",
            "8",
        ]
    )
    src = torch.full((2, 40), 5, dtype=torch.long, device="meta")
    pad = torch.zeros(2, 40, dtype=torch.bool, device="meta")
    idx, valid = model.encoder.global_index(src, pad)
    assert idx.shape == valid.shape == (2, 1)


def test_meta_tensors_catch_every_kind_of_sync():
    """What the tests above rely on: each way of reading a device value fails on meta."""
    x = torch.randn(4, device="meta")
    for read in (
        lambda: x.sum().item(),
        lambda: bool(x.any()),
        lambda: x.tolist(),
        lambda: x.cpu(),
        lambda: x[x > 0],
        lambda: int(x.max()),
    ):
        with pytest.raises((RuntimeError, NotImplementedError)):
            read()


def test_fused_generator_matches_the_naive_formula_and_the_eager_layer():
    """--ssm-kernel-compile: the compiled generator (ops.ssm.fused_circular_kernel) against the
    naive formula in float64 (the eager generator's bound, 1e-5) and, in a layer on the
    whole-tensor path, outputs and gradients equal to the eager generator's."""
    from lsg_layers.ops.ssm import circular_bidirectional_kernel, fused_circular_kernel, vandermonde_naive

    eager = _whole(_perturbed_layer(H=6, N=8)).train()
    fused = _whole(_perturbed_layer(H=6, N=8)).train()
    fused.kernel_compile = True
    c_prime, dt_a = eager.kernel.discretize()
    with torch.no_grad():
        naive = circular_bidirectional_kernel(
            vandermonde_naive(c_prime.to(torch.complex128), dt_a.to(torch.complex128), 50), 100, eager.D.double()
        )
        got = fused_circular_kernel()(c_prime, dt_a, 50, 100, eager.D.float())
    assert got.dtype == torch.float32 and (got.double() - naive).abs().max() < 1e-5
    u, mask = _masked_batch(6, 50, 41)
    outs = [layer(u, mask) for layer in (eager, fused)]
    grads = [torch.autograd.grad(out.sum(), [layer.kernel.C, layer.D]) for out, layer in zip(outs, (eager, fused))]
    assert torch.allclose(outs[0], outs[1], atol=1e-5)
    for a, b in zip(*grads):
        assert torch.allclose(a, b, atol=1e-4, rtol=1e-4)


def test_fused_generator_sees_few_shapes_across_lengths(monkeypatch):
    """Training at 32 different lengths asks the compiled generator for 4 shapes (one per FFT size
    of ops.ssm.compiled_fft_len, kernels of the longest length each size serves), with outputs and
    gradients equal to the eager generator's at every length. (The eager function stands in for the
    compiled one, tested above: what is checked is what the layer asks of it.)"""
    from lsg_layers.ops.ssm import blocked_circular_kernel, compiled_fft_len

    shapes = set()

    def spy(c_prime, dt_a, length, fft_size, *rest):
        shapes.add((length, fft_size))
        return blocked_circular_kernel(c_prime, dt_a, length, fft_size, *rest)

    monkeypatch.setattr(s4d_kernel, "fused_circular_kernel", lambda: spy)
    eager = _whole(_perturbed_layer(H=6, N=8)).train()
    fused = _whole(_perturbed_layer(H=6, N=8)).train()
    fused.kernel_compile = True
    for L in range(33, 65):
        u, mask = _masked_batch(6, L, L - 7)
        outs = [layer(u, mask) for layer in (eager, fused)]
        if L % 8 == 1:  # gradients at a few lengths
            grads = [torch.autograd.grad(o.sum(), [m.kernel.C, m.D]) for o, m in zip(outs, (eager, fused))]
            for a, b in zip(*grads):
                assert torch.allclose(a, b, atol=1e-4, rtol=1e-4), L
        assert torch.allclose(outs[0], outs[1], atol=1e-5), L
    sizes = {compiled_fft_len(2 * L) for L in range(33, 65)}
    assert shapes == {((f + 1) // 2, f) for f in sizes} and len(shapes) == 4


def test_tf32_rounding_keeps_ten_mantissa_bits_to_nearest():
    """ops.ssm.round_to_tf32, the CPU's stand-in for a GPU's TF32 operands: 10 explicit bits, to
    nearest, ties away from zero; exact values unchanged."""
    from lsg_layers.ops.ssm import round_to_tf32

    ulp = 2.0**-10
    x = torch.tensor([1.0, 1 + ulp, 1 + ulp / 2, 1 + ulp / 4, 1 + 3 * ulp / 4, -(1 + ulp / 2), 3.0e-3, 0.0])
    want = torch.tensor([1.0, 1 + ulp, 1 + ulp, 1.0, 1 + ulp, -(1 + ulp)])
    got = round_to_tf32(x)
    assert torch.equal(got[:6], want[:6]) and got[7] == 0
    assert abs(float(got[6]) / 3.0e-3 - 1) <= 2.0**-11  # within half a TF32 ulp
    r = torch.randn(10_000)
    bits = round_to_tf32(r).view(torch.int32)
    assert torch.equal(bits & 0x1FFF, torch.zeros_like(bits))  # the 13 dropped bits are zero
    assert ((round_to_tf32(r) - r).abs() <= r.abs() * 2.0**-11).all()


@pytest.mark.parametrize("mode", ["fp32", "tf32", "bf16"])
def test_generator_product_modes_within_their_bounds(mode):
    """The fused generator's product modes (ops.ssm.PRODUCT_MODES) against the naive formula in
    float64, relative to the kernel's largest entry, on perturbed layers of several sizes: within
    the mode's stated bound (ops.ssm.PRODUCT_BOUNDS), and the reduced modes measurably coarser than
    float32 (so the mode is really applied)."""
    from lsg_layers.ops.ssm import PRODUCT_BOUNDS, vandermonde_blocked, vandermonde_naive

    worst = 0.0
    for seed, (H, N, L) in enumerate([(16, 64, 1000), (8, 512, 4096), (32, 64, 3000)]):
        torch.manual_seed(seed)
        layer = _perturbed_layer(H=H, N=N)
        with torch.no_grad():
            c_prime, dt_a = layer.kernel.discretize()
            exact = vandermonde_naive(c_prime.to(torch.complex128), dt_a.to(torch.complex128), L)
            got = vandermonde_blocked(c_prime, dt_a, L, product=mode)
        assert got.dtype == torch.float32
        worst = max(worst, float((got.double() - exact).abs().max() / exact.abs().max()))
    assert worst <= PRODUCT_BOUNDS[mode]
    if mode != "fp32":
        assert worst > 10 * PRODUCT_BOUNDS["fp32"]


def test_layer_uses_the_product_mode_only_when_training_in_half_precision(monkeypatch):
    """--ssm-kernel-product reaches the generator when the activations are half precision (bf16
    autocast here) and autograd is on, in the forward and in the backward's recomputation; float32
    training uses fp32. (The compiled generator is the eager function, tested above; here the eager
    function stands in for it.) The bf16 mode's layer output stays close to the fp32 mode's."""
    from lsg_layers.ops.ssm import blocked_circular_kernel

    seen = []

    def spy(*args):
        seen.append(args[-1])
        return blocked_circular_kernel(*args)

    monkeypatch.setattr(s4d_kernel, "fused_circular_kernel", lambda: spy)
    u, mask = _masked_batch(6, 50, 41)
    outs = {}
    for product in ("fp32", "bf16"):
        torch.manual_seed(0)
        layer = _whole(_perturbed_layer(H=6, N=8)).train()
        layer.kernel_compile, layer.kernel_product = True, product
        seen.clear()
        layer(u, mask).sum().backward()  # float32 activations
        assert seen and set(seen) == {"fp32"}
        seen.clear()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = layer(u, mask)
        out.float().sum().backward()
        assert len(seen) == (2 if layer.kernel.recompute else 1) and set(seen) == {product}
        outs[product] = out.float()
    assert (outs["bf16"] - outs["fp32"]).abs().max() <= 0.05 * outs["fp32"].abs().max()
