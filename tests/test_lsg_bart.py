"""lsg_bart model: fairseq wiring of the LSG encoder (globals, masks, flags, decoding)."""

import pytest
import torch

import lsg_fairseq  # noqa: F401  (registers lsg_bart)
from conftest import TOY_VOCAB as VOCAB, build_task_and_model, toy_batch, write_toy_dict

from lsg_fairseq.models.lsg_bart import LSGBARTModel


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    return write_toy_dict(tmp_path_factory.mktemp("lsg_bart_data"))


def build(data_dir, *flags, seed=0):
    argv = [
        data_dir,
        "--task",
        "long_document_summarization",
        "--arch",
        "lsg_bart_tiny",
        "--encoder-embed-dim",
        "32",
        "--encoder-ffn-embed-dim",
        "64",
        "--block-size",
        "8",
        "--sparse-block-size",
        "8",
        "--max-source-positions",
        "512",
        "--max-target-positions",
        "64",
    ] + list(flags)
    task, model = build_task_and_model(argv, seed)
    return model.eval(), task


batch = toy_batch


def test_encoder_output_layout(data_dir):
    model, task = build(data_dir, "--num-global-tokens", "3")
    assert isinstance(model, LSGBARTModel) and len(task.source_dictionary) == VOCAB
    assert model.encoder.global_embeddings.weight.shape == (512, 32)
    assert model.encoder.embed_positions.weight.shape == (514, 32)
    src, lengths, prev = batch()
    out = model.encoder(src, src_lengths=lengths)
    assert out["encoder_out"][0].shape == (3 + 45, 2, 32)
    mask = out["encoder_padding_mask"][0]
    assert mask.shape == (2, 48) and not mask[:, :3].any()
    assert torch.equal(mask[:, 3:], src.eq(1))
    assert out["src_lengths"][0].flatten().tolist() == [45, 30]
    logits, _ = model(src, lengths, prev)
    assert logits.shape == (2, 7, VOCAB) and torch.isfinite(logits).all()


def test_state_dict_is_bart_plus_globals(data_dir):
    model, _ = build(data_dir)
    keys = set(model.state_dict())
    assert "encoder.global_embeddings.weight" in keys
    assert "encoder.layers.0.self_attn.q_proj.weight" in keys
    assert not any("global" in k for k in keys - {"encoder.global_embeddings.weight"})
    ckpt, _ = build(data_dir, "--checkpoint-activations")
    assert set(ckpt.state_dict()) == keys  # checkpoint_wrapper keeps key names
    src, lengths, prev = batch()
    ckpt.load_state_dict(model.state_dict())
    with torch.no_grad():
        assert torch.allclose(ckpt(src, lengths, prev)[0], model(src, lengths, prev)[0], atol=1e-6)


def test_right_padding_batch_invariance(data_dir):
    model, _ = build(data_dir, "--num-global-tokens", "2", "--sparsity-type", "pooling")
    src, lengths, prev = batch()
    with torch.no_grad():
        both = model.encoder(src, src_lengths=lengths)["encoder_out"][0]
        alone = model.encoder(src[1:, :30], src_lengths=lengths[1:])["encoder_out"][0]
        logits_both = model(src, lengths, prev)[0]
        logits_alone = model(src[1:, :30], lengths[1:], prev[1:])[0]
    assert torch.allclose(both[: 2 + 30, 1], alone[:, 0], atol=1e-5)
    assert torch.allclose(logits_both[1], logits_alone[0], atol=1e-5)


def test_gradients_reach_global_embeddings(data_dir):
    model, _ = build(data_dir, "--num-global-tokens", "4")
    model.train()
    src, lengths, prev = batch()
    logits, _ = model(src, lengths, prev)
    logits.logsumexp(-1).mean().backward()
    grad = model.encoder.global_embeddings.weight.grad
    assert grad is not None
    assert (grad[:4].abs().sum(-1) > 0).all()  # the used globals learn
    assert grad[4:].abs().sum() == 0  # the unused rows get nothing


def test_train_global_only(data_dir):
    model, _ = build(data_dir, "--train-global-only")
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    assert trainable == ["encoder.global_embeddings.weight"]


def test_incremental_decoding_equals_full_decoding(data_dir):
    model, _ = build(data_dir, "--num-global-tokens", "2")
    src, lengths, prev = batch()
    with torch.no_grad():
        enc = model.encoder(src, src_lengths=lengths)
        full, _ = model.decoder(prev, encoder_out=enc)
        state = {}
        steps = [
            model.decoder(prev[:, : i + 1], encoder_out=enc, incremental_state=state)[0] for i in range(prev.size(1))
        ]
    inc = torch.cat(steps, dim=1)
    assert torch.allclose(full, inc, atol=1e-5), (full - inc).abs().max()


