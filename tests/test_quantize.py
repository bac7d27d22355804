"""``quantize_int8`` and ``lsg-fairseq-summarize --quantize int8`` (issue 13, item 4).

Tolerance. Dynamic int8 rounds each weight to 1/254 of its row's range and each Linear input to
1/255 of the tensor's range, halved again by PyTorch's ``reduce_range`` (7-bit activations, so
that pre-VNNI x86 kernels cannot overflow): a relative error of ~1% per matmul at d 32-64, which
adds up over the layers. Measured on these toy models (seeded, three batches): encoder outputs
2.4-4.9% (relative L2) and logits 2.5-3.9% off fp32. The bound, 8%, leaves room for other seeds
and BLAS paths, while a layer quantized wrongly (a dropped bias, a transposed weight, an untied
output projection) is off by 30% or more. benchmarks/results/int8.md has the same comparison on
the converted conformance fixtures and on a trained model.
"""

import copy
import os

import pytest
import torch

from conftest import TOY_VOCAB, build_task_and_model, toy_batch, write_toy_dict
from lsg_fairseq.quantize import quantize_int8, shared_weight_linears
from lsg_text.errors import ConfigError
from test_user_errors import BART_HF, copy_folder

pytestmark = pytest.mark.usefixtures("single_thread")  # conftest: tiny tensors, one thread

RTOL = 0.08
ARCHS = {
    "bart_tiny": [],
    "lsg_bart_tiny": ["--block-size", "8", "--sparse-block-size", "8", "--sparsity-factor", "2"],
    "led_tiny": ["--attention-window", "8"],
    "locost_tiny": [],
}
LSG_HF = os.path.join(os.path.dirname(BART_HF), "..", "lsg_norm", "hf")


def build(folder, arch):
    argv = [
        write_toy_dict(folder),
        "--task",
        "long_document_summarization",
        "--arch",
        arch,
        "--max-source-positions",
        "512",
        "--max-target-positions",
        "64",
        *ARCHS[arch],
    ]
    return build_task_and_model(argv)[1].eval()


def rel(a, b):
    return float((a - b).norm() / a.norm())


def forward(model, src, lengths, prev):
    with torch.no_grad():
        enc = model.encoder(src, src_lengths=lengths)
        logits, _ = model.decoder(prev, encoder_out=enc)
    out = enc["encoder_out"][0]  # (G + T, B, C): LSG puts its global tokens first
    return out[out.shape[0] - src.shape[1] :], logits


@pytest.mark.parametrize("arch", sorted(ARCHS))
def test_int8_close_to_fp32(tmp_path, arch):
    model = build(tmp_path, arch)
    int8 = quantize_int8(copy.deepcopy(model))
    src, lengths, prev = toy_batch()
    if arch == "locost_tiny":  # T5 sources have no <s>
        src[:, 0] = 5
    enc, logits = forward(model, src, lengths, prev)
    enc8, logits8 = forward(int8, src, lengths, prev)
    assert logits8.shape == logits.shape == (2, 7, TOY_VOCAB)
    real = torch.arange(src.shape[1])[:, None] < lengths[None, :]  # (T, B): compare real positions only
    assert 0 < rel(enc[real], enc8[real]) < RTOL
    assert 0 < rel(logits, logits8) < RTOL


@pytest.mark.parametrize("arch", sorted(ARCHS))
def test_untied_linears_quantized_tied_projection_kept(tmp_path, arch):
    model = build(tmp_path, arch)
    linears = {n for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)}
    tied = shared_weight_linears(model)
    assert tied == {"decoder.output_projection"}  # every arch here ties it to the embeddings
    quantize_int8(model)
    from torch.ao.nn.quantized.dynamic import Linear as DynamicQuantizedLinear

    kinds = {n: type(m) for n, m in model.named_modules() if n in linears}
    assert kinds.pop("decoder.output_projection") is torch.nn.Linear
    assert kinds and set(kinds.values()) == {DynamicQuantizedLinear}
    assert model.decoder.output_projection.weight is model.decoder.embed_tokens.weight  # still tied


