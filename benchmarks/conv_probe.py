"""LOCOST's convolution alone, in variants: where its time goes on a GPU (issue 32; ``gpu_check.sh``
stage ``convprobe``).

With the kernel spectra cached, the S4D layers of LOCOST's encoder spend most of their time in the
convolution: 7.64 ms of 18.5 at 16K tokens on the second H200 reading (``fused16k``), where the
issue's 3x-linear target leaves the SSM ~4.8 ms for all 12 layers. The whole-tensor path without
autograd (``S4D._whole_gated_convolution``) copies k (B, L, H) into a zeroed (B, H, F) float32
buffer (a transposing cast), runs rfft, the product with the cached spectrum in place, irfft, and
one multiply that slices, transposes back, gates and casts. This script times that call on one
base layer (H = 768, bf16 activations, batch 1) beside variants of the same math:

- ``model``: the layer's own method, spectrum from its cache;
- ``channel_major``: the same steps as a plain function (the reference of the compiled row);
- ``time_major``: no transposes at all: a (B, F, H) buffer, FFTs along dim 1 (cuFFT's strided
  batches), the spectrum stored (F/2+1, H);
- ``*_compiled``: ``torch.compile`` of each (the FFTs stay cuFFT calls; the copies, the product and
  the gate may fuse around them);
- ``ffts_only``: the rfft and irfft of the (B, H, F) buffer and nothing else: the FFTs' own share;
- ``fp16_fft`` and ``ffts_only_fp16``: the same two with the FFTs in float16 (cuFFT's half
  precision: powers of two only, half the bytes of every pass), the question at 64K, where two
  float32 FFTs alone take more than the 3x target leaves the layer. A CPU has no half-precision FFT:
  there these two run the same steps with float32 buffers (their rows say ``fft_dtype``).

Each row: median milliseconds of ``--repeat`` calls (CUDA events after ``--warmup``; wall on CPU),
the ratio to ``model``, and the largest difference from ``model``'s output relative to its largest
entry (bfloat16 outputs: a last-bit flip is ~4e-3). A variant that fails records its error.

    python benchmarks/conv_probe.py --device cuda --lengths 16384 65536 --out /tmp/convprobe.json
    python benchmarks/conv_probe.py --device cpu --lengths 256 --channels 32 --out /tmp/c.json   # CI
"""

import argparse

import torch

from probes import (  # benchmarks/probes.py, beside this script
    add_common_args,
    relative_difference,
    row_cells,
    start_result,
    time_variants,
    write,
)
from lsg_layers.modules.s4d import S4D
from lsg_layers.ops.ssm import next_fast_len

# the rows that tell the most first (a probe cut off by its stage's limit keeps the rows it measured)
VARIANTS = [
    "model",
    "ffts_only",
    "ffts_only_fp16",
    "fp16_fft",
    "time_major",
    "time_major_compiled",
    "channel_major_compiled",
    "channel_major",
]
SAME_MATH = {"channel_major", "time_major", "channel_major_compiled", "time_major_compiled", "fp16_fft"}
HALF_FFT = {"ffts_only_fp16", "fp16_fft"}
TOLERANCE = 1e-2  # relative to the largest entry: bfloat16 rounding of the same float32 math


def channel_major(k, q, spec, F: int):
    """((K * k) + D k) q as the layer computes it: (B, L, H) in k's dtype; spec (H, F/2+1)."""
    B, L, H = k.shape
    xp = torch.zeros(B, H, F, dtype=torch.float32, device=k.device)
    xp[..., :L] = k.transpose(1, 2)
    y = torch.fft.irfft(torch.fft.rfft(xp) * spec, n=F)  # (B, H, F)
    return (y[..., :L].transpose(1, 2) * q).to(k.dtype)


def time_major(k, q, spec_t, F: int):
    """The same with time as dim 1 throughout: no transposes; spec_t (F/2+1, H)."""
    B, L, H = k.shape
    xp = torch.zeros(B, F, H, dtype=torch.float32, device=k.device)
    xp[:, :L] = k
    y = torch.fft.irfft(torch.fft.rfft(xp, dim=1) * spec_t, n=F, dim=1)  # (B, F, H)
    return (y[:, :L] * q).to(k.dtype)


def half_spectrum(spec, F: int, fft_dtype):
    """``spec`` (H, F/2+1) complex64 scaled by F^-1/2 for :func:`fp16_fft`, in ``fft_dtype``'s
    complex type (complex32 for float16)."""
    complex_dtype = torch.complex32 if fft_dtype == torch.float16 else torch.complex64
    return (spec * F**-0.5).to(complex_dtype)