def test_beam_search_generation(data_dir):
    from fairseq.sequence_generator import SequenceGenerator

    model, task = build(data_dir, "--num-global-tokens", "2")
    src, lengths, _ = batch()
    gen = SequenceGenerator([model], task.target_dictionary, beam_size=3, max_len_b=10)
    hyps = gen.generate([model], {"net_input": {"src_tokens": src, "src_lengths": lengths}})
    assert len(hyps) == 2 and all(len(h) == 3 for h in hyps)
    assert all(h[0]["tokens"][-1].item() == 2 for h in hyps)


def test_pass_global_tokens_to_decoder_false_pools_global0(data_dir):
    base, _ = build(data_dir, "--num-global-tokens", "3")
    pooled, _ = build(data_dir, "--num-global-tokens", "3", "--pass-global-tokens-to-decoder", "false")
    dropped, _ = build(
        data_dir, "--num-global-tokens", "3", "--pass-global-tokens-to-decoder", "false", "--pool-with-global", "false"
    )
    pooled.load_state_dict(base.state_dict())
    dropped.load_state_dict(base.state_dict())
    src, lengths, prev = batch()
    with torch.no_grad():
        full = base.encoder(src, src_lengths=lengths)
        p = pooled.encoder(src, src_lengths=lengths)
        d = dropped.encoder(src, src_lengths=lengths)
        pooled(src, lengths, prev)
    x = full["encoder_out"][0]
    assert p["encoder_out"][0].shape == (45, 2, 32)
    assert torch.equal(p["encoder_out"][0][0], x[0])  # global 0 replaces token 0
    assert torch.equal(p["encoder_out"][0][1:], x[4:])
    assert torch.equal(d["encoder_out"][0], x[3:])
    assert torch.equal(p["encoder_padding_mask"][0], src.eq(1))


def test_mask_first_token_hides_it_everywhere(data_dir):
    model, _ = build(data_dir, "--num-global-tokens", "2", "--mask-first-token")
    src, lengths, prev = batch()
    other = src.clone()
    other[:, 0] = 7  # a different first token must change nothing but its own output
    with torch.no_grad():
        a = model.encoder(src, src_lengths=lengths)
        b = model.encoder(other, src_lengths=lengths)
        la, lb = model(src, lengths, prev)[0], model(other, lengths, prev)[0]
    mask = a["encoder_padding_mask"][0]
    assert mask[:, 2].all() and not mask[:, :2].any()  # token 0 hidden from cross-attention
    keep = torch.ones(47, dtype=torch.bool)
    keep[2] = False
    assert torch.allclose(a["encoder_out"][0][keep], b["encoder_out"][0][keep], atol=1e-6)
    assert not torch.allclose(a["encoder_out"][0][2], b["encoder_out"][0][2])
    assert torch.allclose(la, lb, atol=1e-6)


@pytest.mark.parametrize(
    "flags,message",
    [
        (["--sparsity-factor", "3"], "--sparsity-factor"),
        (["--sparse-block-size", "2", "--sparsity-factor", "2"], "--sparse-block-size"),
        (
            ["--mask-first-token", "--pass-global-tokens-to-decoder", "false", "--pool-with-global", "false"],
            "--pool-with-global",
        ),
    ],
)
def test_invalid_hyper_parameters_refused_at_build(data_dir, flags, message):
    """Combinations only the model build can judge (single values are refused when parsed)."""
    from lsg_text.errors import ConfigError

    with pytest.raises(ConfigError, match=message):
        build(data_dir, *flags)


@pytest.mark.parametrize(
    "flags,message",
    [
        (["--num-global-tokens", "0"], "argument --num-global-tokens: must be an integer in [1, 512], got '0'"),
        (["--num-global-tokens", "600"], "argument --num-global-tokens: must be an integer in [1, 512], got '600'"),
        (["--block-size", "0"], "argument --block-size: must be an integer >= 1, got '0'"),
        (["--block-size", "-3"], "argument --block-size: must be an integer >= 1, got '-3'"),
        (["--sparse-block-size", "x"], "argument --sparse-block-size: must be an integer >= 0, got 'x'"),
    ],
)
def test_out_of_range_values_refused_when_parsed(data_dir, flags, message, capsys):
    with pytest.raises(SystemExit) as e:
        build(data_dir, *flags)
    assert e.value.code == 2
    assert message in capsys.readouterr().err


def test_unknown_sparsity_type_refused(data_dir):
    with pytest.raises(SystemExit):
        build(data_dir, "--sparsity-type", "bogus")


def test_long_input_memory_path(data_dir):
    # 8 blocks + an odd remainder: adaptive padding inside every layer, output trimmed back
    model, _ = build(data_dir, "--sparsity-type", "norm", "--sparsity-factor", "4")
    src, lengths, prev = batch(L=77, lengths=(77, 50))
    with torch.no_grad():
        out = model.encoder(src, src_lengths=lengths)["encoder_out"][0]
    assert out.shape == (1 + 77, 2, 32) and torch.isfinite(out).all()
