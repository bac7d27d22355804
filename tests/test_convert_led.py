"""Converter (led family) and conformance on tests/data/fixtures/led (HF LEDForConditionalGeneration).

spec/led.md sections 7-8 and fixtures/led/README.md: converted HF LED weights must give HF's
encoder outputs and logits to 1e-4 (fp32, eval) with global attention first / multi / none.
"""

import os
import shutil

import numpy as np
import pytest
import torch

import lsg_fairseq  # noqa: F401
from fairseq import checkpoint_utils

from conftest import FIXTURES, edit_config
from lsg_fairseq.cli.convert import main as cli_main
from lsg_fairseq.convert import ConversionError, convert

LED = os.path.join(FIXTURES, "led")
HF = os.path.join(LED, "led_w32", "hf")
BART = os.path.join(FIXTURES, "lsg", "bart_plain", "hf")
TOL = 1e-4


pytestmark = pytest.mark.usefixtures("single_thread")  # conftest: tiny tensors, one thread


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("led") / "led_w32")
    assert convert(HF, out) == os.path.join(out, "model.pt")
    return out


def load(folder, **overrides):
    models, cfg, task = checkpoint_utils.load_model_ensemble_and_task(
        [os.path.join(folder, "model.pt")], arg_overrides=overrides or None
    )
    return models[0].eval(), cfg


def inputs(S):
    data = np.load(os.path.join(LED, "inputs.npz"))
    return {k[len(S) + 1 :]: torch.from_numpy(data[k]) for k in data.files if k.startswith(S + "_")}


def run(model, x, glob=None, all_hiddens=False):
    with torch.no_grad():
        enc = model.encoder(x["input_ids"], x["lengths"], return_all_hiddens=all_hiddens, global_attention_mask=glob)
        logits, _ = model.decoder(x["decoder_input_ids"], encoder_out=enc)
    return enc, logits


def max_diff(enc, logits, expected, S, G, lengths):
    out = enc["encoder_out"][0].transpose(0, 1).numpy()  # (B, T, C)
    ref = expected[f"{S}_{G}_encoder_out"]
    e = max(np.abs(out[i, :n] - ref[i, :n]).max() for i, n in enumerate(lengths))  # valid rows only
    return e, np.abs(logits.numpy() - expected[f"{S}_{G}_logits"]).max()


@pytest.mark.parametrize("S", ["short", "mid", "long"])
def test_fixture_conformance(converted, S, layer_path):
    expected = np.load(os.path.join(LED, "led_w32", "outputs.npz"))
    first, _ = load(converted)  # default --global-attention first
    none, _ = load(converted, global_attention="none")
    x = inputs(S)
    lengths = x["lengths"].tolist()
    cases = {
        "first": run(first, x),  # the configured mode: first real token global
        "multi": run(first, x, x["global_attention_mask_multi"].bool()),  # explicit per-token mask
        "none": run(none, x),  # --global-attention none
    }
    for G, (enc, logits) in cases.items():
        e, lg = max_diff(enc, logits, expected, S, G, lengths)
        assert e <= TOL and lg <= TOL, (S, G, e, lg)
    # the explicit mask reproduces the modes too, and the modes really differ
    e, lg = max_diff(*run(none, x, x["global_attention_mask_first"].bool()), expected, S, "first", lengths)
    assert e <= TOL and lg <= TOL
    e, lg = max_diff(*run(first, x, x["global_attention_mask_none"].bool()), expected, S, "none", lengths)
    assert e <= TOL and lg <= TOL
    e, _ = max_diff(*cases["first"], expected, S, "none", lengths)
    assert e > 0.1  # global attention changes the outputs: the check above can fail


