"""lsg-fairseq-export (the inverse of lsg-fairseq-convert) against the fixtures in tests/data and HF's classes.

- every fixture: HF -> fairseq -> HF gives the same tensors and an equivalent config;
- bart / led: the exported folder loads with transformers' own classes and its logits equal the
  fairseq model's on a long input;
- lsg_bart / locost: the exported folder converts back to the same fairseq outputs, and its config
  and keys match the published format field by field;
- refusals: unknown arch, weights HF cannot hold, non-empty output without --force (exit 2, no output).
"""

import json
import os
import shutil

import numpy as np
import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # the tests never download anything

import lsg_fairseq  # noqa: F401
from fairseq import checkpoint_utils

from conftest import FIXTURES, TOY_VOCAB, build_task_and_model, toy_batch, training_config, write_toy_dict
from lsg_fairseq.cli.export import main as export_main
from lsg_fairseq.convert import convert, export
from lsg_fairseq.convert.common import load_hf_state_dict, save_checkpoint

pytestmark = pytest.mark.usefixtures("single_thread")

SOURCES = {
    "bart_plain": "lsg/bart_plain/hf",
    "lsg_none": "lsg/lsg_none/hf",
    "lsg_norm": "lsg/lsg_norm/hf",
    "lsg_pooling": "lsg/lsg_pooling/hf",
    "led_w32": "led/led_w32/hf",
    "locost": "locost/model",
}
# written by whichever transformers version saved the folder; not part of the model
VERSION_KEYS = {"_name_or_path", "transformers_version", "torch_dtype", "dtype"}
TINY = [
    "--encoder-layers",
    "2",
    "--decoder-layers",
    "2",
    "--encoder-embed-dim",
    "64",
    "--decoder-embed-dim",
    "64",
    "--encoder-ffn-embed-dim",
    "128",
    "--decoder-ffn-embed-dim",
    "128",
    "--encoder-attention-heads",
    "4",
    "--decoder-attention-heads",
    "4",
]


@pytest.fixture(scope="module")
def round_trips(tmp_path_factory):
    root = tmp_path_factory.mktemp("export")
    out = {}
    for name, rel in SOURCES.items():
        src, fs, hf = os.path.join(FIXTURES, rel), root / name / "fairseq", root / name / "hf"
        convert(src, str(fs))
        export(str(fs), str(hf))
        out[name] = (src, str(fs), str(hf))
    return out


def read_json(path):
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def load_fairseq(path):
    models, _, task = checkpoint_utils.load_model_ensemble_and_task([path])
    return models[0].eval(), task