def test_refuses_models_it_cannot_quantize(tmp_path):
    model = build(tmp_path, "lsg_bart_tiny")
    with pytest.raises(ConfigError, match="CPU only.*meta.*--device cpu"):
        quantize_int8(copy.deepcopy(model).to("meta"))  # stands in for a CUDA model on this CPU machine
    with pytest.raises(ConfigError, match="fp32 model, not torch.float16"):
        quantize_int8(copy.deepcopy(model).half())


# ----------------------------------------------------------------------------- lsg-fairseq-summarize
@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory):
    from lsg_fairseq.convert import convert

    root = tmp_path_factory.mktemp("quantize_models")
    out = {}
    for name, hf in (("bart_plain", BART_HF), ("lsg_norm", LSG_HF)):
        out[name] = str(root / name)
        convert(copy_folder(hf, root / f"{name}_hf"), out[name])
    return out


def summarize(argv, capsys):
    from lsg_fairseq.cli import summarize

    try:
        summarize.main(argv)
        code = 0
    except SystemExit as e:
        code = e.code
    return code, capsys.readouterr().err


@pytest.mark.parametrize("name", ["bart_plain", "lsg_norm"])
def test_summarize_int8_end_to_end(model_dirs, name, tmp_path, capsys):
    doc = tmp_path / "docs.txt"
    doc.write_text(
        "the patients were treated with a new drug and the results show a decrease\n"
        "a second document about the weather in the mountains\n"
    )
    outputs = {}
    for quantize in ("none", "int8"):
        out = tmp_path / f"{quantize}.txt"
        code, err = summarize(
            [
                model_dirs[name],
                "--input-lines",
                str(doc),
                "--output",
                str(out),
                "--beam",
                "2",
                "--max-len-b",
                "6",
                "--batch-size",
                "2",
                "--quiet",
                "--quantize",
                quantize,
            ],
            capsys,
        )
        assert code == 0, err
        outputs[quantize] = out.read_text().split("\n")
    assert len(outputs["int8"]) == len(outputs["none"]) == 3  # two summaries and the final newline


@pytest.mark.parametrize(
    "argv,message",
    [
        (["--quantize", "int4"], "argument --quantize: invalid choice: 'int4'"),
        (["--quantize", "int8", "--device", "cuda"], "--quantize int8 runs on the CPU only"),
        (["--quantize", "int8", "--device", "cuda", "--fp16"], "--quantize int8 runs on the CPU only"),
    ],
)
def test_summarize_refuses_bad_quantize_flags(tmp_path, capsys, argv, message):
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    (model_dir / "model.pt").write_bytes(b"never read: the flags are checked first")
    code, err = summarize([str(model_dir), "--input-lines", str(model_dir / "model.pt"), *argv], capsys)
    assert code == 2
    lines = err.strip().split("\n")
    assert len(lines) == 1 and lines[0].startswith("lsg-fairseq-summarize: error: ") and message in lines[0], err


def test_summarize_bf16_runs_the_model_in_bfloat16(model_dirs, tmp_path, capsys, encoder_dtypes):
    """--bf16 (any device): the encoder reads bfloat16 weights, and the summaries come out."""
    seen = encoder_dtypes
    doc = tmp_path / "docs.txt"
    doc.write_text("the patients were treated with a new drug\na second document about the weather\n")
    out = tmp_path / "bf16.txt"
    argv = [model_dirs["lsg_norm"], "--input-lines", str(doc), "--output", str(out), "--max-len-b", "4", "--quiet"]
    code, err = summarize([*argv, "--bf16"], capsys)
    assert code == 0, err
    assert len(out.read_text().splitlines()) == 2 and seen and set(seen) == {torch.bfloat16}, seen
    code, err = summarize([*argv, "--bf16", "--quantize", "int8"], capsys)
    assert code == 2 and "--quantize int8 quantizes the float32 model; drop --bf16" in err