def test_layer_outputs_and_left_padding(converted):
    expected = np.load(os.path.join(LED, "led_w32", "outputs.npz"))["mid_first_encoder_hidden_states"]
    model, _ = load(converted)
    x = inputs("mid")
    enc, _ = run(model, x, all_hiddens=True)
    states = enc["encoder_states"]
    assert len(states) == 3
    for s, ref in zip(states, expected):
        s = s.transpose(0, 1).numpy()
        for i, n in enumerate(x["lengths"].tolist()):
            assert np.abs(s[i, :n] - ref[i, :n]).max() <= TOL
    # left padding: pad-aware positions, and "first" picks the first REAL token
    ids, n1 = x["input_ids"], int(x["lengths"][1])
    left = torch.full_like(ids[1:], 1)
    left[0, ids.size(1) - n1 :] = ids[1, :n1]
    with torch.no_grad():
        out = model.encoder(left, x["lengths"][1:])["encoder_out"][0][:, 0]  # (T, C)
    ref = enc["encoder_out"][0][:n1, 1]
    assert (out[ids.size(1) - n1 :] - ref).abs().max() <= 1e-5


def test_weight_level_facts(converted):
    from safetensors.torch import load_file

    hf = load_file(os.path.join(HF, "model.safetensors"))
    ckpt = torch.load(os.path.join(converted, "model.pt"), weights_only=True)
    sd = ckpt["model"]
    enc_pos, dec_pos = sd["encoder.embed_positions.weight"], sd["decoder.embed_positions.weight"]
    assert enc_pos.shape == (1026, 64) and dec_pos.shape == (130, 64)
    assert torch.equal(enc_pos[2:], hf["led.encoder.embed_positions.weight"])
    assert torch.equal(dec_pos[2:], hf["led.decoder.embed_positions.weight"])
    assert not enc_pos[:2].any() and not dec_pos[:2].any()
    for n in range(2):
        src = f"led.encoder.layers.{n}.self_attn."
        dst = f"encoder.layers.{n}.self_attn."
        for hf_name, name in [
            ("query", "q_proj"),
            ("key", "k_proj"),
            ("value", "v_proj"),
            ("query_global", "q_proj_global"),
            ("key_global", "k_proj_global"),
            ("value_global", "v_proj_global"),
        ]:
            for p in ("weight", "bias"):
                assert torch.equal(sd[f"{dst}{name}.{p}"], hf[f"{src}longformer_self_attn.{hf_name}.{p}"])
        assert torch.equal(sd[f"{dst}out_proj.weight"], hf[f"{src}output.weight"])
    for k in ("encoder.embed_tokens.weight", "decoder.embed_tokens.weight", "decoder.output_projection.weight"):
        assert torch.equal(sd[k], hf["led.shared.weight"])
    model_args = ckpt["cfg"]["model"]
    assert model_args.arch == "led_base" and model_args.attention_window == "32,32"
    assert (model_args.max_source_positions, model_args.max_target_positions) == (1024, 128)
    assert model_args.encoder_layers == 2 and model_args.no_scale_embedding
    with open(os.path.join(converted, "dict.txt")) as f:
        assert len(f.readlines()) == 500 - 5  # ids 4..498; the task adds <mask> = 499


def test_window_override(converted, tmp_path):
    out = str(tmp_path / "w")
    convert(HF, out, attention_window="16,64", global_attention="none")
    model, cfg = load(out)
    assert [layer.self_attn.attention_window for layer in model.encoder.layers] == [16, 64]
    assert cfg.model.global_attention == "none"
    a = torch.load(os.path.join(out, "model.pt"), weights_only=True)["model"]
    b = torch.load(os.path.join(converted, "model.pt"), weights_only=True)["model"]
    assert all(torch.equal(a[k], b[k]) for k in b)