def fp16_fft(k, q, spec_h, F: int, fft_dtype=torch.float16):
    """:func:`channel_major` with the buffer and both FFTs in ``fft_dtype``; spec_h from
    :func:`half_spectrum`.

    float16 tops out at 65504 and an FFT's outputs are sums of F inputs, so both factors are scaled
    by F^-1/2 before they meet an FFT: k on its way into the buffer, the spectrum once; the inverse
    runs with ``norm="forward"`` (no 1/F), so y = (1/F) sum_f X_f Kf_f e^(...) comes out at its own
    scale. (torch applies an FFT's ``norm`` after cuFFT has summed, so it cannot do the scaling.)
    """
    B, L, H = k.shape
    xp = torch.zeros(B, H, F, dtype=fft_dtype, device=k.device)
    xp[..., :L] = k.transpose(1, 2) * F**-0.5
    y = torch.fft.irfft(torch.fft.rfft(xp) * spec_h, n=F, norm="forward")  # (B, H, F)
    return (y[..., :L].transpose(1, 2).float() * q).to(k.dtype)


def ffts_only(buf, F: int):
    return torch.fft.irfft(torch.fft.rfft(buf), n=F)


def probe_length(layer, L, args, device, dtype, on_row=None):
    gen = torch.Generator().manual_seed(L)
    H = args.channels
    k = torch.randn(1, L, H, generator=gen).to(device, dtype)
    q = torch.randn(1, L, H, generator=gen).to(device, dtype)
    F = next_fast_len(2 * L)
    with torch.no_grad():
        spec = layer.whole_spectrum(F)
        if spec is None:
            raise SystemExit(
                f"conv_probe.py: error: the spectrum at {L:,} tokens does not fit the layer's cache budget"
            )
        spec_t = spec.t().contiguous()

    # float16 FFTs where cuFFT has them; a CPU runs the half-precision rows' steps in float32
    fft_dtype = torch.float16 if device == "cuda" else torch.float32

    def variant(name):
        if name == "model":
            return lambda: layer._whole_gated_convolution(k, q, k, F)
        if name == "channel_major":
            return lambda: channel_major(k, q, spec, F)
        if name == "time_major":
            return lambda: time_major(k, q, spec_t, F)
        if name.endswith("_compiled"):
            base = name[: -len("_compiled")]
            fn = torch.compile(globals()[base], dynamic=False)
            s = spec if base == "channel_major" else spec_t
            return lambda: fn(k, q, s, F)
        if name == "ffts_only":
            buf = torch.zeros(1, H, F, dtype=torch.float32, device=device)  # (B, H, F) as the layer's
            return lambda: ffts_only(buf, F)
        if name == "ffts_only_fp16":
            buf = torch.zeros(1, H, F, dtype=fft_dtype, device=device)
            return lambda: ffts_only(buf, F)
        if name == "fp16_fft":
            spec_h = half_spectrum(spec, F, fft_dtype)
            return lambda: fp16_fft(k, q, spec_h, F, fft_dtype)
        raise ValueError(name)

    def prepare(name):
        return variant(name), ({"fft_dtype": str(fft_dtype).split(".")[1]} if name in HALF_FFT else {})

    part = {"length": L, "fft_size": F, "rows": []}
    names = args.variants or VARIANTS
    time_variants(names, prepare, device, args.warmup, args.repeat, SAME_MATH, relative_difference, part, on_row)
    return part


def markdown(result) -> str:
    out = [
        f"One S4D layer's convolution (H = {result['channels']}, {result['dtype']} activations, batch 1, "
        f"spectra cached) on `{result['device']}`; median of {result['repeat']} calls after "
        f"{result['warmup']}; diff: largest |difference| from `model` relative to its largest entry.\n",
        "| tokens | FFT size | variant | first call s | ms | x model | diff |",
        "|---:|---:|---|---:|---:|---:|---:|",
    ]
    for part in result["lengths"]:
        for r in part["rows"]:
            label = r["variant"] + (
                f" (FFTs in {r['fft_dtype']})" if r.get("fft_dtype", "float16") != "float16" else ""
            )
            head = f"| {part['length']:,} | {part['fft_size']:,} | {label} |"
            out.append(head + row_cells(r, TOLERANCE))
    return "\n".join(out) + "\n"


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_common_args(p)
    p.add_argument("--lengths", type=int, nargs="+", default=[16384, 65536])
    p.add_argument("--channels", type=int, default=768, help="H (base: 768)")
    p.add_argument("--variants", nargs="+", choices=VARIANTS, help="only these (default: all)")
    args = p.parse_args(argv)
    dtype, result = start_result(p, args, ("device", "channels", "dtype", "warmup", "repeat"))
    result["lengths"] = []
    torch.manual_seed(0)
    layer = S4D(args.channels).to(args.device).eval()
    for i, L in enumerate(args.lengths):

        def on_row(part, i=i):
            result["lengths"][i:] = [part]
            write(result, args.out, markdown)

        probe_length(layer, L, args, args.device, dtype, on_row)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
