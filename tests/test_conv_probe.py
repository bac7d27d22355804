"""benchmarks/conv_probe.py, LOCOST's convolution in variants (issue 32's next GPU reading): every
variant computes the layer's function, on CPU (their speed is the GPU's to measure)."""

import argparse
import json

import pytest
import torch

from conftest import load_script

pytestmark = pytest.mark.usefixtures("single_thread")


probe = load_script("benchmarks/conv_probe.py", "conv_probe")


def args(**kw):
    return argparse.Namespace(**{**dict(channels=24, warmup=0, repeat=1, variants=None), **kw})


def layer(H=24):
    torch.manual_seed(0)
    return probe.S4D(H).eval()


@pytest.mark.parametrize("L", [200, 300])  # FFT sizes 400 and 600: a power of two and not
def test_every_variant_computes_the_layers_output(L):
    part = probe.probe_length(layer(), L, args(), "cpu", torch.float32)
    rows = {r["variant"]: r for r in part["rows"]}
    assert list(rows) == probe.VARIANTS, part["rows"]
    assert all(r["status"] == "ok" for r in rows.values()), part["rows"]
    for name in probe.SAME_MATH:
        assert rows[name]["diff"] <= 1e-5, name  # float32 throughout: the same function
    assert part["fft_size"] == probe.next_fast_len(2 * L)


def test_the_variants_equal_the_layers_call_in_bf16():
    s4d, L = layer().bfloat16(), 160
    u = torch.randn(1, L, 24).bfloat16()
    F = probe.next_fast_len(2 * L)
    with torch.no_grad():
        s4d.path = "whole"
        ref = s4d(u).float()
        spec = s4d.whole_spectrum(F)
        outs = [
            probe.transposed(s4d, u, F),
            probe.fp16_fft(s4d, u, probe.half_spectrum(spec, F, torch.float32), F, torch.float32),
        ]
        for out in outs:
            assert out.dtype == torch.bfloat16
            assert (out.float() - ref).abs().max() / ref.abs().max() <= probe.TOLERANCE


def test_a_failing_variant_is_recorded_and_the_others_run():
    seen = []  # what main writes after each row: a probe cut off keeps the rows it measured
    variants = args(variants=["model", "nonsense", "transposed"])
    part = probe.probe_length(layer(), 128, variants, "cpu", torch.float32, lambda p: seen.append(len(p["rows"])))
    assert seen == [1, 2, 3]
    assert [(r["variant"], r["status"]) for r in part["rows"]] == [
        ("model", "ok"),
        ("nonsense", "error"),
        ("transposed", "ok"),
    ]


def test_the_probe_writes_every_length_to_its_table(tmp_path):
    out = tmp_path / "c.json"
    probe.main(
        ["--device", "cpu", "--lengths", "128", "256", "--channels", "16", "--warmup", "0", "--repeat", "1"]
        + ["--variants", "model", "transposed", "--out", str(out)]
    )
    md = (tmp_path / "c.md").read_text()
    assert "| 128 | 256 | model |" in md and "| 128 | 256 | transposed |" in md and "| 256 | 512 | transposed |" in md
    assert [p["length"] for p in json.loads(out.read_text())["lengths"]] == [128, 256]


FP16_MAX = torch.finfo(torch.float16).max


def test_the_fp16_rows_keep_every_fft_within_float16s_range(monkeypatch):
    """fp16_fft's scaling (F^-1/2 on each side, the inverse unnormalized) keeps what enters and
    leaves each FFT within float16's range at 64K tokens for a worst case (a constant k, whose DC
    term sums every input), where the float32 form's unscaled rfft does not: a CPU has no float16
    FFT, so the float32 run's largest values are the check."""
    s4d, L, H = layer(4), 65536, 4
    with torch.no_grad():  # k = 8 and q = 1 everywhere
        s4d.k_proj.weight.zero_(), s4d.k_proj.bias.fill_(8.0)
        s4d.q_proj.weight.zero_(), s4d.q_proj.bias.fill_(1.0)
    F = probe.next_fast_len(2 * L)
    u = torch.randn(1, L, H)
    seen = {}
    for name in ("rfft", "irfft"):
        real = getattr(torch.fft, name)

        def traced(x, *a, name=name, real=real, **kw):
            out = real(x, *a, **kw)
            seen[name] = max(seen.get(name, 0.0), x.abs().max().item(), out.abs().max().item())
            return out

        monkeypatch.setattr(torch.fft, name, traced)
    with torch.no_grad():
        spec = s4d.whole_spectrum(F)
        seen.clear()
        half = probe.fp16_fft(s4d, u, probe.half_spectrum(spec, F, torch.float32), F, torch.float32)
        assert 0 < max(seen.values()) < FP16_MAX / 8, seen  # headroom for k 8x larger still
        seen.clear()
        full = s4d._whole_channel_major(u, None, F)
        assert seen["rfft"] > FP16_MAX  # the unscaled sums would overflow float16
    assert (half - full).abs().max() <= 1e-5 * full.abs().max()


def test_the_fp16_rows_say_where_their_ffts_ran_in_float32():
    part = probe.probe_length(
        layer(), 128, args(variants=["model", "fp16_fft", "ffts_only_fp16"]), "cpu", torch.float32
    )
    assert [r.get("fft_dtype") for r in part["rows"]] == [None, "float32", "float32"]
    md = probe.markdown(dict(channels=24, dtype="fp32", device="cpu", repeat=1, warmup=0, lengths=[part]))
    assert "| fp16_fft (FFTs in float32) |" in md and "| model |" in md
