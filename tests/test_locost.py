"""locost model wiring: incremental == full decoding, generation, padding, SSM optimizer groups, CLI."""

import os
import subprocess
import sys

import pytest
import torch
from fairseq.sequence_generator import SequenceGenerator

import lsg_fairseq  # noqa: F401  (registers the model, task, optimizer)
from lsg_fairseq.models.locost import LOCOSTModel
from lsg_fairseq.optim.grouped_adam import GroupedAdam, GroupedAdamConfig

from conftest import build_from_flags, load_script

TINY = [
    "--arch",
    "locost_tiny",
    "--d-model",
    "32",
    "--d-state",
    "8",
    "--d-ff",
    "48",
    "--d-kv",
    "8",
    "--decoder-attention-heads",
    "4",
    "--dropout",
    "0",
    "--max-source-positions",
    "512",
]
BIN = os.path.dirname(sys.executable)


def build(data, *extra, arch=TINY, seed=0):
    cfg, task, model = build_from_flags(
        [str(data), "--task", "long_document_summarization", "--criterion", "cross_entropy"]
        + ["--optimizer", "grouped_adam", "--lr", "0.001", "--cpu", *arch, *extra],
        seed,
    )
    with torch.no_grad():  # move the SSM parameters off their init (B = 1, S4D-Lin A)
        for name, p in model.named_parameters():
            if ".kernel." in name:
                p.add_(0.1 * torch.randn_like(p))
    return cfg, task, model


def batch(task, split, n, start=0):
    if split not in task.datasets:
        task.load_dataset(split)
    ds = task.dataset(split)
    return ds.collater([ds[i] for i in range(start, start + n)])


@pytest.fixture(scope="module")
def tiny(word_data):
    """One eval-mode model shared by the read-only tests (building costs ~1 s of CPU each)."""
    _, task, model = build(word_data)
    return task, model.eval()


def test_task_conventions_no_bos_and_start_embedding(tiny):
    task, model = tiny
    # the model declares its convention and the task reads it; the model never writes the task
    assert LOCOSTModel.prepend_bos is False and task.prepend_bos is False and task.cfg.no_prepend_bos is False
    sample = batch(task, "valid", 2)
    src = sample["net_input"]["src_tokens"]
    assert (src[:, 0] != task.src_dict.bos()).all()  # T5: no <s> on the source
    prev = sample["net_input"]["prev_output_tokens"]
    assert (prev[:, 0] == task.tgt_dict.eos()).all()  # fairseq's start symbol ...
    model.eval()
    with torch.no_grad():
        enc = model.encoder(src, sample["net_input"]["src_lengths"])
        a, _ = model.decoder(prev, encoder_out=enc)
        prev_bos = prev.clone()
        prev_bos[:, 0] = task.tgt_dict.bos()
        b, _ = model.decoder(prev_bos, encoder_out=enc)
        prev_other = prev.clone()
        prev_other[:, 0] = 7
        c, _ = model.decoder(prev_other, encoder_out=enc)
    assert torch.equal(a, b)  # ... is embedded with the <s> row (T5's decoder start)
    assert (a - c).abs().max() > 1e-4


@pytest.mark.parametrize("reorder", [False, True])
def test_incremental_equals_full_decoding(tiny, reorder):
    task, model = tiny
    sample = batch(task, "valid", 3)
    src, lengths = sample["net_input"]["src_tokens"], sample["net_input"]["src_lengths"]
    prev = sample["net_input"]["prev_output_tokens"][:, :12]
    order = torch.tensor([2, 0])  # source 1 finished, the others' rows swapped: every cache is selected
    with torch.no_grad():
        enc = model.encoder(src, lengths)
        state, steps = {}, []
        for t in range(prev.size(1)):
            if reorder and t == 5:  # beam-search style reordering of cached states mid-way
                model.decoder.reorder_incremental_state_scripting(state, order)
                enc = model.encoder.reorder_encoder_out(enc, order)
                prev = prev[order]
                steps = [s[order] for s in steps]
            out, extra = model.decoder(prev[:, : t + 1], encoder_out=enc, incremental_state=state)
            assert out.shape[1] == 1
            steps.append(out)
        inc = torch.cat(steps, 1)
        full, _ = model.decoder(prev, encoder_out=enc)
    assert torch.allclose(inc, full, atol=1e-5), (inc - full).abs().max()


