"""Conformance: the LOCOST fixture converted to fairseq reproduces the reference's outputs.

Fixture: ``tests/data/fixtures/locost`` (README there). Tolerances from the README: encoder output
and logits <= 1e-4 (fp32), layer-0 kernels <= 1e-5.
"""

import json
import os

import numpy as np
import pytest
import torch

import lsg_fairseq  # noqa: F401
from conftest import DOCUMENTS, FIXTURES
from lsg_fairseq.convert import ConversionError, convert, detect_family

FIXTURE = os.path.join(FIXTURES, "locost")


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    from fairseq import checkpoint_utils

    out = tmp_path_factory.mktemp("locost_conv")
    path = convert(os.path.join(FIXTURE, "model"), str(out))
    models, cfg, task = checkpoint_utils.load_model_ensemble_and_task([path])
    model = models[0].eval()
    with open(out / "token_map.json") as f:
        token_map = json.load(f)
    return {"out": out, "model": model, "task": task, "cfg": cfg, "token_map": token_map}


@pytest.fixture(scope="module")
def io():
    return dict(np.load(os.path.join(FIXTURE, "reference_io.npz")))


def hf_to_fairseq(token_map):
    """HF id -> fairseq index for source / target tokens (index 0, the decoder start, excluded)."""
    inv = {}
    for idx, hf in enumerate(token_map):
        if idx == 0:
            continue
        inv.setdefault(hf, idx)
    return inv


def test_detect_and_files(converted):
    assert detect_family(os.path.join(FIXTURE, "model")).name == "locost"
    out = converted["out"]
    for name in ("model.pt", "dict.txt", "token_map.json"):
        assert (out / name).exists(), name
    tm = converted["token_map"]
    d = converted["task"].source_dictionary
    assert len(tm) == len(d) == 502  # 500 HF rows + <s> (start) + <mask>
    assert tm[:4] == [0, 0, 1, 2]  # <s> = start row (HF 0), <pad> = HF pad 0, </s> = 1, <unk> = 2
    assert sorted(set(tm)) == list(range(500))
    assert d.pad() == 1 and d.eos() == 2 and d.bos() == 0


def test_weights_tied_and_permuted(converted):
    model = converted["model"]
    sd = torch.load(os.path.join(FIXTURE, "model", "pytorch_model.bin"), map_location="cpu")
    shared = sd["shared.weight"]
    tm = torch.tensor(converted["token_map"])
    emb = model.encoder.embed_tokens.weight
    assert emb is model.decoder.embed_tokens.weight
    assert model.decoder.output_projection.weight is emb
    assert torch.equal(emb, shared[tm])
    # only decoder layer 0 owns the relative position bias (32 buckets x 4 heads)
    names = [n for n, _ in model.named_parameters() if "relative_attention_bias" in n]
    assert names == ["decoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight"]
    assert not any("position" in n for n, _ in model.encoder.named_parameters())
    # every reference tensor arrived unchanged
    msd = model.state_dict()
    for k, v in sd.items():
        if k.startswith(("encoder.block", "decoder.block")) or k.endswith("final_layer_norm.weight"):
            assert torch.equal(msd[k], v), k


def test_kernels_layer0(converted):
    ref = np.load(os.path.join(FIXTURE, "kernels_layer0.npz"))
    layer = converted["model"].encoder.block[0].layer[0].ssm_layer
    with torch.no_grad():
        k = layer.kernel(int(ref["L"])).numpy()
    assert np.abs(k - ref["kernel_raw"]).max() <= 1e-5


def _run(converted, io, rows, start_with_eos=False):
    model = converted["model"]
    inv = hf_to_fairseq(converted["token_map"])
    ids = io["input_ids"][rows]
    mask = io["attention_mask"][rows].astype(bool)
    L = int(mask.sum(1).max())
    src = np.vectorize(inv.get)(ids[:, :L])
    src[~mask[:, :L]] = model.encoder.padding_idx
    dec = io["decoder_input_ids"][rows]
    prev = np.vectorize(inv.get)(dec)
    assert (dec[:, 0] == 0).all()
    prev[:, 0] = 2 if start_with_eos else 0  # fairseq's </s> (what fairseq feeds) or <s> (HF row 0)
    src, prev = torch.from_numpy(src), torch.from_numpy(prev)
    with torch.no_grad():
        enc = model.encoder(src, torch.from_numpy(mask[:, :L].sum(1)))
        logits, _ = model.decoder(prev, encoder_out=enc)
    enc_out = enc["encoder_out"][0].transpose(0, 1).numpy()  # (B L C)
    # logits at fairseq indices -> HF id order (index 0 <s> duplicates HF 0; take index 1 = pad)
    tm = np.array(converted["token_map"])
    cols = np.array([inv[h] for h in range(500)])
    assert (tm[cols] == np.arange(500)).all()
    return enc_out, logits.numpy()[..., cols], mask[:, :L]


