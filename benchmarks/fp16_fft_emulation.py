"""How far float16 storage takes LOCOST's convolution from float64, emulated on a CPU (issue 32;
``conv_probe.py``'s ``fp16_fft`` row, whose speed and own error only a GPU measures).

A CPU has no float16 FFT. This runs the convolution steps of ``conv_probe.fp16_fft`` in float32 and rounds to float16
(complex: each part) wherever the card's float16 path stores a tensor: the scaled input buffer, the
scaled spectrum, the rfft's output, the product, the irfft's output. What it leaves out is cuFFT's
arithmetic inside its float16 passes, so it bounds the card's error from below, not above. Each row:
the largest |difference| relative to the reference's largest entry, for one S4D layer (bfloat16
activations, batch 1, its spectrum from its cache), of

- ``emulated vs model``: the emulation against the layer's gated convolution in float32
  (``model``: ``S4D._whole_gated_convolution``, without the projections, its output in bfloat16);
- ``model vs float64`` and ``emulated vs float64``: each against the same convolution in float64.

    python benchmarks/fp16_fft_emulation.py --lengths 16384 65536 --channels 16 \\
        --out benchmarks/results/fp16_fft_emulation.json
"""

import argparse
import time

import torch

from conv_probe import half_spectrum  # benchmarks/conv_probe.py, beside this script
from probes import relative_difference, write
from lsg_layers.modules.s4d import S4D
from lsg_text.provenance import cpu_name
from lsg_layers.ops.ssm import next_fast_len


def fp16(z: torch.Tensor) -> torch.Tensor:
    """``z`` rounded to float16 and back (a complex tensor: each part), in its own dtype."""
    if z.is_complex():
        return torch.complex(z.real.half().float(), z.imag.half().float())
    return z.half().float()


def emulated(k, q, spec, F: int):
    """``conv_probe.fp16_fft`` with float32 FFTs, rounded to float16 where the card stores."""
    B, L, H = k.shape
    xp = torch.zeros(B, H, F)
    xp[..., :L] = k.transpose(1, 2).float() * F**-0.5
    X = fp16(torch.fft.rfft(fp16(xp)))
    y = fp16(torch.fft.irfft(fp16(X * fp16(half_spectrum(spec, F, torch.float32))), n=F, norm="forward"))
    return (y[..., :L].transpose(1, 2) * q.float()).to(k.dtype)


def float64_convolution(k, q, spec, F: int):
    B, L, H = k.shape
    xp = torch.zeros(B, H, F, dtype=torch.float64)
    xp[..., :L] = k.transpose(1, 2).double()
    y = torch.fft.irfft(torch.fft.rfft(xp) * spec.to(torch.complex128), n=F)
    return y[..., :L].transpose(1, 2) * q.double()


def measure(layer, L: int) -> dict:
    gen = torch.Generator().manual_seed(L)
    H = layer.H
    k = torch.randn(1, L, H, generator=gen).bfloat16()
    q = torch.randn(1, L, H, generator=gen).bfloat16()
    F = next_fast_len(2 * L)
    with torch.no_grad():
        spec = layer.whole_spectrum(F)
        model = layer._whole_gated_convolution(k, q, F, k.dtype).float()
        emul = emulated(k, q, spec, F).float()
        exact = float64_convolution(k, q, spec, F)
    scaled = spec.abs() * F**-0.5
    return {
        "length": L,
        "fft_size": F,
        "emulated_vs_model": float(relative_difference(emul, model)),
        "model_vs_float64": float(relative_difference(model.double(), exact)),
        "emulated_vs_float64": float(relative_difference(emul.double(), exact)),
        "spectrum_subnormal_share": float((scaled < torch.finfo(torch.float16).tiny).double().mean()),
    }


def markdown(result) -> str:
    out = [
        f"LOCOST's convolution with float16 storage, emulated on a CPU (`{result['cpu']}`, torch "
        f"{result['torch']}): one S4D layer of {result['channels']} channels, bfloat16 activations; "
        "largest |difference| relative to the reference's largest entry; subnormal: the share of the "
        "scaled spectrum's entries below float16's smallest normal. "
        f"Command: `{result['command']}` ({result['wall_s']:.1f} s).\n",
        "| tokens | FFT size | emulated vs model | model vs float64 | emulated vs float64 | subnormal |",
        "|---:|---:|---:|---:|---:|---:|",
    ]
    for r in result["rows"]:
        out.append(
            f"| {r['length']:,} | {r['fft_size']:,} | {r['emulated_vs_model']:.1e} | "
            f"{r['model_vs_float64']:.1e} | {r['emulated_vs_float64']:.1e} | {r['spectrum_subnormal_share']:.1%} |"
        )
    return "\n".join(out) + "\n"


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--lengths", type=int, nargs="+", default=[16384, 65536])
    p.add_argument("--channels", type=int, default=16)
    p.add_argument("--out", required=True, help="JSON; the table beside it as .md")
    args = p.parse_args(argv)
    t0 = time.perf_counter()
    torch.manual_seed(0)
    layer = S4D(args.channels).eval()
    rows = [measure(layer, L) for L in args.lengths]
    command = "python benchmarks/fp16_fft_emulation.py --lengths " + " ".join(map(str, args.lengths))
    result = dict(
        channels=args.channels,
        cpu=cpu_name(),
        torch=torch.__version__,
        command=f"{command} --channels {args.channels} --out {args.out}",
        wall_s=time.perf_counter() - t0,
        rows=rows,
    )
    write(result, args.out, markdown)
    print(markdown(result), end="")


if __name__ == "__main__":
    main()