def test_incremental_position_bias_beyond_max_distance(tiny):
    """The bias row of a query at offset t (incremental step) equals row t of the full bias, for
    offsets past the exact buckets and past max_distance 128 (full 140-step decoding is too slow
    for this test file; test_incremental_equals_full_decoding covers the wiring)."""
    _, model = tiny
    rel = model.decoder.block[0].layer[0].SelfAttention
    with torch.no_grad():
        full = rel.compute_bias(300, 300)  # (1 heads 300 300)
        for t in (0, 15, 16, 127, 128, 129, 299):
            assert torch.equal(rel.compute_bias(1, t + 1, q_offset=t)[0, :, 0], full[0, :, t, : t + 1])
        # past max_distance every earlier key shares the last bucket
        assert torch.equal(full[0, :, 299, 0], full[0, :, 299, 299 - 140])
    from lsg_layers.modules.t5_layers import relative_position_bucket

    b = relative_position_bucket(-torch.arange(300), bidirectional=False)  # key t - d for query t
    assert b[:16].tolist() == list(range(16))  # exact buckets
    assert (b[128:] == 31).all() and (b.diff() >= 0).all()
    # log-spaced: 16 + int(log(d / 16) / log(128 / 16) * 16), e.g. d = 100 -> 30, d = 20 -> 17
    assert b[100].item() == 30 and b[20].item() == 17 and b[16].item() == 16
    assert (relative_position_bucket(torch.arange(1, 50), bidirectional=False) == 0).all()  # future keys


def test_bf16_model_close_to_fp32(word_data):
    """Half-precision weights (e.g. --memory-efficient-bf16): SSM kernels / FFT stay float32."""
    _, task, model = build(word_data)
    model.eval()
    sample = batch(task, "valid", 2)
    net = sample["net_input"]
    args = (net["src_tokens"][:, :100], torch.tensor([100, 100]), net["prev_output_tokens"][:, :10])
    with torch.no_grad():
        ref, _ = model(*args)
        out, _ = model.to(torch.bfloat16)(*args)
    assert out.dtype == torch.bfloat16
    kernel = model.encoder.block[0].layer[0].ssm_layer.kernel
    assert kernel.A_imag.dtype == torch.float32 and model.encoder.embed_tokens.weight.dtype == torch.bfloat16
    rel = (out.float() - ref).abs().max() / ref.abs().max()
    assert rel < 0.05, rel


def test_encoder_padding_invariance_and_contract(tiny):
    task, model = tiny
    sample = batch(task, "valid", 4)
    # right-pad rows cut to different lengths (the sources are all truncated to 512 here)
    lengths = torch.tensor([100, 37, 64, 90])
    src = sample["net_input"]["src_tokens"][:, :100].clone()
    for i, n in enumerate(lengths.tolist()):
        src[i, n - 1] = task.src_dict.eos()
        src[i, n:] = task.src_dict.pad()
    with torch.no_grad():
        out = model.encoder(src, lengths, return_all_hiddens=True)
        for i in range(src.size(0)):
            n = int(lengths[i])
            alone = model.encoder(src[i : i + 1, :n], lengths[i : i + 1])
            assert torch.allclose(out["encoder_out"][0][:n, i], alone["encoder_out"][0][:, 0], atol=1e-5)
    L, B = src.size(1), src.size(0)
    assert out["encoder_out"][0].shape == (L, B, 32)
    assert torch.equal(out["encoder_padding_mask"][0], src.eq(task.src_dict.pad()))
    assert out["encoder_embedding"][0].shape == (B, L, 32)
    assert len(out["encoder_states"]) == 2 and out["encoder_states"][0].shape == (L, B, 32)
    assert out["src_lengths"][0].shape == (B, 1)
    order = torch.tensor([3, 1])
    re = model.encoder.reorder_encoder_out(out, order)
    assert torch.equal(re["encoder_out"][0], out["encoder_out"][0][:, order])
    assert torch.equal(re["encoder_padding_mask"][0], out["encoder_padding_mask"][0][order])


