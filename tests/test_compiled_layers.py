"""lsg_fairseq.models.compiled_layers: the encoder layers compiled are the same function as eager,
whole graphs (no graph break), and the same parameters and state dict."""

import sys

import pytest
import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from conftest import build_task_and_model, needs_compiled_layers, toy_batch, write_toy_dict

from lsg_fairseq.models.compiled_layers import compile_encoder_layers
from lsg_layers.modules.paths import forced_path
from lsg_layers.torch_version import at_least

pytestmark = [pytest.mark.usefixtures("single_thread"), needs_compiled_layers()]  # conftest: tiny tensors, one thread

ARCH_FLAGS = {
    "lsg_bart_tiny": ["--block-size", "8", "--sparse-block-size", "8", "--sparsity-factor", "2"],
    "led_tiny": ["--attention-window", "8"],
    "bart_tiny": [],
}


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    return write_toy_dict(tmp_path_factory.mktemp("compiled_data"))


def build(data_dir, arch, *flags):
    argv = [data_dir, "--task", "long_document_summarization", "--arch", arch, "--dropout", "0"]
    argv += ["--encoder-embed-dim", "32", "--encoder-ffn-embed-dim", "64", "--encoder-attention-heads", "2"]
    argv += ["--max-source-positions", "512", "--max-target-positions", "64"] + ARCH_FLAGS[arch] + list(flags)
    return build_task_and_model(argv)[1]


def step(model, src, lengths, prev):
    """(decoder output, {name: gradient}) of one training step."""
    out, _ = model(src, lengths, prev)
    out.square().mean().backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    return out.detach(), grads


def compiled_against_eager(model, backend, steps=2):
    """(eager step, compiled steps) of ``model`` on a padded batch of two, whole-tensor path with the
    gathers' fan-in backward (the forms a GPU takes), and the graph breaks dynamo counted."""
    from torch._dynamo.utils import counters

    for m in model.modules():
        if hasattr(m, "fan_in_backward"):
            m.fan_in_backward = True  # ops.fan_in, as off the CPU
    src, lengths, prev = toy_batch(L=60, lengths=(60, 41))
    with forced_path(model, "whole"):
        eager = step(model, src, lengths, prev)
        torch._dynamo.reset()  # no graph of an earlier test in this process (dynamic ones broke a trace)
        counters.clear()
        assert compile_encoder_layers(model, backend=backend) == len(model.encoder.layers)
        compiled = [step(model, src, lengths, prev) for _ in range(steps)]  # the first one compiles
    return eager, compiled, dict(counters["graph_break"])


def assert_same_step(eager, compiled, atol, grad_atol, rtol=0.0):
    out, grads = compiled
    assert torch.allclose(out, eager[0], rtol=rtol, atol=atol), (out - eager[0]).abs().max()
    assert grads.keys() == eager[1].keys()
    for name, g in grads.items():
        assert torch.allclose(g, eager[1][name], rtol=rtol, atol=grad_atol), (name, (g - eager[1][name]).abs().max())


@pytest.mark.parametrize("arch", sorted(ARCH_FLAGS))
def test_compiled_layers_trace_whole_and_train_as_the_eager_ones(arch, data_dir):
    """The graphs dynamo captures (forward, and the backward AOTAutograd derives, with
    --lean-activations' attention recompute), run by eager kernels (``aot_eager``): every layer one
    graph, no break (LSG's and LED's caches are written inside the checkpointed attention), and
    the same outputs and gradients as eager to float64 rounding; the state dict untouched."""
    model = build(data_dir, arch).double().train()
    assert all(getattr(layer, "lean", True) for layer in model.encoder.layers)
    keys = list(model.state_dict())
    eager, compiled, breaks = compiled_against_eager(model, "aot_eager")
    assert not breaks, breaks
    assert list(model.state_dict()) == keys
    for one in compiled:
        assert_same_step(eager, one, atol=1e-10, grad_atol=1e-9)