def perturb(model, seed=0):
    """Non-trivial biases and LayerNorm weights, so a mis-mapped tensor shows in the outputs."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.05)


def toy_checkpoint(folder, argv, seed=0, fine_tuned=True, data=None):
    """A fairseq model of ``argv`` with perturbed weights saved as ``folder/checkpoint_best.pt``
    beside its dict.txt (or with ``data`` as its data folder); ``fine_tuned`` adds optimizer state
    as fairseq-train writes it."""
    os.makedirs(folder, exist_ok=True)
    if data is None:
        data = write_toy_dict(folder)
    head = [str(data), "--task", "long_document_summarization"]
    task, model = build_task_and_model(head + argv, seed=seed)
    perturb(model, seed)

    cfg = training_config(head + argv)
    path = save_checkpoint(cfg, model, os.path.join(folder, "checkpoint_best.pt"))
    if fine_tuned:
        state = torch.load(path, weights_only=False)
        state["last_optimizer_state"] = {"state": {0: {"exp_avg": torch.ones(1000)}}, "param_groups": []}
        state["extra_state"]["best"] = 1.5
        torch.save(state, path)
    return path, model.eval()


# ----------------------------------------------------------------------------- round trips
@pytest.mark.parametrize("name", list(SOURCES))
def test_round_trip_weights_and_config(round_trips, name):
    src, _, hf = round_trips[name]
    a, b = load_hf_state_dict(src), load_hf_state_dict(hf)
    assert sorted(a) == sorted(b)
    for k in a:
        assert a[k].dtype == b[k].dtype and torch.equal(a[k], b[k]), k
    ca, cb = read_json(os.path.join(src, "config.json")), read_json(os.path.join(hf, "config.json"))
    strip = lambda c: {k: v for k, v in c.items() if k not in VERSION_KEYS}  # noqa: E731
    assert strip(ca) == strip(cb)
    assert cb["torch_dtype"] == ca.get("torch_dtype", ca.get("dtype"))
    gen = os.path.join(src, "generation_config.json")
    if os.path.exists(gen):
        ga, gb = read_json(gen), read_json(os.path.join(hf, "generation_config.json"))
        assert {k: v for k, v in ga.items() if k.endswith("token_id")} == {
            k: v for k, v in gb.items() if k.endswith("token_id")
        }
    if os.path.exists(os.path.join(src, "vocab.json")):
        assert read_json(os.path.join(src, "vocab.json")) == read_json(os.path.join(hf, "vocab.json"))
        merges = [open(os.path.join(d, "merges.txt"), encoding="utf-8").read().strip().splitlines() for d in (src, hf)]
        assert merges[0] == merges[1]


def test_locost_rows_back_in_hf_order(round_trips):
    """The token_map.json permutation is undone: HF row i = fairseq row of the first index mapped to i."""
    _, fs, hf = round_trips["locost"]
    token_map = read_json(os.path.join(fs, "token_map.json"))
    emb = torch.load(os.path.join(fs, "model.pt"), weights_only=False)["model"]["encoder.embed_tokens.weight"]
    shared = load_hf_state_dict(hf)["shared.weight"]
    assert token_map[:4] == [0, 0, 1, 2] and len(token_map) == shared.size(0) + 2  # start + <mask> duplicates
    assert torch.equal(shared[torch.tensor(token_map)], emb)


@pytest.mark.parametrize("name", ["lsg_norm", "lsg_pooling", "locost"])
def test_exported_folder_converts_back_to_same_outputs(round_trips, name, tmp_path):
    _, fs, hf = round_trips[name]
    convert(hf, str(tmp_path / "again"))
    a, task = load_fairseq(os.path.join(fs, "model.pt"))
    b, _ = load_fairseq(str(tmp_path / "again" / "model.pt"))
    sa, sb = a.state_dict(), b.state_dict()
    assert sorted(sa) == sorted(sb) and all(torch.equal(sa[k], sb[k]) for k in sa)
    n = len(task.source_dictionary)
    g = torch.Generator().manual_seed(0)
    src = torch.randint(4, n - 1, (2, 700), generator=g)
    src[1, 500:] = task.source_dictionary.pad()
    src[:, 0] = task.source_dictionary.bos()
    lengths = torch.tensor([700, 500])
    prev = torch.randint(4, n - 1, (2, 9), generator=g)
    prev[:, 0] = task.source_dictionary.eos()
    with torch.no_grad():
        la, lb = a(src, lengths, prev)[0], b(src, lengths, prev)[0]
    assert torch.equal(la, lb)


def test_lsg_export_matches_published_format(tmp_path):
    """A model trained here (not a converted one) exports to the reference's LSG-BART format:
    the config has the published fields, the weights the published names and shapes."""
    argv = [
        "--arch",
        "lsg_bart_base",
        *TINY,
        "--max-source-positions",
        "1024",
        "--max-target-positions",
        "256",
        "--num-global-tokens",
        "3",
        "--block-size",
        "16",
        "--sparse-block-size",
        "16",
        "--sparsity-factor",
        "4",
        "--sparsity-type",
        "pooling",
        "--mask-first-token",
        "true",
        "--dropout",
        "0.2",
    ]
    path, model = toy_checkpoint(tmp_path / "run", argv)
    hf = str(tmp_path / "hf")
    export(path, hf)
    published = os.path.join(FIXTURES, "lsg", "lsg_norm", "hf")
    ref_cfg, cfg = read_json(os.path.join(published, "config.json")), read_json(os.path.join(hf, "config.json"))
    assert set(ref_cfg) - VERSION_KEYS == set(cfg) - VERSION_KEYS
    for key in (
        "architectures",
        "auto_map",
        "base_model_prefix",
        "adaptive",
        "model_type",
        "lsh_num_pre_rounds",
        "pass_global_tokens_to_decoder",
        "pool_with_global",
        "activation_function",
        "scale_embedding",
        "bos_token_id",
        "pad_token_id",
        "eos_token_id",
        "decoder_start_token_id",
    ):
        assert cfg[key] == ref_cfg[key], key
    assert (
        cfg["num_global_tokens"],
        cfg["block_size"],
        cfg["sparse_block_size"],
        cfg["sparsity_factor"],
        cfg["sparsity_type"],
        cfg["mask_first_token"],
    ) == (3, 16, 16, 4, "pooling", True)
    assert cfg["max_position_embeddings"] == 1024 and cfg["vocab_size"] == TOY_VOCAB and cfg["dropout"] == 0.2
    ref_sd, sd = load_hf_state_dict(published), load_hf_state_dict(hf)
    assert sorted(ref_sd) == sorted(sd)
    for k, v in ref_sd.items():
        if "shared" not in k and "final_logits_bias" not in k and "embed_positions" not in k:
            assert sd[k].shape == v.shape, k
    assert sd["model.encoder.global_embeddings.weight"].shape == (512, 64)
    # one max_position_embeddings: the 256-position decoder table is tiled to 1024, its rows unchanged
    assert (
        sd["model.encoder.embed_positions.weight"].shape
        == sd["model.decoder.embed_positions.weight"].shape
        == (1026, 64)
    )
    assert torch.equal(sd["model.decoder.embed_positions.weight"][:258], model.decoder.embed_positions.weight)
    assert torch.equal(sd["model.decoder.embed_positions.weight"][258:514], model.decoder.embed_positions.weight[2:])

    convert(hf, str(tmp_path / "back"))
    back, _ = load_fairseq(str(tmp_path / "back" / "model.pt"))
    src, lengths, prev = toy_batch(L=300, lengths=(300, 170))
    with torch.no_grad():
        assert torch.equal(model(src, lengths, prev)[0], back(src, lengths, prev)[0])


def test_locost_export_matches_reference_format(round_trips):
    _, _, hf = round_trips["locost"]
    ref = os.path.join(FIXTURES, "locost", "model")
    assert sorted(os.listdir(hf)) == ["config.json", "generation_config.json", "pytorch_model.bin"]
    meta = read_json(os.path.join(FIXTURES, "locost", "meta.json"))
    sd = torch.load(os.path.join(hf, "pytorch_model.bin"), weights_only=True)
    assert sorted(sd) == sorted(meta["checkpoint_keys"])
    assert all(
        sd[k].data_ptr() == sd["shared.weight"].data_ptr()
        for k in ("encoder.embed_tokens.weight", "decoder.embed_tokens.weight", "lm_head.weight")
    )
    assert (
        set(read_json(os.path.join(ref, "config.json"))) - VERSION_KEYS
        == set(read_json(os.path.join(hf, "config.json"))) - VERSION_KEYS
    )


# ----------------------------------------------------------------------------- transformers
def test_bart_export_loads_in_transformers(tmp_path):
    """A fine-tuned fairseq BART checkpoint (optimizer state included) -> HF BartForConditionalGeneration:
    same logits on a 1,500-token input, encoder longer than the decoder (2,048 vs 256 positions)."""
    from transformers import BartForConditionalGeneration

    argv = [
        "--arch",
        "bart_base",
        *TINY,
        "--max-source-positions",
        "2048",
        "--max-target-positions",
        "256",
        "--activation-fn",
        "gelu",
    ]
    path, model = toy_checkpoint(tmp_path / "run", argv, seed=3)
    hf_dir = str(tmp_path / "hf")
    export(path, hf_dir)
    assert sorted(os.listdir(hf_dir)) == ["config.json", "generation_config.json", "model.safetensors"]
    assert all(k.startswith("model.") or k == "final_logits_bias" for k in load_hf_state_dict(hf_dir))
    hf = BartForConditionalGeneration.from_pretrained(hf_dir).eval()
    src, lengths, prev = toy_batch(L=1500, lengths=(1500, 1100), seed=4)
    with torch.no_grad():
        ours = model(src, lengths, prev)[0]
        theirs = hf(input_ids=src, attention_mask=src.ne(1).long(), decoder_input_ids=prev).logits
    diff = (ours - theirs).abs().max().item()
    print(f"bart fairseq vs transformers logits max |diff| = {diff:.2e}")
    assert diff <= 1e-4


def test_led_export_loads_in_transformers(round_trips):
    from transformers import LEDForConditionalGeneration

    _, fs, hf_dir = round_trips["led_w32"]
    model, _ = load_fairseq(os.path.join(fs, "model.pt"))
    hf = LEDForConditionalGeneration.from_pretrained(hf_dir).eval()
    data = np.load(os.path.join(FIXTURES, "led", "inputs.npz"))
    ids, mask = torch.from_numpy(data["long_input_ids"]), torch.from_numpy(data["long_attention_mask"])
    glob = torch.from_numpy(data["long_global_attention_mask_first"])
    dec, lengths = torch.from_numpy(data["long_decoder_input_ids"]), torch.from_numpy(data["long_lengths"])
    assert int(lengths.max()) == 1000
    with torch.no_grad():
        ours = model(ids, lengths, dec)[0]  # --global-attention first: the first real token is global
        theirs = hf(input_ids=ids, attention_mask=mask, global_attention_mask=glob, decoder_input_ids=dec).logits
    diff = (ours - theirs).abs().max().item()
    print(f"led fairseq vs transformers logits max |diff| = {diff:.2e}")
    assert diff <= 1e-4
    reference = np.load(os.path.join(FIXTURES, "led", "led_w32", "outputs.npz"))["long_first_logits"]
    assert np.abs(theirs.numpy() - reference).max() <= 1e-4


# ----------------------------------------------------------------------------- refusals
def run_cli(argv, capsys):
    with pytest.raises(SystemExit) as e:
        export_main([str(a) for a in argv])
    return e.value.code, capsys.readouterr().err


def edited_copy(fs, dst, edit):
    """Copy a converted model folder, applying ``edit(state)`` to its checkpoint."""
    shutil.copytree(fs, dst)
    state = torch.load(os.path.join(dst, "model.pt"), weights_only=False)
    edit(state)
    torch.save(state, os.path.join(dst, "model.pt"))
    return str(dst)


def _untie(state):
    state["model"]["decoder.output_projection.weight"] = state["model"]["decoder.output_projection.weight"] + 1


def _classification_head(state):
    state["model"]["classification_heads.mnli.dense.weight"] = torch.zeros(4, 64)


def _pre_ln(state):
    state["cfg"]["model"].encoder_normalize_before = True


def _unknown_arch(state):
    state["cfg"]["model"].arch = state["cfg"]["model"]._name = "transformer_tiny"


@pytest.mark.parametrize(
    "edit,message",
    [
        (_untie, "decoder.output_projection.weight differs"),
        (_classification_head, "cannot hold: classification_heads.mnli.dense.weight"),
        (_pre_ln, "--encoder/--decoder-normalize-before"),
        (_unknown_arch, "arch 'transformer_tiny' has no HuggingFace format"),
    ],
)
def test_refuses_what_hf_cannot_hold(round_trips, tmp_path, capsys, edit, message):
    src = edited_copy(round_trips["bart_plain"][1], tmp_path / "src", edit)
    code, err = run_cli([src, tmp_path / "hf"], capsys)
    assert code == 2 and message in err and "model.pt" in err
    assert not (tmp_path / "hf").exists()
    assert not [p for p in os.listdir(tmp_path) if p.startswith(".hf.")]  # no temp folder left behind


def _drop(key):
    def edit(state):
        del state["model"][key]

    return edit


def _reshape(key):
    def edit(state):
        state["model"][key] = torch.zeros(*(n + 1 for n in state["model"][key].shape))

    return edit


def _as_int(key):
    def edit(state):
        state["model"][key] = state["model"][key].long()

    return edit


def _cfg(key, value):
    def edit(state):
        setattr(state["cfg"]["model"], key, value)

    return edit


@pytest.mark.parametrize(
    "name,edit,message",
    [
        # each was exported, exit 0: an HF folder HF fills with random weights or cannot load
        ("bart_plain", _drop("decoder.layers.1.fc1.weight"), "missing decoder.layers.1.fc1.weight"),
        ("lsg_norm", _reshape("encoder.layers.0.fc2.bias"), "encoder.layers.0.fc2.bias is (65,), the model's (64,)"),
        ("led_w32", _drop("encoder.layers.1.self_attn.k_proj_global.bias"), "missing encoder.layers.1.self_attn"),
        ("locost", _as_int("encoder.block.0.layer.0.ssm_layer.D"), "holds torch.int64, the model torch.float32"),
        # each was a traceback (int("abc"), float([1]), parse_attention_windows' ValueError)
        ("bart_plain", _cfg("encoder_layers", "abc"), "(encoder_layers = 'abc', not a value --encoder-layers takes)"),
        ("led_w32", _cfg("decoder_layerdrop", [1]), "(decoder_layerdrop = [1], not a value --decoder-layerdrop takes)"),
        ("led_w32", _cfg("attention_window", "abc"), "attention_window = 'abc', not a value --attention-window takes"),
        ("locost", _cfg("d_ff", "abc"), "does not build a locost_base model (d_ff = 'abc', not a value --d-ff takes)"),
    ],
)
def test_refuses_weights_or_cfg_its_model_cannot_take(round_trips, tmp_path, capsys, name, edit, message):
    """The checkpoint's weights checked against the model its cfg builds (fairseq's strict load,
    checkpoint.check_weights_fit), its cfg values against their types; one line naming model.pt."""
    src = edited_copy(round_trips[name][1], tmp_path / "src", edit)
    code, err = run_cli([src, tmp_path / "hf"], capsys)
    lines = [line for line in err.splitlines() if line.startswith("lsg-fairseq-export: error: ")]
    assert code == 2 and len(lines) == 1 and message in lines[0] and "model.pt" in lines[0], err
    assert not (tmp_path / "hf").exists()


def test_refuses_damaged_encoder_json(round_trips, tmp_path, capsys):
    """A truncated encoder.json beside the checkpoint was a JSONDecodeError traceback."""
    src = shutil.copytree(round_trips["bart_plain"][1], tmp_path / "src")
    text = (src / "encoder.json").read_text(encoding="utf-8")
    (src / "encoder.json").write_text(text[: len(text) // 2], encoding="utf-8")
    code, err = run_cli([src, tmp_path / "hf"], capsys)
    assert code == 2 and f"{src / 'encoder.json'}: not valid JSON" in err, err
    assert not (tmp_path / "hf").exists()


def test_locost_duplicate_rows(round_trips, tmp_path, capsys):
    fs = round_trips["locost"][1]

    def move_row(index):
        def edit(state):
            emb = state["model"]["encoder.embed_tokens.weight"].clone()
            emb[index] += 1
            for k in ("encoder.embed_tokens.weight", "decoder.embed_tokens.weight", "decoder.output_projection.weight"):
                state["model"][k] = emb

        return edit

    # the task's <mask> (index 501) shares HF id 2 with <unk>: a trained <mask> row cannot be held
    code, err = run_cli([edited_copy(fs, tmp_path / "mask", move_row(501)), tmp_path / "hf_mask"], capsys)
    assert code == 2 and "'<mask>'" in err and "HF id 2" in err and not (tmp_path / "hf_mask").exists()
    # fairseq's <pad> row shares HF 0 with the decoder start: HF keeps the start row
    export(edited_copy(fs, tmp_path / "pad", move_row(1)), str(tmp_path / "hf_pad"))
    emb = torch.load(os.path.join(fs, "model.pt"), weights_only=False)["model"]["encoder.embed_tokens.weight"]
    assert torch.equal(load_hf_state_dict(str(tmp_path / "hf_pad"))["shared.weight"][0], emb[0])


def test_output_folder_rules(round_trips, tmp_path, capsys):
    fs = round_trips["bart_plain"][1]
    out = tmp_path / "hf"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    code, err = run_cli([fs, out], capsys)
    assert code == 2 and "not empty" in err and "--force" in err
    assert os.listdir(out) == ["keep.txt"]
    export_main([fs, str(out), "--force"])
    assert sorted(os.listdir(out)) == sorted(os.listdir(round_trips["bart_plain"][2]))
    code, err = run_cli([tmp_path / "missing", tmp_path / "hf2"], capsys)
    assert code == 2 and "no such file or folder" in err
    code, err = run_cli([fs, fs], capsys)  # would replace the source
    assert code == 2 and "would replace the source" in err
    assert os.path.exists(os.path.join(fs, "model.pt"))
    lonely = tmp_path / "lonely"
    lonely.mkdir()
    shutil.copy(os.path.join(fs, "model.pt"), lonely / "checkpoint_best.pt")
    state = torch.load(lonely / "checkpoint_best.pt", weights_only=False)
    state["cfg"]["task"]["data"] = str(tmp_path / "nowhere")
    torch.save(state, lonely / "checkpoint_best.pt")
    code, err = run_cli([lonely, tmp_path / "hf3"], capsys)
    assert code == 2 and "no dictionary" in err and not (tmp_path / "hf3").exists()


# ----------------------------------------------------------------------------- a model trained here
@pytest.fixture(scope="module")
def trained_lsg(tmp_path_factory):
    """scripts/demo.sh in miniature: JSONL -> sentencepiece -> binarize -> fairseq-train lsg_bart_tiny."""
    import sys

    from conftest import DOCUMENTS
    from test_end_to_end import SCRIPTS, run

    work = tmp_path_factory.mktemp("demo")
    (work / "jsonl").mkdir()
    for split, n in (("train", 6), ("valid", 2), ("test", 2)):
        with open(os.path.join(DOCUMENTS, "sumpubmed", f"{split}.jsonl")) as f:
            (work / "jsonl" / f"{split}.jsonl").write_text("".join(line for _, line in zip(range(n), f)))
    run(
        [
            sys.executable,
            f"{SCRIPTS}/jsonl_to_parallel.py",
            "--input-dir",
            work / "jsonl",
            "--output-dir",
            work / "raw",
        ],
        work,
    )
    run(
        [
            "bash",
            f"{SCRIPTS}/spm_binarize.sh",
            "--raw-dir",
            work / "raw",
            "--out-dir",
            work,
            "--vocab-size",
            "400",
            "--",
            "--soft-vocab-limit",
        ],
        work,
    )
    run(
        [
            "fairseq-train",
            work / "bin",
            "--user-dir",
            os.path.join(os.path.dirname(SCRIPTS), "lsg_fairseq"),
            "--task",
            "long_document_summarization",
            "--arch",
            "lsg_bart_tiny",
            "--max-source-positions",
            "1024",
            "--max-target-positions",
            "128",
            "--truncate-target",
            "--criterion",
            "label_smoothed_cross_entropy",
            "--label-smoothing",
            "0.1",
            "--optimizer",
            "adam",
            "--lr",
            "1e-3",
            "--max-tokens",
            "4200",
            "--required-batch-size-multiple",
            "1",
            "--max-update",
            "2",
            "--save-dir",
            work / "ckpt",
            "--no-epoch-checkpoints",
            "--cpu",
            "--num-workers",
            "0",
            "--seed",
            "1",
        ],
        work,
    )
    return work


def test_trained_lsg_bart_exports(trained_lsg, tmp_path):
    """checkpoint_best.pt of a training run exports as it is (dictionary and spm.model found through
    the checkpoint's data folder), without optimizer state, and converts back to the same outputs."""
    import subprocess
    import sys

    import sentencepiece as spm

    ckpt = trained_lsg / "ckpt" / "checkpoint_best.pt"
    state = torch.load(ckpt, weights_only=False)
    assert state["last_optimizer_state"] and state["optimizer_history"][-1]["num_updates"] == 2
    out = tmp_path / "hf"
    proc = subprocess.run(
        [sys.executable, "-m", "lsg_fairseq.cli.export", str(ckpt), str(out)], capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "spm.model" in proc.stderr  # says why there is no vocab.json/merges.txt
    assert sorted(os.listdir(out)) == ["config.json", "generation_config.json", "model.safetensors", "spm.model"]
    cfg = read_json(out / "config.json")
    assert cfg["architectures"] == ["LSGBartForConditionalGeneration"] and cfg["max_position_embeddings"] == 1024
    assert (cfg["block_size"], cfg["sparse_block_size"], cfg["sparsity_factor"], cfg["num_global_tokens"]) == (
        32,
        32,
        2,
        1,
    )
    hf_sd = load_hf_state_dict(str(out))
    model, task = load_fairseq(str(ckpt))
    assert sum(v.numel() for k, v in hf_sd.items() if k != "final_logits_bias" and "embed_positions" not in k) == sum(
        v.numel()
        for k, v in model.state_dict().items()
        if "version" not in k
        and "embed_positions" not in k
        and k not in ("decoder.embed_tokens.weight", "decoder.output_projection.weight")
    )

    # sentencepiece ids are the HF ids: they equal fairseq's indices for the same pieces
    sp = spm.SentencePieceProcessor(model_file=str(out / "spm.model"))
    text = (trained_lsg / "raw" / "test.source").read_text().splitlines()[0]
    ids = sp.encode(text)[:300]
    pieces = sp.encode(text, out_type=str)[:300]
    d = task.source_dictionary
    assert ids == d.encode_line(" ".join(pieces), append_eos=False, add_if_not_exist=False).tolist()
    assert (sp.bos_id(), sp.pad_id(), sp.eos_id(), sp.unk_id()) == (d.bos(), d.pad(), d.eos(), d.unk())

    convert(str(out), str(tmp_path / "back"))
    back, _ = load_fairseq(str(tmp_path / "back" / "model.pt"))
    src = torch.tensor([[d.bos()] + ids + [d.eos()]])
    prev = torch.tensor([[d.eos(), d.bos()] + ids[:6]])
    with torch.no_grad():
        assert torch.equal(
            model(src, torch.tensor([src.size(1)]), prev)[0], back(src, torch.tensor([src.size(1)]), prev)[0]
        )


def test_locost_trained_here_exports(trained_lsg, tmp_path):
    """A LOCOST trained from scratch (no token_map.json) keeps HF id == fairseq index and its own
    pad/eos/start ids; its sentencepiece model and the task's <mask> go into spiece.model +
    added_tokens.json; the weights have the reference's keys (locost_tiny has the fixture's shape)."""
    path, model = toy_checkpoint(tmp_path / "run", ["--arch", "locost_tiny"], data=trained_lsg / "bin")
    hf = tmp_path / "hf"
    export(path, str(hf))
    assert sorted(os.listdir(hf)) == [
        "added_tokens.json",
        "config.json",
        "generation_config.json",
        "pytorch_model.bin",
        "spiece.model",
    ]
    n = len(model.encoder.embed_tokens.weight)
    cfg = read_json(hf / "config.json")
    assert (cfg["decoder_start_token_id"], cfg["pad_token_id"], cfg["eos_token_id"], cfg["vocab_size"]) == (0, 1, 2, n)
    assert read_json(hf / "added_tokens.json") == {"<mask>": n - 1}
    sd = torch.load(hf / "pytorch_model.bin", weights_only=True)
    assert sorted(sd) == sorted(read_json(os.path.join(FIXTURES, "locost", "meta.json"))["checkpoint_keys"])
    assert torch.equal(sd["shared.weight"], model.encoder.embed_tokens.weight)
    ours = model.state_dict()
    assert all(torch.equal(sd[k], ours[k]) for k in sd if k.startswith(("encoder.block", "decoder.block")))