@pytest.mark.parametrize("beam", [1, 3])
def test_generate_greedy_and_beam(tiny, beam):
    task, model = tiny
    sample = batch(task, "valid", 2)
    gen = SequenceGenerator([model], task.target_dictionary, beam_size=beam, max_len_b=10)
    with torch.no_grad():
        hyps = gen.generate([model], sample)
    assert len(hyps) == 2 and len(hyps[0]) == beam
    for h in hyps:
        toks = h[0]["tokens"]
        assert 1 <= len(toks) <= 11 and toks[-1].item() == task.tgt_dict.eos()
        assert task.tgt_dict.pad() not in toks.tolist()
        assert torch.isfinite(h[0]["score"])
    if beam > 1:  # beam results are sorted by score and the scores are proper log-probabilities
        assert hyps[0][0]["score"] >= hyps[0][1]["score"]
        # beamable cross-attention (set by the generator) gives the same hypotheses as tiling
        model.set_beam_size(1)
        tiled = SequenceGenerator([model], task.target_dictionary, beam_size=beam, max_len_b=10)
        model.set_beam_size(1)  # undo the generator's set_beam_size: encoder output tiled per beam
        with torch.no_grad():
            ref = tiled._generate(sample)
        for h, r in zip(hyps, ref):
            assert [x["tokens"].tolist() for x in h] == [x["tokens"].tolist() for x in r]
            assert torch.allclose(torch.stack([x["score"] for x in h]), torch.stack([x["score"] for x in r]), atol=1e-5)
    # greedy equals the teacher-forced argmax path of the full (non-incremental) model
    if beam == 1:
        toks = hyps[0][0]["tokens"]
        prev = torch.cat([torch.tensor([task.tgt_dict.eos()]), toks[:-1]]).unsqueeze(0)
        with torch.no_grad():
            logits, _ = model(sample["net_input"]["src_tokens"][:1], sample["net_input"]["src_lengths"][:1], prev)
        logits[..., task.tgt_dict.pad()] = -float("inf")
        n = len(toks) - 1 if len(toks) == 11 else len(toks)  # at max length eos is forced
        assert logits[0].argmax(-1).tolist()[:n] == toks.tolist()[:n]