def test_bart_to_led(tmp_path):
    out = str(tmp_path / "bart_led")
    bart_out = str(tmp_path / "bart")
    convert(BART, out, to="led", attention_window=16, max_source_positions=1500)
    convert(BART, bart_out)
    led = torch.load(os.path.join(out, "model.pt"), weights_only=True)
    bart = torch.load(os.path.join(bart_out, "model.pt"), weights_only=True)["model"]
    sd = led["model"]
    assert set(sd) == set(bart) | {
        f"encoder.layers.{n}.self_attn.{p}_proj_global.{w}" for n in range(2) for p in "qkv" for w in ("weight", "bias")
    }
    for n in range(2):
        for p in "qkv":
            for w in ("weight", "bias"):
                key = f"encoder.layers.{n}.self_attn.{p}_proj.{w}"
                assert torch.equal(sd[key.replace("_proj.", "_proj_global.")], bart[key])
    old = bart["encoder.embed_positions.weight"]  # 512 positions + 2 rows
    new = sd["encoder.embed_positions.weight"]
    assert new.shape == (1502, 64)
    assert torch.equal(new[:2], old[:2])
    t = torch.arange(1500)
    assert torch.equal(new[2 + t], old[2 + t % 512])
    assert torch.equal(sd["decoder.embed_positions.weight"], bart["decoder.embed_positions.weight"])
    assert led["cfg"]["model"].attention_window == "16,16"
    for name in ("encoder.json", "vocab.bpe", "dict.txt"):
        assert os.path.exists(os.path.join(out, name))

    # a window covering the whole input, with global projections = local ones, is BART's full
    # attention: same outputs as the BART model, with or without the global token
    wide = str(tmp_path / "wide")
    convert(BART, wide, to="led", attention_window=1024, max_source_positions=512)
    led_model, _ = load(wide)
    bart_model, _ = load(bart_out)
    g = torch.Generator().manual_seed(0)
    src = torch.randint(4, 499, (2, 300), generator=g)
    src[:, 0], src[0, -1], src[1, 200] = 0, 2, 2
    src[1, 201:] = 1
    lengths = torch.tensor([300, 201])
    with torch.no_grad():
        ref = bart_model.encoder(src, lengths)["encoder_out"][0]
        for mode in ("first", "none"):
            led_model.encoder.global_attention = mode
            got = led_model.encoder(src, lengths)["encoder_out"][0]
            assert (got[:, 0] - ref[:, 0]).abs().max() < 1e-4
            assert (got[:201, 1] - ref[:201, 1]).abs().max() < 1e-4
        led_small, _ = load(out)  # window 16: now it differs
        small = led_small.encoder(src, lengths)["encoder_out"][0]
    assert (small[:, 0] - ref[:, 0]).abs().max() > 1e-2


@pytest.mark.parametrize("prefix", ["led.", ""])
def test_pytorch_bin_with_tied_copies(converted, tmp_path, prefix):
    """Old .bin files store the tied embeddings 3 more times; an LEDModel file has no prefix."""
    from safetensors.torch import load_file

    src = str(tmp_path / "src")
    shutil.copytree(HF, src)
    sd = load_file(os.path.join(src, "model.safetensors"))
    os.remove(os.path.join(src, "model.safetensors"))
    shared = sd["led.shared.weight"]
    sd.update({"led.encoder.embed_tokens.weight": shared, "led.decoder.embed_tokens.weight": shared})
    if prefix:
        sd["lm_head.weight"] = shared
    else:
        sd.pop("final_logits_bias")
    torch.save({k.replace("led.", prefix, 1): v for k, v in sd.items()}, os.path.join(src, "pytorch_model.bin"))
    convert(src, str(tmp_path / "out"))
    a = torch.load(os.path.join(tmp_path, "out", "model.pt"), weights_only=True)["model"]
    b = torch.load(os.path.join(converted, "model.pt"), weights_only=True)["model"]
    assert set(a) == set(b) and all(torch.equal(a[k], b[k]) for k in b)


def copy_hf(dst):
    shutil.copytree(HF, dst)
    return dst


@pytest.mark.parametrize(
    "changes,message",
    [
        ({"attention_window": [32, 31]}, "attention_window must be a positive even integer"),
        ({"attention_window": [32, 32, 32]}, "attention_window has 3 entries but the encoder has 2"),
        ({"attention_window": 0}, "attention_window must be a positive even integer"),
        ({"max_encoder_position_embeddings": 2048}, "encoder position table has 1024 positions"),
        ({"encoder_ffn_dim": 96}, "shape mismatch.*fc1"),
    ],
)
def test_refuses_bad_configs(tmp_path, changes, message):
    src = copy_hf(str(tmp_path / "src"))
    edit_config(src, **changes)
    with pytest.raises(ConversionError, match=message):
        convert(src, str(tmp_path / "out"))


