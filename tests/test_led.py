"""led model: fairseq wiring of the Longformer encoder (global modes, padding, flags, training)."""

import pytest
import torch

import lsg_fairseq  # noqa: F401  (registers led)
from conftest import TOY_VOCAB as VOCAB, build_task_and_model, toy_batch, write_toy_dict

from lsg_fairseq.models.custom_encoder import LongInputEncoderLayer
from lsg_fairseq.models.led import LEDModel
from lsg_layers.modules.longformer_attention import LongformerSelfAttention


pytestmark = pytest.mark.usefixtures("single_thread")  # conftest: tiny tensors, one thread


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    return write_toy_dict(tmp_path_factory.mktemp("led_data"))


def build(data_dir, *flags, seed=0):
    argv = [
        data_dir,
        "--task",
        "long_document_summarization",
        "--arch",
        "led_tiny",
        "--encoder-embed-dim",
        "32",
        "--encoder-ffn-embed-dim",
        "64",
        "--attention-window",
        "8",
        "--max-source-positions",
        "512",
        "--max-target-positions",
        "64",
    ] + list(flags)
    task, model = build_task_and_model(argv, seed)
    return model.eval(), task


batch = toy_batch


def encode(model, src, lengths, **kw):
    with torch.no_grad():
        return model.encoder(src, src_lengths=lengths, **kw)["encoder_out"][0].transpose(0, 1)  # (B, T, C)


def test_layout_windows_and_state_dict(data_dir):
    model, task = build(data_dir, "--attention-window", "4,12")
    assert isinstance(model, LEDModel)
    layers = model.encoder.layers
    assert all(isinstance(layer, LongInputEncoderLayer) for layer in layers)
    assert all(isinstance(layer.self_attn, LongformerSelfAttention) for layer in layers)
    assert [layer.self_attn.attention_window for layer in layers] == [4, 12]
    assert [layer.self_attn.one_sided for layer in layers] == [2, 6]
    sd = model.state_dict()
    extra = sorted(k for k in sd if "_global" in k)
    assert extra == sorted(
        f"encoder.layers.{i}.self_attn.{p}_proj_global.{w}" for i in range(2) for p in "qkv" for w in ("weight", "bias")
    )
    assert "encoder.global_token_ids" not in sd  # a non-persistent buffer
    assert sd["encoder.embed_positions.weight"].shape == (514, 32)
    src, lengths, prev = batch()
    out = model.encoder(src, src_lengths=lengths)
    assert out["encoder_out"][0].shape == (45, 2, 32)
    assert torch.equal(out["encoder_padding_mask"][0], src.eq(1))
    assert out["src_lengths"][0].flatten().tolist() == [45, 30]
    logits, _ = model(src, lengths, prev)
    assert logits.shape == (2, 7, VOCAB)


def test_default_global_mask_modes(data_dir):
    model, _ = build(data_dir)
    src, _, _ = batch()
    left = torch.full_like(src, 1)
    left[1, 15:] = src[1, :30]  # row 1 left padded
    left[0] = src[0]
    g = model.encoder.default_global_attention_mask(left)
    assert g.nonzero().tolist() == [[0, 0], [1, 15]]  # the first REAL token of every row
    none, _ = build(data_dir, "--global-attention", "none")
    assert none.encoder.default_global_attention_mask(src) is None
    ids, _ = build(data_dir, "--global-attention", "none", "--global-token-ids", "2,7")
    g = ids.encoder.default_global_attention_mask(src)
    assert torch.equal(g, (src == 2) | (src == 7))
    both, _ = build(data_dir, "--global-token-ids", "7")
    g = both.encoder.default_global_attention_mask(src)
    assert torch.equal(g, (src == 7) | (torch.arange(45) == 0)[None, :])


def test_explicit_mask_overrides_mode(data_dir):
    first, _ = build(data_dir)
    none, _ = build(data_dir, "--global-attention", "none")  # same seed: same weights
    src, lengths, _ = batch()
    off = torch.zeros_like(src, dtype=torch.bool)
    on = off.clone()
    on[:, 0] = True
    assert torch.equal(encode(first, src, lengths, global_attention_mask=off), encode(none, src, lengths))
    assert torch.equal(encode(none, src, lengths, global_attention_mask=on), encode(first, src, lengths))
    assert (encode(first, src, lengths) - encode(none, src, lengths)).abs().max() > 1e-3
    multi = on.clone()
    multi[0, 20] = True
    assert (
        encode(first, src, lengths, global_attention_mask=multi)[0] - encode(first, src, lengths)[0]
    ).abs().max() > 1e-3
    with pytest.raises(ValueError, match="global_attention_mask has shape"):
        first.encoder(src, lengths, global_attention_mask=on[:, :10])