def test_beamable_cross_attention_equals_tiled(tiny):
    """One cached key/value row per source (set_beam_size) == tiling the encoder output per beam,
    including a reorder that swaps beams and drops a finished source, as SequenceGenerator does."""
    task, model = tiny
    sample = batch(task, "valid", 3)
    src, lengths = sample["net_input"]["src_tokens"][:, :80].clone(), torch.tensor([80, 50, 65])
    for i, n in enumerate(lengths.tolist()):
        src[i, n:] = task.src_dict.pad()
    beam = 2
    torch.manual_seed(3)
    prev = torch.randint(4, 40, (3 * beam, 6))
    prev[:, 0] = task.tgt_dict.eos()
    new_order = torch.tensor([1, 0, 5, 5])  # source 0: beams swapped; source 1 finished; source 2: beam 1 twice
    outs = {}
    with torch.no_grad():
        enc = model.encoder(src, lengths)
        for mode in ("beamable", "tiled"):
            model.set_beam_size(beam if mode == "beamable" else 1)
            e = model.encoder.reorder_encoder_out(enc, torch.arange(3).repeat_interleave(beam))
            assert e["encoder_out"][0].shape[1] == (3 if mode == "beamable" else 6)
            state, tokens, steps = {}, prev.clone(), []
            for t in range(6):
                if t == 3:
                    model.decoder.reorder_incremental_state_scripting(state, new_order)
                    e = model.encoder.reorder_encoder_out(e, new_order)
                    tokens = tokens[new_order]
                out, _ = model.decoder(tokens[:, : t + 1], encoder_out=e, incremental_state=state)
                steps.append(out)
            cross = model.decoder.block[0].layer[1].EncDecAttention
            outs[mode] = (steps, state[cross._state_key]["prev_key"].shape[0])
        model.set_beam_size(1)
    assert outs["beamable"][1] == 2 and outs["tiled"][1] == 4  # cached rows: per source vs per hypothesis
    for a, b in zip(outs["beamable"][0], outs["tiled"][0]):
        assert a.shape == b.shape and torch.allclose(a, b, atol=1e-5)
    # the instance override is gone again: reorder_encoder_out tiles as usual
    assert "reorder_encoder_out" not in model.encoder.__dict__


def test_ssm_parameters_tagged_and_grouped(word_data):
    _, task, model = build(word_data, "--ssm-lr", "0.004", "--weight-decay", "0.1")
    ssm = {n for n, p in model.named_parameters() if getattr(p, "param_group", None) == "ssm"}
    assert len(ssm) == 2 * 5  # 2 layers x (log_dt, inv_A_real, A_imag, B, C)
    assert all(".ssm_layer.kernel." in n for n in ssm)
    p = model.encoder.block[0].layer[0].ssm_layer.kernel.log_dt
    assert p.optim_overrides == {"optimizer": {"lr_scale": 4.0, "weight_decay_scale": 0.0}}
    assert not hasattr(model.encoder.block[0].layer[0].ssm_layer.D, "param_group")

    cfg = GroupedAdamConfig(lr=[0.001], weight_decay=0.1, adam_betas="(0.9, 0.999)")
    opt = GroupedAdam(cfg, [q for q in model.parameters() if q.requires_grad])
    groups = {g["group_name"]: g for g in opt.param_groups}
    assert set(groups) == {"default", "ssm"}
    assert groups["ssm"]["weight_decay"] == 0.0 and groups["default"]["weight_decay"] == 0.1
    assert groups["ssm"]["lr"] == pytest.approx(0.004) and groups["default"]["lr"] == pytest.approx(0.001)
    opt.set_lr(0.0005)  # what the lr scheduler does every update
    assert groups["ssm"]["lr"] == pytest.approx(0.002) and opt.get_lr() == pytest.approx(0.0005)

    # one step with zero gradients: only weight decay acts, and only on the default group
    before = {n: q.detach().clone() for n, q in model.named_parameters()}
    for q in model.parameters():
        q.grad = torch.zeros_like(q)
    opt.step()
    for n, q in model.named_parameters():
        if n in ssm:
            assert torch.equal(q, before[n]), n
    moved = model.encoder.block[0].layer[1].DenseReluDense.wo.weight
    assert not torch.equal(moved, before["encoder.block.0.layer.1.DenseReluDense.wo.weight"])

    # restoring optimizer state keeps the per-group settings (fairseq passes global overrides)
    state = opt.state_dict()
    opt2 = GroupedAdam(cfg, [q for q in model.parameters() if q.requires_grad])
    opt2.load_state_dict(state, {"lr": 0.001, "weight_decay": 0.1})
    g2 = {g["group_name"]: g for g in opt2.param_groups}
    assert g2["ssm"]["weight_decay"] == 0.0 and g2["ssm"]["lr"] == pytest.approx(0.004)

    # a resume with another --ssm-lr (or --lr) takes this run's ratio, not the checkpoint's (torch's
    # load_state_dict had put back the saved lr_scale, and the log named the new one)
    _, _, resumed = build(word_data, "--ssm-lr", "0.0001", "--weight-decay", "0.1")
    for overrides in ({}, {"lr": 0.002}):
        opt3 = GroupedAdam(cfg, [q for q in resumed.parameters() if q.requires_grad])
        opt3.load_state_dict(state, overrides)
        g3 = {g["group_name"]: g for g in opt3.param_groups}
        base = overrides.get("lr", 0.001)
        assert g3["ssm"]["lr_scale"] == pytest.approx(0.1) and g3["ssm"]["lr"] == pytest.approx(0.1 * base)
        assert g3["default"]["lr"] == pytest.approx(base) and opt3.get_lr() == pytest.approx(base)
        assert g3["ssm"]["weight_decay"] == 0.0