def test_refuses_bad_weights_and_options(tmp_path):
    from safetensors.torch import load_file, save_file

    src = copy_hf(str(tmp_path / "src"))
    path = os.path.join(src, "model.safetensors")
    sd = load_file(path)
    sd = {k: v.clone() for k, v in sd.items()}  # no shared storage: safetensors refuses it
    save_file({**sd, "final_logits_bias": torch.full((1, 500), 0.5)}, path)
    with pytest.raises(ConversionError, match="final_logits_bias"):
        convert(src, str(tmp_path / "out1"))
    save_file({k: v for k, v in sd.items() if "key_global" not in k}, path)
    with pytest.raises(ConversionError, match="missing: .*k_proj_global"):
        convert(src, str(tmp_path / "out2"))
    extra = "led.encoder.layers.0.self_attn.longformer_self_attn.extra.weight"
    save_file({**sd, extra: sd["led.shared.weight"].clone()}, path)
    with pytest.raises(ConversionError, match="unexpected encoder attention tensor"):
        convert(src, str(tmp_path / "out3"))
    with pytest.raises(ConversionError, match="--attention-window"):
        convert(HF, str(tmp_path / "out4"), attention_window="32,33")
    with pytest.raises(ConversionError, match="not re-tiled"):
        convert(HF, str(tmp_path / "out5"), max_source_positions=4096)
    with pytest.raises(ConversionError, match="converts to led only"):
        convert(HF, str(tmp_path / "out6"), to="bart")
    with pytest.raises(ConversionError, match="unknown option"):
        convert(HF, str(tmp_path / "out7"), block_size=4)
    with pytest.raises(ConversionError, match="unknown option"):  # LED flags are not BART's
        convert(BART, str(tmp_path / "out8"), attention_window=16)


def test_cli(tmp_path, capsys):
    out = str(tmp_path / "cli")
    cli_main(
        [
            BART,
            out,
            "--to",
            "led",
            "--attention-window",
            "8",
            "--max-source-positions",
            "600",
            "--global-token-ids",
            "2",
        ]
    )
    assert capsys.readouterr().out.strip() == os.path.join(out, "model.pt")
    model, cfg = load(out)
    assert cfg.model.arch == "led_base" and cfg.model.global_token_ids == "2"
    assert model.encoder.layers[1].self_attn.attention_window == 8
    assert model.max_positions()[0] == 600
    with pytest.raises(SystemExit) as e:
        cli_main([HF, str(tmp_path / "bad"), "--attention-window", "5"])
    assert e.value.code == 2
    assert "argument --attention-window: must be a positive even integer" in capsys.readouterr().err


def test_hub_loading(tmp_path):
    from lsg_fairseq.models.led import LEDModel

    out = str(tmp_path / "hub")
    convert(BART, out, to="led", attention_window=16, max_source_positions=2048)
    hub = LEDModel.from_pretrained(out)
    assert isinstance(hub.model, LEDModel)
    assert hub.model.max_positions()[0] == 2048
    src = torch.tensor([0] + [4 + i % 490 for i in range(1500)] + [2])  # longer than BART's 512
    assert hub.max_source_tokens == 2048  # the hub does not cut sources to 1,024 tokens
    hyps = hub.generate([src], beam=2, max_len_b=5)
    assert len(hyps) == 1 and hyps[0][0]["tokens"].numel() >= 1


@pytest.mark.parametrize("to", [[], ["--to", "lsg_bart"]], ids=["own", "to_lsg_bart"])
def test_fairseq_led_checkpoint_refused_naming_what_converts(converted, tmp_path, capsys, to):
    """A led_* checkpoint written here is one (it used to read "not ... a fairseq checkpoint written
    by lsg-fairseq", and with --to "a ... checkpoint this converter knows"): say what converts, and
    that lsg-fairseq-export makes its HF folder."""
    ckpt = os.path.join(converted, "model.pt")
    with pytest.raises(SystemExit) as e:
        cli_main([ckpt, str(tmp_path / "out"), *to])
    err = capsys.readouterr().err
    assert e.value.code == 2 and len(err.splitlines()) == 1, err
    assert f"{ckpt}: a fairseq led_base checkpoint; lsg-fairseq-convert takes HF folders and fairseq " in err
    assert "checkpoints of bart_* and lsg_bart_* archs only" in err
    assert f"lsg-fairseq-export {ckpt} HF_DIR" in err
    assert os.listdir(tmp_path) == []