def test_inductor_compiled_layers_train_as_the_eager_ones(data_dir):
    """The backend a GPU runs, its kernels generated (here C++ for the CPU), in float32: equal to
    float32 rounding. (In float64 they differ by ~4e-7: fairseq's gelu rounds through float32,
    ``F.gelu(x.float()).type_as(x)``, a round trip the generated code leaves out.)"""
    model = build(data_dir, "lsg_bart_tiny").train()
    eager, compiled, breaks = compiled_against_eager(model, "inductor", steps=1)
    assert not breaks, breaks
    assert_same_step(eager, compiled[0], atol=1e-5, grad_atol=1e-6, rtol=1e-4)


def test_compiled_layers_in_eval_as_the_eager_ones(data_dir):
    model = build(data_dir, "led_tiny").double().eval()
    src, lengths, _ = toy_batch(L=60, lengths=(60, 41))
    with torch.no_grad(), forced_path(model, "whole"):
        eager = model.encoder(src, src_lengths=lengths)["encoder_out"][0]
        compile_encoder_layers(model, backend="aot_eager")
        compiled = model.encoder(src, src_lengths=lengths)["encoder_out"][0]
    assert torch.allclose(compiled, eager, atol=1e-10)


# Seen on Python 3.13.0 with torch 2.11.0, not with torch 2.13.0 there, nor on 3.11.7 or 3.12.1
# (scripts/torch_versions_py313.md): LSG's layers compile [2, 2, 4, 4] graphs after calls 1-4,
# dynamo's guard that its block tables are not cached passing once after they are. torch warns
# about its guards on 3.13.0 (a CPython dict-watcher bug fixed in 3.13.1, cpython#125608): the
# likely cause, not checked here (no 3.13.1 on this machine). The outputs are the same (the
# compiled-vs-eager tests pass there); run.py's records count what their timed calls compile
# (graphs_compiled_while_timed).
LATE_GUARD = pytest.mark.xfail(
    sys.version_info[:3] == (3, 13, 0) and not at_least((2, 13)),
    reason="Python 3.13.0 with torch < 2.13: a guard fails a call late",
    strict=True,
)


@pytest.mark.parametrize("arch", [pytest.param("lsg_bart_tiny", marks=LATE_GUARD), "led_tiny"])
@pytest.mark.parametrize("train", [True, False], ids=["train", "eval"])
def test_one_shape_compiles_every_graph_in_its_first_two_calls(arch, train, data_dir):
    """What a timed row relies on (``run.py``: two warm-up calls before the timed ones): at one
    shape no call after the second compiles. LSG compiles four graphs there: the first layer's input
    is strided apart from the others', and its block tables are missing on the first call and cached
    on the next (``benchmarks/results/compile_counts.md``: a new length compiles again)."""
    from torch._dynamo.utils import counters

    model = build(data_dir, arch).train(train)
    src, lengths, prev = toy_batch(L=60, lengths=(60, 41))
    torch._dynamo.reset()
    counters.clear()
    compiled = []
    with forced_path(model, "whole"), torch.set_grad_enabled(train):
        compile_encoder_layers(model, dynamic=False, backend="aot_eager")
        for _ in range(4):
            if train:
                step(model, src, lengths, prev)
            else:
                model.encoder(src, src_lengths=lengths)
            compiled.append(counters["frames"]["total"])
    assert 0 < compiled[0] and compiled[1] == compiled[3], compiled


def test_a_model_without_encoder_layers_is_refused(data_dir):
    locost = torch.nn.Module()
    locost.encoder = torch.nn.Module()  # LOCOST's encoder: blocks, no fairseq layers
    with pytest.raises(ValueError, match="no encoder.layers to compile"):
        compile_encoder_layers(locost)


def test_the_compiled_checkpoint_replays_dropout():
    """What the compiled lean layers rely on: a checkpointed region recomputed in backward draws
    the forward's dropout mask again (the gradient is the kept positions' and only theirs)."""

    def region(x, w):
        return F.dropout(x, 0.5, True) * w

    f = torch.compile(lambda x, w: checkpoint(region, x, w, use_reentrant=False))
    torch.manual_seed(0)
    x, w = torch.randn(2000, requires_grad=True), torch.randn(2000)
    y = f(x, w)
    y.sum().backward()
    kept = y != 0
    assert 0.4 < kept.float().mean() < 0.6
    assert torch.equal(x.grad, kept * w / 0.5)