def test_untagged_grouped_adam_equals_adam():
    from fairseq.optim.adam import FairseqAdam, FairseqAdamConfig

    torch.manual_seed(0)
    a = torch.nn.Linear(4, 3)
    b = torch.nn.Linear(4, 3)
    b.load_state_dict(a.state_dict())
    oa = FairseqAdam(FairseqAdamConfig(lr=[0.01], weight_decay=0.1, adam_betas="(0.9, 0.999)"), list(a.parameters()))
    ob = GroupedAdam(GroupedAdamConfig(lr=[0.01], weight_decay=0.1, adam_betas="(0.9, 0.999)"), list(b.parameters()))
    x = torch.randn(5, 4)
    for _ in range(3):
        for m, o in ((a, oa), (b, ob)):
            o.zero_grad()
            m(x).pow(2).sum().backward()
            o.step()
    assert torch.equal(a.weight, b.weight) and torch.equal(a.bias, b.bias)


def test_offload_activations_checkpoints_the_blocks_as_for_the_transformers(word_data):
    """--offload-activations alone: fairseq's transformer flags turn checkpointing on with it (LSG,
    LED); LOCOST's blocks were left unwrapped, the flag ignored without a word."""
    for flags, wrapped in (([], False), (["--offload-activations"], True), (["--checkpoint-activations"], True)):
        _, _, model = build(word_data, *flags)
        blocks = [*model.encoder.block, *model.decoder.block]
        assert [hasattr(b, "precheckpoint_forward") for b in blocks] == [wrapped] * len(blocks), flags


def test_checkpoint_activations_same_gradients(word_data):
    grads = []
    for extra in ([], ["--checkpoint-activations"]):
        _, task, model = build(word_data, *extra, seed=1)
        sample = batch(task, "train", 2)
        net = sample["net_input"]
        model.train()
        # short slices keep this cheap; the blocks see the same shapes either way
        logits, _ = model(
            net["src_tokens"][:, :64], net["src_lengths"].clamp(max=64), net["prev_output_tokens"][:, :16]
        )
        loss = torch.nn.functional.cross_entropy(
            logits.transpose(1, 2), sample["target"][:, :16], ignore_index=task.tgt_dict.pad()
        )
        loss.backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})
    assert grads[0].keys() == grads[1].keys() and len(grads[0]) > 0
    for n in grads[0]:
        assert torch.allclose(grads[0][n], grads[1][n], atol=1e-5), n


@pytest.mark.parametrize(
    "flag,value,match",
    [
        ("--d-state", "7", "--d-state must be even"),
        ("--ssm-dt-min", "0.5", "--ssm-dt-min <= --ssm-dt-max"),
        ("--ssm-kernel-product", "bf16", "mode of the fused generator: add --ssm-kernel-compile True"),
        # an IndexError in the first step (a bucket past the table)
        ("--relative-attention-max-distance", "16", "--relative-attention-max-distance 16 must exceed half of"),
        ("--relative-attention-num-buckets", "256", "--relative-attention-max-distance 128 must exceed half of"),
    ],
)
def test_bad_flags_refused(word_data, flag, value, match):
    """Refused at build: what a single value's range cannot say (parity, an order between flags)."""
    from lsg_text.errors import ConfigError

    with pytest.raises(ConfigError, match=match):
        build(word_data, flag, value)