@pytest.mark.parametrize("start_with_eos", [False, True])
def test_encoder_and_logits_match_reference(converted, io, start_with_eos, layer_path):
    enc, logits, mask = _run(converted, io, [0, 1], start_with_eos)
    ref_enc = io["encoder_last_hidden_state"]
    diff_enc = np.abs(enc - ref_enc[:, : enc.shape[1]])[mask].max()
    diff_logits = np.abs(logits - io["logits"]).max()
    assert diff_enc <= 1e-4, diff_enc
    assert diff_logits <= 1e-4, diff_logits


def test_short_row_alone_matches(converted, io):
    """Row 1 (1234 tokens) without padding: L = 1234, not the batch's 3000."""
    enc, logits, mask = _run(converted, io, [1])
    assert enc.shape[1] == 1234
    assert np.abs(enc[0] - io["encoder_last_hidden_state"][1, :1234]).max() <= 1e-4
    assert np.abs(logits - io["logits"][1:2]).max() <= 1e-4


def test_intermediate_ssm_block(converted, io):
    """Localising check: layer-0 SSM block input / output against the fixture."""
    block = converted["model"].encoder.block[0].layer[0]
    mask = torch.from_numpy(io["attention_mask"] == 0)
    with torch.no_grad():
        out = block.ssm_layer(torch.from_numpy(io["ssm0_input"]), mask).numpy()
    assert np.abs(out - io["ssm0_output"])[~mask.numpy()].max() <= 1e-4


def test_generation_from_converted_checkpoint(converted, io):
    """Greedy generation through fairseq's SequenceGenerator == step-wise argmax of the full model."""
    from fairseq.sequence_generator import SequenceGenerator

    model, task = converted["model"], converted["task"]
    inv = hf_to_fairseq(converted["token_map"])
    n = 300
    src = torch.tensor([[inv[int(t)] for t in io["input_ids"][1, : n - 1]] + [2]])
    gen = SequenceGenerator([model], task.target_dictionary, beam_size=1, max_len_b=8, min_len=8)
    sample = {"net_input": {"src_tokens": src, "src_lengths": torch.tensor([n])}}
    with torch.no_grad():
        hyp = gen.generate([model], sample)[0][0]["tokens"]
        prev = torch.tensor([[2]])
        enc = model.encoder(src, torch.tensor([n]))
        for _ in range(8):
            logits, _ = model.decoder(prev, encoder_out=enc)
            lp = logits[0, -1].clone()
            lp[task.target_dictionary.pad()] = -float("inf")
            lp[task.target_dictionary.eos()] = -float("inf")  # min_len: eos banned before step 8
            prev = torch.cat([prev, lp.argmax().view(1, 1)], 1)
    assert hyp[:8].tolist() == prev[0, 1:].tolist()


def test_refusals(tmp_path):
    src = tmp_path / "bad"
    src.mkdir()
    cfg = json.load(open(os.path.join(FIXTURE, "model", "config.json")))
    for key, value, match in [
        ("num_ssm_heads", 2, "num_ssm_heads"),
        ("tie_word_embeddings", False, "tie_word_embeddings"),
        ("feed_forward_proj", "relu", "feed_forward_proj"),
        ("d_state", 33, "d_state"),
    ]:
        bad = dict(cfg, **{key: value})
        (src / "config.json").write_text(json.dumps(bad))
        with pytest.raises(ConversionError, match=match):
            convert(str(src), str(tmp_path / "out"))
    # unknown options are refused by name
    (src / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ConversionError, match="block_size"):
        convert(str(src), str(tmp_path / "out"), block_size=64)
    # weights that do not fit are reported, not silently dropped
    sd = torch.load(os.path.join(FIXTURE, "model", "pytorch_model.bin"), map_location="cpu")
    sd["encoder.block.0.layer.0.ssm_layer.v_proj.weight"] = torch.zeros(64, 64)
    torch.save(sd, src / "pytorch_model.bin")
    with pytest.raises(ConversionError, match="v_proj"):
        convert(str(src), str(tmp_path / "out2"))


