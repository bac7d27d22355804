"""LOCOST's S4D layer without autograd, in variants: where its time goes on a GPU (issue 32;
``gpu_check.sh`` stage ``convprobe``).

With the kernel spectra cached, the S4D layers are most of LOCOST's encoder time on a GPU, and the
convolution most of theirs (the fifth H200 reading, ``results/h200_3ad560a``: 3.06 ms a layer at
64K, two float32 FFTs 1.93 of it; at 16K and 64K two strided element-wise kernels, the transposing
copies into and out of the FFT buffer, 0.18 and 0.72 ms a layer). This script times one base layer
(H = 768, bfloat16, batch 1), the three projections included, beside variants of the same math:

- ``model``: the layer's own no-grad call (``S4D._whole_channel_major``: the projections write
  k^T and q^T as (channels, tokens), so no copy transposes anything);
- ``transposed``: the form it replaced and its reference (projections in (B, L, H), a transposing
  cast into the (B, H, F) buffer, a transposing slice and gate back: ``S4D._whole_gated_convolution``
  between ``_kq`` and ``_output``), whose convolution, without the projections, every reading up
  to the fifth timed as ``model``;
- ``ffts_only``: the rfft and irfft of the (B, H, F) float32 buffer and nothing else;
- ``fp16_fft`` and ``ffts_only_fp16``: ``model`` and ``ffts_only`` with the buffer and the FFTs
  in float16 (cuFFT's half precision: powers of two only, half the bytes of every pass), the question
  at 64K. A CPU has no half-precision FFT: there these two run the same steps with float32 buffers
  (their rows say ``fft_dtype``).

Each row: median milliseconds of ``--repeat`` calls (CUDA events after ``--warmup``; wall on CPU),
the ratio to ``model``, and the largest difference from ``model``'s output relative to its largest
entry (bfloat16 outputs: a last-bit flip is ~4e-3). A variant that fails records its error. (The
third reading's compiled and time-major variants, slower than the eager form at both lengths, are
in the history of this file.)

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
VARIANTS = ["model", "transposed", "ffts_only", "ffts_only_fp16", "fp16_fft"]
SAME_MATH = {"transposed", "fp16_fft"}
HALF_FFT = {"ffts_only_fp16", "fp16_fft"}
TOLERANCE = 1e-2  # relative to the largest entry: bfloat16 rounding of the same float32 math


def transposed(layer, u, F: int):
    """The layer's no-grad call as the fifth reading timed it: (B, L, H) projections, transposing copies."""
    return layer._whole_transposed(u, None, F)


def half_spectrum(spec, F: int, fft_dtype):
    """``spec`` (H, F/2+1) complex64 scaled by F^-1/2 for :func:`fp16_fft`, in ``fft_dtype``'s
    complex type (complex32 for float16)."""
    complex_dtype = torch.complex32 if fft_dtype == torch.float16 else torch.complex64
    return (spec * F**-0.5).to(complex_dtype)


def fp16_fft(layer, u, spec_h, F: int, fft_dtype=torch.float16):
    """The layer's no-grad call (``S4D._whole_channel_major``, one chunk) with the buffer and both
    FFTs in ``fft_dtype``; spec_h from :func:`half_spectrum`.

    float16 tops out at 65504 and an FFT's outputs are sums of F inputs, so both factors are scaled
    by F^-1/2 before they meet an FFT: k on its way into the buffer, the spectrum once; the inverse
    runs with ``norm="forward"`` (no 1/F), so y = (1/F) sum_f X_f Kf_f e^(...) comes out at its own
    scale. (torch applies an FFT's ``norm`` after cuFFT has summed, so it cannot do the scaling.)
    That output is not clamped: it stays within float16's range while |y| <= ||K||_1 max|k| does,
    which depends on the kernels (a row whose y overflowed shows it in its ``diff``), so a model
    path would need the clamp or a bound checked per layer.
    """
    B, L, H = u.shape
    ut = u.reshape(B * L, H).t()  # (H, B L) view
    kt = torch.addmm(layer.k_proj.bias[:, None], layer.k_proj.weight, ut)  # (H, B L)
    qt = torch.addmm(layer.q_proj.bias[:, None], layer.q_proj.weight, ut)
    xp = torch.zeros(B, H, F, dtype=fft_dtype, device=u.device)
    torch.mul(kt.view(H, B, L).transpose(0, 1), F**-0.5, out=xp[..., :L])
    y = torch.fft.irfft(torch.fft.rfft(xp) * spec_h, n=F, norm="forward")[..., :L]  # (B, H, L)
    gated = torch.empty(H, B * L, dtype=u.dtype, device=u.device)
    torch.mul(y.float(), qt.view(H, B, L).transpose(0, 1), out=gated.view(H, B, L).transpose(0, 1))
    w = layer.output_linear
    return torch.addmm(w.bias, gated.t(), w.weight.t()).view(B, L, H)


def ffts_only(buf, F: int):
    return torch.fft.irfft(torch.fft.rfft(buf), n=F)


def probe_length(layer, L, args, device, dtype, on_row=None):
    """One length's rows; ``layer`` in ``dtype`` on ``device``, its projections plain ``nn.Linear``."""
    gen = torch.Generator().manual_seed(L)
    H = args.channels
    u = torch.randn(1, L, H, generator=gen).to(device, dtype)
    F = next_fast_len(2 * L)
    with torch.no_grad():
        spec = layer.whole_spectrum(F)
        if spec is None:
            raise SystemExit(
                f"conv_probe.py: error: the spectrum at {L:,} tokens does not fit the layer's cache budget"
            )
    # float16 FFTs where cuFFT has them; a CPU runs the half-precision rows' steps in float32
    fft_dtype = torch.float16 if device == "cuda" else torch.float32

    def variant(name):
        if name == "model":
            return lambda: layer._whole_channel_major(u, None, F)
        if name == "transposed":
            return lambda: transposed(layer, u, F)
        if name in ("ffts_only", "ffts_only_fp16"):
            buf = torch.zeros(1, H, F, dtype=torch.float32 if name == "ffts_only" else fft_dtype, device=device)
            return lambda: ffts_only(buf, F)
        if name == "fp16_fft":
            spec_h = half_spectrum(spec, F, fft_dtype)
            return lambda: fp16_fft(layer, u, spec_h, F, fft_dtype)
        raise ValueError(name)

    def prepare(name):
        return variant(name), ({"fft_dtype": str(fft_dtype).split(".")[1]} if name in HALF_FFT else {})

    part = {"length": L, "fft_size": F, "rows": []}
    names = args.variants or VARIANTS
    time_variants(names, prepare, device, args.warmup, args.repeat, SAME_MATH, relative_difference, part, on_row)
    return part


def markdown(result) -> str:
    out = [
        f"One S4D layer without autograd, its projections included (H = {result['channels']}, "
        f"{result['dtype']}, batch 1, spectra cached) on `{result['device']}`; median of {result['repeat']} "
        f"calls after {result['warmup']}; diff: largest |difference| from `model` relative to its largest entry.\n",
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
    layer = S4D(args.channels).to(args.device, dtype).eval()
    for i, L in enumerate(args.lengths):

        def on_row(part, i=i):
            result["lengths"][i:] = [part]
            write(result, args.out, markdown)

        probe_length(layer, L, args, args.device, dtype, on_row)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