@pytest.mark.parametrize(
    "flag,value,match",
    [
        ("--d-model", "0", "argument --d-model: must be an integer >= 1"),
        ("--dropout", "1.5", "argument --dropout: must be a number in [0, 1)"),
        ("--ssm-kernel-tail-tol", "-1", "argument --ssm-kernel-tail-tol: must be a number >= 0"),
        ("--relative-attention-num-buckets", "2", "argument --relative-attention-num-buckets: must be an integer >= 4"),
        ("--ssm-kernel-product", "fp8", "argument --ssm-kernel-product: must be one of fp32, tf32, bf16, got 'fp8'"),
    ],
)
def test_out_of_range_flags_refused_when_parsed(word_data, flag, value, match, capsys):
    with pytest.raises(SystemExit) as e:
        build(word_data, flag, value)
    assert e.value.code == 2 and match in capsys.readouterr().err


def test_ssm_lr_with_an_optimizer_that_ignores_it_is_refused(word_data):
    flags = [str(word_data), "--task", "long_document_summarization", "--optimizer", "adam", "--lr", "0.001"]
    with pytest.raises(ValueError, match="grouped_adam"):
        build_from_flags(flags + ["--ssm-lr", "0.01", "--cpu", *TINY])


def test_train_then_generate_cli(word_data, tmp_path):
    """fairseq-train (grouped_adam, --ssm-lr, checkpoint activations) then fairseq-generate (beam 2),
    both through fairseq's own command-line entry points, in one interpreter (saves an import)."""
    save = tmp_path / "ckpt"
    common = ["--user-dir", lsg_fairseq.user_dir(), "--task", "long_document_summarization", "--cpu"]
    train = [
        "fairseq-train",
        str(word_data),
        *common,
        *TINY,
        "--criterion",
        "cross_entropy",
        "--optimizer",
        "grouped_adam",
        "--lr",
        "0.001",
        "--ssm-lr",
        "0.002",
        "--weight-decay",
        "0.01",
        "--max-tokens",
        "2048",
        "--max-update",
        "2",
        "--disable-validation",
        "--required-batch-size-multiple",
        "1",
        "--checkpoint-activations",
        "--save-dir",
        str(save),
        "--no-epoch-checkpoints",
        "--log-format",
        "simple",
        "--num-workers",
        "0",
    ]
    generate = [
        "fairseq-generate",
        str(word_data),
        *common,
        "--path",
        str(save / "checkpoint_last.pt"),
        "--gen-subset",
        "valid",
        "--beam",
        "2",
        "--max-len-b",
        "5",
        "--batch-size",
        "2",
        "--max-source-positions",
        "512",
        "--num-workers",
        "0",
    ]
    script = (
        "import sys\n"
        "from fairseq_cli import train, generate\n"
        f"sys.argv = {train!r}\ntrain.cli_main()\n"
        f"sys.argv = {generate!r}\ngenerate.cli_main()\n"
    )
    res = subprocess.run([sys.executable, "-c", script], check=True, capture_output=True, text=True)
    assert (save / "checkpoint_last.pt").exists()
    log = res.stdout + res.stderr
    # the real trainer path honours the SSM tags: own group, lr x (0.002 / 0.001), no weight decay
    assert "grouped_adam: group ssm: 10 tensors, lr x2.0, weight decay 0.0" in log
    assert "grouped_adam: group default:" in log and "weight decay 0.01" in log
    hyps = [line for line in res.stdout.splitlines() if line.startswith("H-")]
    assert len(hyps) == 4