# ---------------------------------------------------------------------------- with a T5-style tokenizer
@pytest.fixture(scope="module")
def spm_locost(tmp_path_factory):
    """The fixture's weights cut to a 220-row vocabulary + a tiny T5-layout sentencepiece model
    (pad 0, eos 1, unk 2, no bos; 120 pieces + 100 <extra_id_*>), converted."""
    import io as _io

    import sentencepiece as spm

    root = tmp_path_factory.mktemp("spm_locost")
    text_path = os.path.join(DOCUMENTS, "sumpubmed", "train.jsonl")
    with open(text_path, encoding="utf-8") as f:
        docs = [json.loads(next(f))["document"] for _ in range(20)]
    model = _io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter([s for d in docs for s in d.split(". ")]),
        model_writer=model,
        vocab_size=120,
        model_type="unigram",
        pad_id=0,
        eos_id=1,
        unk_id=2,
        bos_id=-1,
        minloglevel=2,
    )
    src = root / "hf"
    src.mkdir()
    (src / "spiece.model").write_bytes(model.getvalue())
    cfg = json.load(open(os.path.join(FIXTURE, "model", "config.json")))
    (src / "config.json").write_text(json.dumps(dict(cfg, vocab_size=220)))
    sd = torch.load(os.path.join(FIXTURE, "model", "pytorch_model.bin"), map_location="cpu")
    for k in ("shared.weight", "encoder.embed_tokens.weight", "decoder.embed_tokens.weight", "lm_head.weight"):
        sd[k] = sd[k][:220].clone()
    torch.save(sd, src / "pytorch_model.bin")
    out = root / "out"
    convert(str(src), str(out))
    sp = spm.SentencePieceProcessor(model_proto=model.getvalue())
    return {"out": out, "sp": sp, "docs": docs}


def test_dictionary_symbols_follow_sentencepiece(spm_locost):
    out, sp = spm_locost["out"], spm_locost["sp"]
    assert (out / "spm.model").exists()
    symbols = [line.rsplit(" ", 1)[0] for line in open(out / "dict.txt", encoding="utf-8")]
    assert symbols[: 120 - 3] == [sp.id_to_piece(i) for i in range(3, 120)]
    assert symbols[117:] == [f"<extra_id_{k}>" for k in range(99, -1, -1)]
    tm = json.load(open(out / "token_map.json"))
    assert len(tm) == 4 + 217 + 1 and tm[:4] == [0, 0, 1, 2]
    assert tm[-1] == 219  # the task's <mask> reuses <extra_id_0>'s row


def test_hub_encodes_like_t5_and_generates(spm_locost):
    from lsg_fairseq.models.hub import from_pretrained

    out, sp = spm_locost["out"], spm_locost["sp"]
    hub = from_pretrained(str(out))
    hub.eval()
    tm = json.load(open(out / "token_map.json"))
    text = " ".join(spm_locost["docs"][0].split()[:60])
    ids = hub.encode(text)
    assert [tm[i] for i in ids.tolist()] == sp.encode(text) + [1]  # HF T5 tokenizer ids + eos, no bos
    hyps = hub.sample([text], beam=2, max_len_b=6)
    assert isinstance(hyps[0], str)
    # the hub left the model usable for a batch of 1 (no sticky beam size)
    with torch.no_grad():
        enc = hub.model.encoder(ids.unsqueeze(0), torch.tensor([len(ids)]))
        logits, _ = hub.model.decoder(torch.tensor([[2, 5]]), encoder_out=enc)
    assert logits.shape == (1, 2, len(tm))


def test_safetensors_with_tied_weights_stored_once(tmp_path, converted):
    """Newer HF saves keep one copy of tied tensors (shared.weight only) in model.safetensors."""
    from safetensors.torch import save_file

    src = tmp_path / "st"
    src.mkdir()
    sd = torch.load(os.path.join(FIXTURE, "model", "pytorch_model.bin"), map_location="cpu")
    for k in ("encoder.embed_tokens.weight", "decoder.embed_tokens.weight", "lm_head.weight"):
        del sd[k]
    save_file({k: v.contiguous() for k, v in sd.items()}, str(src / "model.safetensors"))
    (src / "config.json").write_text(open(os.path.join(FIXTURE, "model", "config.json")).read())
    path = convert(str(src), str(tmp_path / "out"), max_source_positions=16384)
    ck = torch.load(path, map_location="cpu", weights_only=False)
    ref = converted["model"].state_dict()
    assert ck["model"].keys() == ref.keys()
    assert all(torch.equal(ck["model"][k], ref[k]) for k in ref)
    assert ck["cfg"]["model"].max_source_positions == 16384


def test_fairseq_locost_checkpoint_refused_naming_what_converts(converted, tmp_path, capsys):
    """A locost_* checkpoint written here: what converts, and lsg-fairseq-export for its HF folder."""
    from lsg_fairseq.cli.convert import main

    with pytest.raises(SystemExit) as e:
        main([str(converted["out"]), str(tmp_path / "out")])  # the folder: its model.pt
    err = capsys.readouterr().err
    assert e.value.code == 2 and len(err.splitlines()) == 1, err
    assert f"{converted['out']}: a fairseq locost_base checkpoint; " in err
    assert "fairseq checkpoints of bart_* and lsg_bart_* archs only" in err
    assert f"lsg-fairseq-export {converted['out']} HF_DIR" in err
    assert os.listdir(tmp_path) == []
