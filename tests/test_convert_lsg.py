"""Converter (bart family) against the reference fixtures in tests/data/fixtures/lsg (spec/lsg.md)."""

import json
import os
import re
import shlex
import shutil

import numpy as np
import pytest
import torch

import lsg_fairseq  # noqa: F401
from fairseq import checkpoint_utils

import conftest
from lsg_fairseq.cli.convert import main as cli_main
from lsg_fairseq.convert import ConversionError, convert
from lsg_fairseq.convert.bart_state import extend_positions
from lsg_fairseq.convert.lsg_init import init_global_embeddings

FIXTURES = os.path.join(conftest.FIXTURES, "lsg")
FOLDERS = ["bart_plain", "lsg_none", "lsg_norm", "lsg_pooling"]
LSG_AS_FIXTURES = dict(
    max_source_positions=1024,
    num_global_tokens=4,
    block_size=32,
    sparse_block_size=32,
    sparsity_factor=2,
    sparsity_type="norm",
)


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    root = tmp_path_factory.mktemp("converted")
    out = {}
    for name in FOLDERS:
        out[name] = str(root / name)
        convert(os.path.join(FIXTURES, name, "hf"), out[name])
    out["plain_to_lsg"] = str(root / "plain_to_lsg")
    convert(os.path.join(FIXTURES, "bart_plain", "hf"), out["plain_to_lsg"], **LSG_AS_FIXTURES)
    return out


def load(folder):
    models, cfg, task = checkpoint_utils.load_model_ensemble_and_task([os.path.join(folder, "model.pt")])
    return models[0].eval(), task


def run(model, S):
    inputs = np.load(os.path.join(FIXTURES, "inputs.npz"))
    ids = torch.from_numpy(inputs[f"{S}_input_ids"])
    lengths = torch.from_numpy(inputs[f"{S}_lengths"])
    dec = torch.from_numpy(inputs[f"{S}_decoder_input_ids"])
    with torch.no_grad():
        enc = model.encoder(ids, src_lengths=lengths)["encoder_out"][0].transpose(0, 1)
        logits, _ = model(ids, lengths, dec)
    return enc.numpy(), logits.numpy(), lengths.tolist()


@pytest.mark.parametrize("name", FOLDERS)
def test_fixture_conformance(converted, name, layer_path):
    model, _ = load(converted[name])
    expected = np.load(os.path.join(FIXTURES, name, "outputs.npz"))
    G = getattr(model.encoder, "num_global_tokens", 0)
    checked = 0
    for S in ["long", "mid", "short"]:
        if f"{S}_encoder_out" not in expected:
            continue
        enc, logits, lengths = run(model, S)
        ref = expected[f"{S}_encoder_out"]
        for i, n in enumerate(lengths):  # only valid positions: globals + real tokens
            assert np.abs(enc[i, : G + n] - ref[i, : G + n]).max() <= 1e-4, (S, i)
        assert np.abs(logits - expected[f"{S}_logits"]).max() <= 1e-4, S
        checked += 1
    assert checked == (2 if name == "bart_plain" else 3)


def test_plain_bart_to_lsg_equals_reference_conversion(converted):
    a = torch.load(os.path.join(converted["plain_to_lsg"], "model.pt"), weights_only=True)
    for name in ["lsg_none", "lsg_norm", "lsg_pooling"]:
        b = torch.load(os.path.join(converted[name], "model.pt"), weights_only=True)
        assert set(a["model"]) == set(b["model"])
        for k in a["model"]:
            assert torch.equal(a["model"][k], b["model"][k]), (name, k)
    b = torch.load(os.path.join(converted["lsg_norm"], "model.pt"), weights_only=True)
    ma, mb = vars(a["cfg"]["model"]), vars(b["cfg"]["model"])
    assert {k for k in set(ma) | set(mb) if ma.get(k) != mb.get(k)} == {"data"}