# ---------------------------------------------------------------------------- fused gated FFN (training memory)
def _plain_ffn(ff, h, mask=None, p=0.0):
    """The obviously-correct expression, with an explicit dropout mask."""
    from lsg_layers.modules.t5_layers import gelu_new

    x = gelu_new(ff.wi_0(h)) * ff.wi_1(h)
    if mask is not None:
        x = x * mask / (1 - p)
    return ff.wo(x)


def test_gated_gelu_ffn_gradcheck_float64():
    from lsg_layers.modules.t5_layers import GatedGeluFFN

    torch.manual_seed(0)
    h = torch.randn(2, 5, 4, dtype=torch.float64, requires_grad=True)
    w0, w1 = (torch.randn(6, 4, dtype=torch.float64, requires_grad=True) for _ in range(2))
    wo = torch.randn(4, 6, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda *a: GatedGeluFFN.apply(*a, 0.0), (h, w0, w1, wo))

    # with dropout: the mask is drawn in forward; replaying the RNG draws the same mask
    def fn(*a):
        torch.manual_seed(3)
        return GatedGeluFFN.apply(*a, 0.4)

    assert torch.autograd.gradcheck(fn, (h, w0, w1, wo))


def test_gated_gelu_ffn_equals_plain_module_with_grads():
    from lsg_layers.modules.t5_layers import T5DenseGatedGelu

    torch.manual_seed(0)
    for p in (0.0, 0.3):
        ff = T5DenseGatedGelu(8, 12, dropout=p).train()
        h = torch.randn(2, 7, 8, requires_grad=True)
        torch.manual_seed(1)
        out = ff(h)  # fused path (autograd on)
        torch.manual_seed(1)
        mask = torch.empty(2, 7, 12, dtype=torch.bool).bernoulli_(1 - p) if p > 0 else None
        ref = _plain_ffn(ff, h, mask, p)
        assert torch.allclose(out, ref, atol=1e-6)
        g = torch.randn_like(out)
        grads = torch.autograd.grad(out, [h] + list(ff.parameters()), g)
        grads_ref = torch.autograd.grad(ref, [h] + list(ff.parameters()), g)
        for a, b in zip(grads, grads_ref):
            assert torch.allclose(a, b, atol=1e-5)
    with torch.no_grad():  # eval / no grad: the plain expression
        ff.eval()
        assert torch.allclose(ff(h), _plain_ffn(ff, h), atol=1e-6)


def test_gated_gelu_ffn_keeps_only_input_and_mask():
    from lsg_layers.modules.t5_layers import T5DenseGatedGelu

    ff = T5DenseGatedGelu(8, 32, dropout=0.1).train()
    h = torch.randn(1, 50, 8, requires_grad=True)
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        ff(h)
    big = [t for t in saved if t.dtype.is_floating_point and t.numel() >= 50 * 32]
    assert big == [], [t.shape for t in big]  # no (.., d_ff) float tensor kept


@pytest.mark.parametrize("dtype,ulp", [(torch.float32, 2**-22), (torch.bfloat16, 2**-7), (torch.float16, 2**-10)])
def test_t5_layer_norm_fused_form_is_hfs_within_a_rounding(dtype, ulp, monkeypatch):
    """T5LayerNorm's fused form (``F.rms_norm``: CUDA's kernels where x and the weight share a dtype;
    forced here on CPU, torch's composite of the same function) against HF's operations
    (``reference``): values and gradients within one rounding of the output dtype, relative to the
    largest entry. A CPU tensor takes HF's operations, bit for bit."""
    from lsg_layers.modules.t5_layers import T5LayerNorm

    g = torch.Generator().manual_seed(0)
    norm = T5LayerNorm(768, eps=1e-6)
    with torch.no_grad():
        norm.weight.copy_(torch.rand(768, generator=g) + 0.5)
    norm = norm.to(dtype)
    x = (torch.randn(3, 257, 768, generator=g) * 3).to(dtype).requires_grad_(True)
    assert not norm.fused(x) and torch.equal(norm(x), norm.reference(x))
    monkeypatch.setattr(T5LayerNorm, "fused", lambda self, x: x.dtype == self.weight.dtype)
    fused, reference = norm(x), norm.reference(x)
    assert fused.dtype == reference.dtype == dtype
    assert (fused.float() - reference.float()).abs().max() <= ulp * reference.float().abs().max()
    grad = torch.randn(fused.shape, generator=g).to(dtype)
    for a, b in zip(
        torch.autograd.grad(fused, (x, norm.weight), grad), torch.autograd.grad(reference, (x, norm.weight), grad)
    ):
        assert (a.float() - b.float()).abs().max() <= 4 * ulp * b.float().abs().max()


