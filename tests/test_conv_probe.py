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


# torch < 2.13 (the GPU machine's 2.11, benchmarks/device_torch.sh) on CPU: inductor's stride check
# fails the compiled time-major FFTs (the fake rfft over dim 1 had contiguous strides there; its
# CUDA strides follow cuFFT); the probe records the error and goes on
OLD_CPU_FFT_STRIDES = tuple(int(x) for x in torch.__version__.split(".")[:2]) < (2, 13)


@pytest.mark.parametrize("L", [200, 300])  # FFT sizes 400 and 600: a power of two and not
def test_every_variant_computes_the_layers_convolution(L):
    part = probe.probe_length(layer(), L, args(), "cpu", torch.float32)
    rows = {r["variant"]: r for r in part["rows"]}
    refused = {"time_major_compiled"} if OLD_CPU_FFT_STRIDES else set()
    assert list(rows) == probe.VARIANTS, part["rows"]
    assert {n for n, r in rows.items() if r["status"] != "ok"} == refused, part["rows"]
    if refused:
        assert "expected size" in rows["time_major_compiled"]["error"]  # the stride check, nothing else
    for name in probe.SAME_MATH - refused:
        assert rows[name]["diff"] <= 1e-5, name  # float32 throughout: the same function
    assert part["fft_size"] == probe.next_fast_len(2 * L)


def test_the_plain_functions_equal_the_layer_in_bf16():
    s4d, L = layer(), 160
    k, q = torch.randn(1, L, 24).bfloat16(), torch.randn(1, L, 24).bfloat16()
    F = probe.next_fast_len(2 * L)
    with torch.no_grad():
        spec = s4d.whole_spectrum(F)
        ref = s4d._whole_gated_convolution(k, q, k, F).float()
        for out in (probe.channel_major(k, q, spec, F), probe.time_major(k, q, spec.t().contiguous(), F)):
            assert out.dtype == torch.bfloat16
            assert (out.float() - ref).abs().max() / ref.abs().max() <= probe.TOLERANCE


def test_a_failing_variant_is_recorded_and_the_others_run():
    seen = []  # what main writes after each row: a probe cut off keeps the rows it measured
    variants = args(variants=["model", "nonsense", "time_major"])
    part = probe.probe_length(layer(), 128, variants, "cpu", torch.float32, lambda p: seen.append(len(p["rows"])))
    assert seen == [1, 2, 3]
    assert [(r["variant"], r["status"]) for r in part["rows"]] == [
        ("model", "ok"),
        ("nonsense", "error"),
        ("time_major", "ok"),
    ]


def test_the_probe_writes_every_length_to_its_table(tmp_path):
    out = tmp_path / "c.json"
    probe.main(
        ["--device", "cpu", "--lengths", "128", "256", "--channels", "16", "--warmup", "0", "--repeat", "1"]
        + ["--variants", "model", "time_major", "--out", str(out)]
    )
    md = (tmp_path / "c.md").read_text()
    assert "| 128 | 256 | model |" in md and "| 128 | 256 | time_major |" in md and "| 256 | 512 | time_major |" in md
    assert [p["length"] for p in json.loads(out.read_text())["lengths"]] == [128, 256]


FP16_MAX = torch.finfo(torch.float16).max


def test_the_fp16_rows_keep_every_fft_within_float16s_range(monkeypatch):
    """fp16_fft's scaling (F^-1/2 on each side, the inverse unnormalized) keeps what enters and
    leaves each FFT within float16's range at 64K tokens for a worst case (a constant k, whose DC
    term sums every input), where channel_major's unscaled rfft does not: a CPU has no float16 FFT,
    so the float32 run's largest values are the check."""
    s4d, L, H = layer(4), 65536, 4
    F = probe.next_fast_len(2 * L)
    k, q = torch.full((1, L, H), 8.0), torch.ones(1, L, H)
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
        half = probe.fp16_fft(k, q, probe.half_spectrum(spec, F, torch.float32), F, torch.float32)
        assert 0 < max(seen.values()) < FP16_MAX / 8, seen  # headroom for k 8x larger still
        seen.clear()
        full = probe.channel_major(k, q, spec, F)
        assert seen["rfft"] > FP16_MAX  # the unscaled sums would overflow float16
    assert (half - full).abs().max() <= 1e-5 * full.abs().max()


def test_the_fp16_rows_say_where_their_ffts_ran_in_float32():
    part = probe.probe_length(
        layer(), 128, args(variants=["model", "fp16_fft", "ffts_only_fp16"]), "cpu", torch.float32
    )
    assert [r.get("fft_dtype") for r in part["rows"]] == [None, "float32", "float32"]
    md = probe.markdown(dict(channels=24, dtype="fp32", device="cpu", repeat=1, warmup=0, lengths=[part]))
    assert "| fp16_fft (FFTs in float32) |" in md and "| model |" in md
