"""``--checkpoint-activations`` for every long-input arch: same gradients, far less saved memory.

Activation memory is measured exactly, without a GPU: every tensor autograd saves for the backward
pass during the forward goes through ``saved_tensors_hooks``; with checkpointing only each layer's
input is kept and the layer is recomputed in backward. (test_locost.py and test_led.py also check
gradient equality for their archs on their own fixtures.)
"""

import pytest
import torch
from conftest import TOY_VOCAB as VOCAB, build_task_and_model, write_toy_dict

import lsg_fairseq  # noqa: F401

L = 1024  # source tokens: long enough that activations dwarf the tiny weights

ARCHS = {
    "lsg_bart": [
        "--arch",
        "lsg_bart_tiny",
        "--encoder-embed-dim",
        "32",
        "--encoder-ffn-embed-dim",
        "64",
        "--decoder-embed-dim",
        "32",
        "--decoder-ffn-embed-dim",
        "64",
        "--block-size",
        "32",
        "--sparse-block-size",
        "32",
        "--dropout",
        "0",
        "--attention-dropout",
        "0",
        "--max-source-positions",
        str(L),
    ],
    "led": [
        "--arch",
        "led_tiny",
        "--encoder-embed-dim",
        "32",
        "--encoder-ffn-embed-dim",
        "64",
        "--decoder-embed-dim",
        "32",
        "--decoder-ffn-embed-dim",
        "64",
        "--attention-window",
        "32",
        "--dropout",
        "0",
        "--attention-dropout",
        "0",
        "--max-source-positions",
        str(L),
    ],
    "locost": [
        "--arch",
        "locost_tiny",
        "--d-model",
        "32",
        "--d-state",
        "16",
        "--d-ff",
        "64",
        "--d-kv",
        "8",
        "--dropout",
        "0",
        "--max-source-positions",
        str(L),
    ],
}


pytestmark = pytest.mark.usefixtures("single_thread")  # conftest: tiny tensors, one thread


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    return write_toy_dict(tmp_path_factory.mktemp("mem_data"))


def build(data_dir, arch, *extra):
    argv = [data_dir, "--task", "long_document_summarization", *ARCHS[arch], "--max-target-positions", "64", *extra]
    return build_task_and_model(argv)[1].train()


def forward_backward(model):
    """Loss gradients and the bytes autograd saved during the forward (unique storages)."""
    g = torch.Generator().manual_seed(1)
    src = torch.randint(4, VOCAB - 1, (1, L), generator=g)
    src[0, 0], src[0, -1] = 0, 2
    prev = torch.randint(4, VOCAB - 1, (1, 16), generator=g)
    prev[0, 0] = 2
    storages = {}

    def pack(t):
        storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        logits, _ = model(src, torch.tensor([L]), prev)
    logits.float().logsumexp(-1).sum().backward()
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    saved = sum(n for ptr, n in storages.items() if ptr not in params)
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}, saved


@pytest.mark.parametrize("arch", sorted(ARCHS))
def test_checkpoint_activations_same_gradients_less_memory(data_dir, arch):
    plain_grads, plain_bytes = forward_backward(build(data_dir, arch))
    ckpt_grads, ckpt_bytes = forward_backward(build(data_dir, arch, "--checkpoint-activations"))
    assert plain_grads.keys() == ckpt_grads.keys() and len(plain_grads) > 10
    for name, grad in plain_grads.items():
        assert torch.allclose(grad, ckpt_grads[name], atol=1e-6, rtol=1e-5), (arch, name)
    assert any(g.abs().sum() > 0 for n, g in plain_grads.items() if n.startswith("encoder."))
    # The encoder layers hold nearly all activations at 1K tokens; checkpointing keeps their inputs.
    print(f"{arch}: saved activations {plain_bytes / 2**20:.1f} MiB -> {ckpt_bytes / 2**20:.1f} MiB")
    assert ckpt_bytes < 0.5 * plain_bytes, (arch, plain_bytes, ckpt_bytes)