def test_fused_norms_give_the_models_outputs(tiny, monkeypatch):
    """Every T5LayerNorm of the model in its fused form (forced on CPU): the logits of a padded
    batch within float32 rounding of HF's operations."""
    from lsg_layers.modules.t5_layers import T5LayerNorm

    task, model = tiny
    sample = batch(task, "valid", 3)["net_input"]
    with torch.no_grad():
        reference = model(**sample)[0]
        monkeypatch.setattr(T5LayerNorm, "fused", lambda self, x: x.dtype == self.weight.dtype)
        fused = model(**sample)[0]
    assert torch.allclose(fused, reference, rtol=1e-5, atol=1e-5), (fused - reference).abs().max()


@pytest.mark.parametrize("beam", [1, 2])
def test_a_beam_search_step_reads_nothing_from_the_device(tiny, beam):
    """Past the first step, a decoding step of beam search (the generator's reorder, then the
    decoder) hands no device value to the host: on a GPU each read waits for every queued kernel,
    and the cross-attention caches used to be checked in every layer at every step (and the source
    padding at every step). Nor does it copy the cross-attention caches while every source keeps
    hypotheses (at beam 1 they were selected at every step: each layer's source keys copied).
    Counted on CPU by dispatcher op; the outputs are held by test_beamable_cross_attention_equals_tiled
    and test_incremental_equals_full_decoding."""
    op_count = load_script("benchmarks/op_count.py", "op_count")
    task, model = tiny
    sample = batch(task, "valid", 2)
    src, lengths = sample["net_input"]["src_tokens"][:, :60].clone(), torch.tensor([60, 40])
    src[1, 40:] = task.src_dict.pad()  # a padded source: the cross-attention bias is in play
    tokens = torch.full((2 * beam, 3), task.tgt_dict.eos())
    tokens[:, 1:] = torch.randint(4, 40, (2 * beam, 2), generator=torch.Generator().manual_seed(0))
    new_order = torch.tensor([1, 1, 2, 3][: 2 * beam])  # beam 2, source 0: beam 1 twice; source 1 as it was
    model.set_beam_size(beam)
    try:
        with torch.no_grad():
            enc = model.encoder(src, lengths)
            enc = model.encoder.reorder_encoder_out(enc, torch.arange(2).repeat_interleave(beam))
            state = {}
            model.decoder(tokens[:, :1], encoder_out=enc, incremental_state=state)
            with op_count.OpCounter() as counter:
                model.decoder.reorder_incremental_state_scripting(state, new_order)
                enc = model.encoder.reorder_encoder_out(enc, new_order)
                model.decoder(tokens[new_order, :2], encoder_out=enc, incremental_state=state)
    finally:
        model.set_beam_size(1)
    assert counter.reads == 0, {name: n for name, n in counter.ops.items() if name in op_count.READS}
    # the self-attention caches of 2 layers (k, v); the cross-attention caches: none (nor, at beam 1,
    # the encoder output, which reorder_encoder_out selects: 6 tensors' worth beside)
    cross = counter.ops["index_select"] - 2 * 2 - (0 if beam > 1 else 4)
    assert cross == 0, counter.ops["index_select"]