def test_padding_side_and_batch_invariance(data_dir):
    model, _ = build(data_dir, "--global-token-ids", "7")
    src, lengths, _ = batch()
    out = encode(model, src, lengths)
    alone = encode(model, src[1:, :30], lengths[1:])
    assert (out[1, :30] - alone[0]).abs().max() < 1e-5
    left = torch.full_like(src[1:], 1)
    left[0, 15:] = src[1, :30]  # pad-aware positions and "first real token" global
    out_left = encode(model, left, lengths[1:])
    assert (out_left[0, 15:] - alone[0]).abs().max() < 1e-5


def test_gradients_and_activation_checkpointing(data_dir):
    results = []
    for flags in ([], ["--checkpoint-activations"]):
        model, _ = build(data_dir, *flags)
        model.train()
        for m in model.modules():  # deterministic: compare the two runs
            if hasattr(m, "p"):
                m.p = 0.0
        for layer in model.encoder.layers:
            layer.self_attn.dropout = 0.0
        src, lengths, prev = batch()
        logits, _ = model(src, lengths, prev)
        logits.sum().backward()
        grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
        assert grads["encoder.layers.0.self_attn.q_proj_global.weight"].abs().sum() > 0
        assert grads["encoder.layers.1.self_attn.k_proj.weight"].abs().sum() > 0
        results.append(grads)
    for name, g in results[0].items():
        assert torch.allclose(g, results[1][name], atol=1e-5), name


def test_beam_search_generation(data_dir):
    from fairseq.sequence_generator import SequenceGenerator

    model, task = build(data_dir)
    src, lengths, _ = batch()
    gen = SequenceGenerator([model], task.target_dictionary, beam_size=3, max_len_b=10)
    hyps = gen.generate([model], {"net_input": {"src_tokens": src, "src_lengths": lengths}})
    assert len(hyps) == 2 and all(len(h) == 3 for h in hyps)
    assert all(h[0]["tokens"][-1].item() == 2 for h in hyps)


@pytest.mark.parametrize(
    "flags,message",
    [
        (["--attention-window", "8,8,8"], "--attention-window has 3 entries but the encoder has 2"),
        (["--global-token-ids", "3,600"], "--global-token-ids"),
        (["--global-token-ids", "1,7"], "--global-token-ids: 1 is the dictionary's <pad>, which never attends"),
    ],
)
def test_invalid_hyper_parameters_refused_at_build(data_dir, flags, message):
    """What depends on other settings (layers, dictionary size) is refused when the model is built."""
    from lsg_text.errors import ConfigError

    with pytest.raises(ConfigError, match=message):
        build(data_dir, *flags)


@pytest.mark.parametrize(
    "flags,message",
    [
        (["--attention-window", "7"], "argument --attention-window: must be a positive even integer"),
        (["--attention-window", "0"], "argument --attention-window: must be a positive even integer"),
        (["--attention-window", "8,x"], "argument --attention-window: must be an int or a comma-separated list"),
        (["--global-token-ids", "3,a"], "argument --global-token-ids: must be comma-separated dictionary ids >= 0"),
    ],
)
def test_invalid_values_refused_when_parsed(data_dir, flags, message, capsys):
    with pytest.raises(SystemExit) as e:
        build(data_dir, *flags)
    assert e.value.code == 2 and message in capsys.readouterr().err


def test_unknown_global_mode_refused(data_dir):
    with pytest.raises(SystemExit):
        build(data_dir, "--global-attention", "all")


def test_archs_defaults():
    from argparse import Namespace

    from lsg_fairseq.models.led import led_base_architecture, led_large_architecture

    base = Namespace()
    led_base_architecture(base)
    assert (base.encoder_embed_dim, base.encoder_layers, base.max_source_positions) == (768, 6, 16384)
    assert (base.attention_window, base.global_attention, base.global_token_ids) == ("1024", "first", "")
    large = Namespace()
    led_large_architecture(large)
    assert (large.encoder_embed_dim, large.encoder_layers, large.max_target_positions) == (1024, 12, 1024)