def test_global_and_position_init_facts(converted):
    sd = torch.load(os.path.join(converted["plain_to_lsg"], "model.pt"), weights_only=True)["model"]
    plain = torch.load(os.path.join(converted["bart_plain"], "model.pt"), weights_only=True)["model"]
    E, pos = plain["encoder.embed_tokens.weight"], plain["encoder.embed_positions.weight"]
    glob = sd["encoder.global_embeddings.weight"]
    assert glob.shape == (512, 64)
    assert torch.allclose(glob[0], E[0] + pos[2])
    for g in [1, 7, 8, 9, 100, 511]:
        assert torch.allclose(glob[g], E[499] + pos[2 + 64 * (g % 8) + g // 8]), g
    for key in ["encoder.embed_positions.weight", "decoder.embed_positions.weight"]:
        new, old = sd[key], plain[key]
        assert new.shape == (1026, 64)
        assert torch.equal(new[:2], old[:2])
        i = torch.arange(1024)
        assert torch.equal(new[2 + i], old[2 + i % 512])


def test_position_extension_is_exactly_m_plus_2_rows():
    old = torch.randn(1026, 4)  # P = 1024
    for M in [3076, 4096, 1000, 1]:  # 3076: the reference's repeat count falls short here
        new = extend_positions(old, M)
        assert new.shape == (M + 2, 4)
        assert torch.equal(new[2:], old[2 + torch.arange(M) % 1024])


def test_global_init_for_short_tables_is_seeded():
    E = torch.randn(10, 8)
    pos = torch.randn(2 + 100, 8)  # P = 100 < 512: rows completed from N(mean, std)
    a = init_global_embeddings(pos, E, 0, 9, 64, seed=123)
    b = init_global_embeddings(pos, E, 0, 9, 64, seed=123)
    c = init_global_embeddings(pos, E, 0, 9, 64, seed=124)
    assert torch.equal(a, b) and not torch.equal(a, c)
    assert torch.allclose(a[0], E[0] + pos[2])
    # factor 1, m = 64, 512/m = 8: g = 8 -> row 1 (real); g = 2 -> row 128 >= P (drawn)
    assert torch.allclose(a[8], E[9] + pos[3])
    assert torch.equal(a[8], c[8]) and not torch.equal(a[2], c[2])


def test_tokenizer_files(converted):
    out = converted["lsg_norm"]
    src = os.path.join(FIXTURES, "lsg_norm", "hf")
    with open(os.path.join(out, "encoder.json")) as f, open(os.path.join(src, "vocab.json")) as g:
        assert json.load(f) == json.load(g)
    with open(os.path.join(out, "vocab.bpe")) as f:
        text = f.read()
    assert text.startswith("#version") and text.endswith("\n")
    with open(os.path.join(out, "dict.txt")) as f:
        lines = f.read().splitlines()
    assert lines[0] == "4 1" and lines[-1] == "498 1" and len(lines) == 495
    assert not os.path.exists(os.path.join(out, "token_map.json"))
    _, task = load(out)
    assert len(task.source_dictionary) == 500 and task.source_dictionary.index("<mask>") == 499


def test_checkpoint_is_complete(converted):
    state = checkpoint_utils.load_checkpoint_to_cpu(os.path.join(converted["lsg_norm"], "model.pt"))
    assert state["optimizer_history"][-1]["num_updates"] == 0
    assert state["extra_state"]["train_iterator"]["epoch"] == 1
    assert state["cfg"]["model"].arch == "lsg_bart_base"
    assert state["cfg"]["task"]["_name"] == "long_document_summarization"


def test_fairseq_checkpoint_warm_start(converted, tmp_path):
    # 1024 -> 4096 positions and 4 -> 8 globals from a converted lsg_bart checkpoint
    longer = str(tmp_path / "longer")
    convert(converted["lsg_norm"], longer, max_source_positions=4096)
    more = str(tmp_path / "more")
    cli_main(
        [
            os.path.join(converted["lsg_norm"], "model.pt"),
            more,
            "--max-source-positions",
            "4096",
            "--num-global-tokens",
            "8",
        ]
    )
    base, _ = load(converted["lsg_norm"])
    m1, _ = load(longer)
    m2, _ = load(more)
    assert m1.encoder.max_positions() == 4096 and m2.encoder.num_global_tokens == 8
    old = base.encoder.embed_positions.weight
    new = m2.encoder.embed_positions.weight
    assert new.shape == (4098, 64) and torch.equal(new[2 + 3000], old[2 + 3000 % 1024])
    assert torch.equal(m2.encoder.global_embeddings.weight, base.encoder.global_embeddings.weight)
    enc0, logits0, lengths = run(base, "mid")
    enc1, logits1, _ = run(m1, "mid")
    assert np.abs(logits0 - logits1).max() < 1e-5  # only the table grew
    enc2, _, _ = run(m2, "mid")
    assert enc2.shape[1] == enc0.shape[1] + 4


def test_to_bart_from_plain(converted):
    state = torch.load(os.path.join(converted["bart_plain"], "model.pt"), weights_only=True)
    assert state["cfg"]["model"].arch == "bart_base"
    model, _ = load(converted["bart_plain"])
    assert type(model).__name__ == "BARTModel"
    assert state["model"]["encoder.embed_positions.weight"].shape == (514, 64)


# ----------------------------------------------------------------------------- refusals
def copy_hf(name, dest):
    shutil.copytree(os.path.join(FIXTURES, name, "hf"), dest)
    for f in os.listdir(dest):
        os.chmod(os.path.join(dest, f), 0o644)
    os.chmod(dest, 0o755)
    return dest


def test_refuses_missing_source(tmp_path):
    with pytest.raises(ConversionError, match="no such file"):
        convert(str(tmp_path / "nope"), str(tmp_path / "out"))


def test_refuses_missing_weights(tmp_path):
    src = copy_hf("bart_plain", str(tmp_path / "src"))
    os.remove(os.path.join(src, "model.safetensors"))
    with pytest.raises(ConversionError, match="no weights found"):
        convert(src, str(tmp_path / "out"))


def test_refuses_unknown_model_type(tmp_path):
    src = copy_hf("bart_plain", str(tmp_path / "src"))
    conftest.edit_config(src, model_type="gpt2")
    with pytest.raises(ConversionError, match="not a model this converter knows"):
        convert(src, str(tmp_path / "out"))


def test_refuses_shape_mismatch(tmp_path):
    src = copy_hf("bart_plain", str(tmp_path / "src"))
    conftest.edit_config(src, encoder_ffn_dim=96)
    with pytest.raises(ConversionError, match="shape mismatch.*fc1"):
        convert(src, str(tmp_path / "out"))


def test_refuses_nonzero_final_logits_bias(tmp_path):
    from safetensors.torch import load_file, save_file

    src = copy_hf("bart_plain", str(tmp_path / "src"))
    path = os.path.join(src, "model.safetensors")
    sd = load_file(path)
    sd["final_logits_bias"] = torch.full_like(sd.get("final_logits_bias", torch.zeros(1, 500)), 0.5)
    save_file(sd, path)
    with pytest.raises(ConversionError, match="final_logits_bias"):
        convert(src, str(tmp_path / "out"))


@pytest.mark.parametrize("length", [0, 1 << 21])
def test_refuses_unachievable_max_length(tmp_path, length):
    with pytest.raises(ConversionError, match="not achievable"):
        convert(
            os.path.join(FIXTURES, "bart_plain", "hf"),
            str(tmp_path / "out"),
            to="lsg_bart",
            max_source_positions=length,
        )


def test_refuses_bad_lsg_options(tmp_path):
    with pytest.raises(ConversionError, match="--sparsity-factor"):
        convert(os.path.join(FIXTURES, "bart_plain", "hf"), str(tmp_path / "out"), block_size=32, sparsity_factor=3)
    with pytest.raises(ConversionError, match="--to bart cannot keep"):
        convert(os.path.join(FIXTURES, "lsg_norm", "hf"), str(tmp_path / "out2"), to="bart")


def test_cli_reports_errors(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        cli_main([str(tmp_path / "missing"), str(tmp_path / "out")])
    assert e.value.code == 2
    assert "no such file" in capsys.readouterr().err


def test_hub_loading(converted):
    from lsg_fairseq.models.lsg_bart import LSGBARTModel

    hub = LSGBARTModel.from_pretrained(converted["lsg_norm"])
    assert isinstance(hub.model, LSGBARTModel)
    assert hub.model.max_positions()[0] == 1024
    src = torch.tensor([0] + list(range(4, 300)) + [2])  # longer than 2 blocks: LSG path
    hyps = hub.generate([src], beam=2, max_len_b=5)
    assert len(hyps) == 1 and hyps[0][0]["tokens"].numel() >= 1


def test_fairseq_bart_checkpoint_to_lsg_equals_hf_route(converted, tmp_path):
    # a BART trained here (fairseq checkpoint) converts to LSG exactly as its HF folder would:
    # same global-token init, same tiled tables, same settings -> identical weights and logits
    via_fairseq = str(tmp_path / "via_fairseq")
    convert(converted["bart_plain"], via_fairseq, to="lsg_bart", **LSG_AS_FIXTURES)
    a = torch.load(os.path.join(via_fairseq, "model.pt"), weights_only=True)
    b = torch.load(os.path.join(converted["plain_to_lsg"], "model.pt"), weights_only=True)
    assert a["cfg"]["model"].arch == "lsg_bart_base"
    assert sorted(a["model"]) == sorted(b["model"])
    for k in a["model"]:
        assert torch.equal(a["model"][k], b["model"][k]), k
    m, _ = load(via_fairseq)
    assert m.encoder.num_global_tokens == 4 and m.encoder.max_positions() == 1024


def test_training_folder_converts_with_the_checkpoint_export_takes(converted, tmp_path):
    """A folder as fairseq-train writes it (checkpoint_best.pt, checkpoint_last.pt; no model.pt): the
    converter takes checkpoint_best.pt, as lsg-fairseq-export does (it used to say "not a model")."""
    run = tmp_path / "run"
    shutil.copytree(converted["bart_plain"], run)
    os.rename(run / "model.pt", run / "checkpoint_best.pt")
    (run / "checkpoint_last.pt").write_bytes(b"not read: checkpoint_best.pt comes first")
    cli_main([str(run), str(tmp_path / "out")])
    a = torch.load(tmp_path / "out" / "model.pt", weights_only=True)["model"]
    b = torch.load(os.path.join(converted["bart_plain"], "model.pt"), weights_only=True)["model"]
    assert sorted(a) == sorted(b) and all(torch.equal(a[k], b[k]) for k in a)


def test_fairseq_bart_checkpoint_longer_positions(converted, tmp_path):
    longer = str(tmp_path / "longer")
    cli_main([converted["bart_plain"], longer, "--to", "bart", "--max-source-positions", "2048"])
    base, _ = load(converted["bart_plain"])
    m, _ = load(longer)
    assert type(m).__name__ == "BARTModel" and m.encoder.max_positions() == 2048
    old, new = base.encoder.embed_positions.weight, m.encoder.embed_positions.weight
    assert new.shape == (2050, 64) and torch.equal(new[2 + 1500], old[2 + 1500 % 512])
    _, logits0, _ = run(base, "short")
    _, logits1, _ = run(m, "short")
    assert np.abs(logits0 - logits1).max() < 1e-6  # short inputs: only the table grew
    with pytest.raises(ConversionError, match="LSG options need --to lsg_bart"):
        convert(converted["bart_plain"], str(tmp_path / "x"), to="bart", block_size=32)


@pytest.mark.parametrize(
    "source,options,family,able",
    [
        ("fairseq_bart", {"attention_window": 32}, "LED", "bart or lsg_bart"),  # LED takes HF BART folders only
        (os.path.join(conftest.FIXTURES, "led", "led_w32", "hf"), {"block_size": 32}, "LSG", "led"),
    ],
    ids=["led_options_on_fairseq_bart", "lsg_options_on_hf_led"],
)
def test_another_familys_options_say_whether_its_to_takes_the_source(
    converted, tmp_path, source, options, family, able
):
    """ "LED options need --to led" on a fairseq BART checkpoint led to the next refusal ("converts to
    bart or lsg_bart"): the hint says so at once."""
    source = os.path.join(converted["bart_plain"], "model.pt") if source == "fairseq_bart" else source
    to = {"LED": "led", "LSG": "lsg_bart"}[family]
    with pytest.raises(ConversionError) as e:
        convert(source, str(tmp_path / "x"), **options)
    assert f"{family} options need --to {to}, which does not take this source: it converts to {able})" in str(e.value)
    with pytest.raises(ConversionError, match=f"converts to {able}"):  # what the hint says --to would meet
        convert(source, str(tmp_path / "x"), to=to, **options)


@pytest.mark.parametrize(
    "source,options",
    [
        ("lsg/plain_to_lsg", dict(to="lsg_bart", block_size=64, sparse_block_size=0, sparsity_type="none")),
        ("led/led_w32", {}),
        ("locost/model", {}),
        ("lsg/bart_plain", {}),
    ],
    ids=["lsg_bart", "led", "locost", "bart"],
)
def test_the_printed_training_flags_build_the_converted_model(tmp_path, capsys, source, options):
    """lsg-fairseq-convert says which fairseq-train flags build its model (fairseq builds the model
    from the command line; a forgotten LSG flag trains another attention): those flags, parsed as
    fairseq-train parses them, build a model that takes model.pt's weights strictly, with the same
    weightless settings."""
    from fairseq import options as fairseq_options
    from fairseq import tasks

    from lsg_fairseq.checkpoint_policy import saved_model_cfg

    folder = os.path.join(conftest.FIXTURES, source.replace("plain_to_lsg", "bart_plain"))
    hf = os.path.join(folder, "hf") if os.path.isdir(os.path.join(folder, "hf")) else folder
    argv = [hf, str(tmp_path / "out")]
    for name, value in options.items():
        argv += [f"--{name.replace('_', '-')}", str(value)]
    cli_main(argv)
    err = capsys.readouterr().err
    said = [line for line in err.splitlines() if line.startswith("fairseq-train builds the model")]
    assert len(said) == 1, err
    flags = said[0].split(" with ", 1)[1]
    data = tmp_path / "data"
    data.mkdir()
    for side in ("source", "target"):
        shutil.copy(tmp_path / "out" / "dict.txt", data / f"dict.{side}.txt")
    parser = fairseq_options.get_training_parser()
    args = fairseq_options.parse_args_and_arch(
        parser,
        [str(data), "--user-dir", lsg_fairseq.user_dir(), "--task", "long_document_summarization"] + shlex.split(flags),
    )
    task = tasks.setup_task(args)
    model = task.build_model(args)
    state = torch.load(tmp_path / "out" / "model.pt", map_location="cpu", weights_only=False)
    model.load_state_dict(state["model"], strict=True)
    settings = getattr(type(model), "weightless_settings", None)
    if settings is not None:
        assert settings(args) == settings(saved_model_cfg(str(tmp_path / "out" / "model.pt")))


@pytest.mark.parametrize(
    "name,family", [("bart_plain", "BARTModel"), ("lsg_norm", "LSGBARTModel"), ("led", "LEDModel")]
)
def test_the_longer_positions_hint_runs_as_it_reads(converted, tmp_path, capsys, name, family):
    """The command that the hub and a training restore give for a position table too short
    (``checkpoint_policy.longer_positions_hint``) runs, keeps the model's family and reads 2,048 tokens. For a
    fairseq LED checkpoint, which the converter refuses, it names an HF BART folder instead: a plain
    BART's hint once lacked ``--to bart`` (that made an LSG-BART), and an LED's named the refused
    checkpoint."""
    from lsg_fairseq.checkpoint_policy import longer_positions_hint

    if name == "led":
        converted = {"led": str(tmp_path / "led")}
        convert(os.path.join(conftest.FIXTURES, "led", "led_w32", "hf"), converted["led"])
    path = os.path.join(converted[name], "model.pt")
    arch = checkpoint_utils.load_checkpoint_to_cpu(path)["cfg"]["model"].arch
    hint = longer_positions_hint(arch, path, 2048)
    (command,) = re.findall(r"`(lsg-fairseq-convert [^`]*)`", hint)
    argv = shlex.split(command)[1:]
    if name == "led":  # the checkpoint itself is refused: the hint's source is an HF BART folder
        with pytest.raises(SystemExit):
            cli_main([path, str(tmp_path / "refused"), "--max-source-positions", "2048"])
        assert "a fairseq led" in capsys.readouterr().err and path not in hint and argv[0] == "HF_BART"
        argv[0] = os.path.join(FIXTURES, "bart_plain", "hf")
    else:
        assert argv[0] == path
    cli_main([str(tmp_path / "out") if a == "OUT_DIR" else a for a in argv])
    m, _ = load(str(tmp_path / "out"))
    assert type(m).__name__ == family and m.encoder.max_positions() == 2048


def test_a_checkpoint_folder_with_both_tokenizers_is_named(converted, tmp_path):
    """The refusal named the converter's temp folder (OUT's staging copy, deleted on the way out)."""
    run = tmp_path / "run"
    shutil.copytree(converted["bart_plain"], run)
    (run / "spm.model").write_text("stale")  # beside encoder.json / vocab.bpe
    with pytest.raises(ConversionError) as e:
        convert(str(run / "model.pt"), str(tmp_path / "out"))
    assert str(e.value).startswith(f"{run}: holds both GPT-2 BPE files and a sentencepiece model"), e.value
    assert ".tmp" not in str(e.value) and not (tmp_path / "out").exists()
