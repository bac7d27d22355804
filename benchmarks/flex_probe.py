"""The flex kernel alone, in variants: where its time goes on a GPU (issue 33; ``gpu_check.sh``
stage ``flexprobe``).

The second H200 reading put 70% of the LSG encoder's device time in one kernel,
``triton_tem_fused_flex_attention``: 2.45 ms a layer at 16K tokens where the tiles it keeps need
~0.1 ms (``benchmarks/flex_gpu_notes.md``). This script calls that kernel on one layer's shapes
(base size: 12 heads of 64, bf16, batch 1; LSG norm: bs = sbs = 128, sf 2, 1 global; LED: window
1,024, the first token global) with the block tables the layers build (``lsg_layers.ops.flex``),
and changes one thing at a time:

- ``model``: the call as the layer makes it (``ops.flex.flex_attention``: compiled once, shapes
  dynamic after the first; q, k, v strided views of the projections; on CUDA its kernel options,
  ``ops.flex.CUDA_KERNEL_OPTIONS``, since the third reading);
- ``contiguous``: q, k, v copied contiguous; ``static`` / ``dynamic``: a fresh
  ``torch.compile(flex_attention, dynamic=False / True)``, flex's default kernel options (what
  ``model`` ran before the third reading);
- ``trivial_mod``: the same tables, a mask_mod that keeps everything (no loads of the validity
  tensors in partial tiles); ``all_full``: every kept tile whole (no mask_mod evaluated at all);
- ``opt_*``: kernel options (tile sizes, warps, stages, TMA, the row-safety and prescale flags), on
  the static compile;
- ``band``: a plain sliding window keeping as many key tiles per query tile, its tables from
  ``create_block_mask`` (how fast flex runs a simple band of that size on this card);
- ``sdpa_dense``: full attention over the same tokens with SDPA (the ``bart`` row's kernel).

A variant with the same math as ``model`` reports its largest difference from it. Each row:
the first call's seconds (the compile), the median of ``--repeat`` calls timed with CUDA events
after ``--warmup`` (on CPU: wall), the throughput on the kept tiles (4 d x 128^2 FLOPs per tile and
head) and the ratio to ``model``. A variant that fails records its error and the others go on.

    python benchmarks/flex_probe.py --device cuda --length 16384 --out /tmp/flexprobe.json
    python benchmarks/flex_probe.py --device cpu --eager --length 512 --heads 2 --out /tmp/p.json  # CI

``--eager`` (CPU smoke only) calls flex uncompiled: the dense fallback, every variant the same
kernel; it checks the harness, not the kernels.
"""

import argparse
import warnings

import torch

from probes import (  # benchmarks/probes.py, beside this script
    add_common_args,
    largest_difference,
    row_cells,
    start_result,
    time_variants,
    write,
)
from lsg_layers.ops import flex
from lsg_layers.ops.compiling import raise_recompile_limit

OPTIONS = {
    "opt_bm64_bn64": {"BLOCK_M": 64, "BLOCK_N": 64},
    "opt_bn64": {"BLOCK_N": 64},
    "opt_warps8": {"num_warps": 8},
    "opt_stages2": {"num_stages": 2},
    "opt_safe_prescale": {"ROWS_GUARANTEED_SAFE": True, "PRESCALE_QK": True},
    "opt_tma": {"USE_TMA": True},
}
SAME_MATH = {"model", "contiguous", "static", "dynamic", *OPTIONS}
# the rows that tell the hypotheses apart first (a probe cut off by its stage's limit keeps the rows
# it measured)
LSG_VARIANTS = ["model", "all_full", "band", "sdpa_dense", "trivial_mod", "static", *OPTIONS, "contiguous", "dynamic"]
LED_VARIANTS = ["model", "all_full", "trivial_mod", "static", "opt_bn64", "opt_bm64_bn64", "opt_warps8"]
TOLERANCE = 2e-2  # bf16 outputs of one softmax through two tilings: rounding, not a different function


def lsg_problem(L, h, d, device, dtype, gen):
    """One LSG-BART base layer's flex call: q over the t tokens, keys [tokens | global | dead | sparse]."""
    G, bs, sf, sbs = 1, 128, 2, 128
    layout = flex.LSGLayout(L, G, bs, bs // sf, sbs, L // sf)
    q_buf = torch.randn(1, G + L, h, d, generator=gen).to(device, dtype)  # (n, S, h, d) as projected
    k_buf = torch.randn(1, layout.length, h, d, generator=gen).to(device, dtype)
    v_buf = torch.randn(1, layout.length, h, d, generator=gen).to(device, dtype)
    key_ok = torch.ones(1, L + G, dtype=torch.bool, device=device)
    sparse_ok = torch.ones(1, h, layout.ns, dtype=torch.bool, device=device)
    mask_mod = flex.lsg_mask_mod(layout, key_ok, sparse_ok)
    block_mask = flex.lsg_block_mask(layout, key_ok, mask_mod)
    qkv = (q_buf[:, G:].transpose(1, 2), k_buf.transpose(1, 2), v_buf.transpose(1, 2))
    return qkv, block_mask


def led_problem(L, h, d, device, dtype, gen):
    """One LED base layer's flex call (window 1,024: w = 512 each side), the first token global."""
    w = 512
    qkv = tuple(torch.randn(1, L, h, d, generator=gen).to(device, dtype).transpose(1, 2) for _ in range(3))
    real = torch.ones(1, L, dtype=torch.bool, device=device)
    glob = torch.zeros(1, L, dtype=torch.bool, device=device)
    glob[:, 0] = True
    block_mask = flex.led_block_mask(w, real, glob, flex.led_mask_mod(w, real, glob))
    return qkv, block_mask


def kept_tiles(block_mask) -> int:
    """Tiles the kernel computes for one head (the tables are shared by the heads)."""
    n = int(block_mask.kv_num_blocks.sum())
    if block_mask.full_kv_num_blocks is not None:
        n += int(block_mask.full_kv_num_blocks.sum())
    return n


def all_full(block_mask):
    """The same kept tiles, every one whole: the kernel evaluates no mask_mod."""
    from torch.nn.attention.flex_attention import BlockMask

    tables = block_mask.kv_indices  # (n, 1, nq, nk)
    kept = torch.zeros(tables.shape, dtype=torch.int32, device=tables.device)  # times each tile is listed
    for num, idx in (
        (block_mask.kv_num_blocks, block_mask.kv_indices),
        (block_mask.full_kv_num_blocks, block_mask.full_kv_indices),
    ):
        if num is not None:
            listed = torch.arange(idx.size(-1), device=idx.device) < num[..., None]  # the first num entries
            kept.scatter_add_(-1, idx.long(), listed.int())
    num, idx = flex._ordered(kept[:, 0] > 0)  # every kept tile in the "full" tables
    # empty partial tables of their own: with one tensor as both index tables, torch 2.11's
    # compiled flex recompiles on the aliasing and fails while logging why
    no_partial, no_index = torch.zeros_like(num), torch.zeros_like(idx)
    return BlockMask.from_kv_blocks(
        no_partial, no_index, num, idx, BLOCK_SIZE=flex.BLOCK, mask_mod=None, seq_lengths=block_mask.seq_lengths
    )


def band(L_q, L_kv, tiles_per_query_tile, device):
    """A sliding window over one tensor of L_kv keys with about as many key tiles per query tile."""
    from torch.nn.attention.flex_attention import create_block_mask

    half = max(0, (tiles_per_query_tile - 1) * flex.BLOCK // 2)

    def mask_mod(b, h, q_idx, kv_idx):
        return (q_idx - kv_idx).abs() <= half

    return create_block_mask(mask_mod, None, None, L_q, L_kv, device=device, _compile=device != "cpu")


def run_pattern(name, variants, args, device, dtype, on_row=None):
    from torch.nn.attention.flex_attention import flex_attention as raw_flex

    gen = torch.Generator().manual_seed(0)
    h, d = args.heads, args.head_dim
    make = lsg_problem if name == "lsg" else led_problem
    (q, k, v), block_mask = make(args.length, h, d, device, dtype, gen)
    scale = d**-0.5
    tiles = kept_tiles(block_mask)
    nq = block_mask.kv_num_blocks.size(-1)

    def compiled(dynamic):
        return raw_flex if args.eager else torch.compile(raw_flex, dynamic=dynamic)

    def model_call():
        if args.eager:
            return raw_flex(q, k, v, block_mask=block_mask, scale=scale)
        return flex.flex_attention(q, k, v, block_mask, scale)

    def variant(vname):
        """(callable, tiles it computes per head)."""
        if vname == "model":
            return model_call, tiles
        if vname == "contiguous":
            qc, kc, vc = q.contiguous(), k.contiguous(), v.contiguous()
            fn = compiled(None)
            return (lambda: fn(qc, kc, vc, block_mask=block_mask, scale=scale)), tiles
        if vname in ("static", "dynamic"):
            fn = compiled(vname == "dynamic")
            return (lambda: fn(q, k, v, block_mask=block_mask, scale=scale)), tiles
        if vname == "trivial_mod":
            bm = flex.with_mask_mod(block_mask, lambda b, hh, qi, ki: qi >= 0)
            fn = compiled(False)
            return (lambda: fn(q, k, v, block_mask=bm, scale=scale)), tiles
        if vname == "all_full":
            bm = all_full(block_mask)
            fn = compiled(False)
            return (lambda: fn(q, k, v, block_mask=bm, scale=scale)), kept_tiles(bm)
        if vname in OPTIONS:
            fn, opts = compiled(False), OPTIONS[vname]
            return (lambda: fn(q, k, v, block_mask=block_mask, scale=scale, kernel_options=opts)), tiles
        if vname == "band":
            bm = band(q.size(2), k.size(2), round(tiles / nq), device)
            fn = compiled(False)
            return (lambda: fn(q, k, v, block_mask=bm, scale=scale)), kept_tiles(bm)
        if vname == "sdpa_dense":
            kd, vd = k[:, :, : q.size(2)], v[:, :, : q.size(2)]
            return (lambda: torch.nn.functional.scaled_dot_product_attention(q, kd, vd, scale=scale)), nq * nq
        raise ValueError(vname)

    part = {"tiles_per_head": tiles, "query_tiles": nq, "kv_length": k.size(2), "rows": []}

    def prepare(vname):
        fn, vtiles = variant(vname)
        return fn, {"tiles_per_head": vtiles}

    def row_done(part):
        row = part["rows"][-1]
        if row["status"] == "ok":
            row["tflops"] = 4 * d * flex.BLOCK**2 * h * row["tiles_per_head"] / (row["ms"] * 1e-3) / 1e12
        if on_row is not None:
            on_row(part)

    time_variants(variants, prepare, device, args.warmup, args.repeat, SAME_MATH, largest_difference, part, row_done)
    return part


def markdown(result) -> str:
    out = [
        f"One base layer's flex call at {result['length']:,} tokens ({result['heads']} heads of "
        f"{result['head_dim']}, {result['dtype']}, batch 1) on `{result['device']}`"
        + (" (eager: the harness only)" if result["eager"] else "")
        + f"; median of {result['repeat']} calls after {result['warmup']}. TFLOP/s: 4 d 128^2 per kept "
        "tile and head over the time; diff: largest |difference| from `model` (same math only).\n"
    ]
    for name, part in result["patterns"].items():
        out.append(
            f"**{name}**: {part['tiles_per_head']:,} key tiles kept over {part['query_tiles']} query tiles "
            f"({part['tiles_per_head'] / part['query_tiles']:.2f} each), {part['kv_length']:,} keys\n"
        )
        out.append("| variant | first call s | ms | x model | TFLOP/s | diff |")
        out.append("|---|---:|---:|---:|---:|---:|")
        for r in part["rows"]:
            tflops = [f"{r['tflops']:.3g}"] if r["status"] == "ok" else [""]
            out.append(f"| {r['variant']} |" + row_cells(r, TOLERANCE, tflops))
        out.append("")
    return "\n".join(out)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_common_args(p)
    p.add_argument("--length", type=int, default=16384, help="tokens (a multiple of 128)")
    p.add_argument("--heads", type=int, default=12)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--patterns", nargs="+", default=["lsg", "led"], choices=["lsg", "led"])
    p.add_argument("--variants", nargs="+", help="only these (default: every variant of each pattern)")
    p.add_argument("--eager", action="store_true", help="CPU smoke: flex uncompiled (the dense fallback)")
    args = p.parse_args(argv)
    if args.length % flex.BLOCK:
        p.error(f"--length must be a multiple of {flex.BLOCK}, got {args.length}")
    fields = ("device", "length", "heads", "head_dim", "dtype", "warmup", "repeat", "eager")
    dtype, result = start_result(p, args, fields)
    if args.eager and args.device != "cpu":
        p.error("--eager is the CPU smoke's (the dense fallback would not fit a GPU at these lengths)")
    if not flex.available():
        p.error(f"this torch ({torch.__version__}) has no FlexAttention")
    result["patterns"] = {}
    # every variant compiles flex anew: past dynamo's default limit (8 versions, hit at the third
    # reading's 9th variant) the rest ran uncompiled, 170 ms each
    raise_recompile_limit()
    warnings.filterwarnings("ignore", message=".*flex_attention called without torch.compile.*")
    for name in args.patterns:
        variants = LSG_VARIANTS if name == "lsg" else LED_VARIANTS
        if args.variants:
            variants = [v for v in variants if v in args.variants]

        def on_row(part, name=name):
            result["patterns"][name] = part
            write(result, args.out, markdown)

        run_pattern(name, variants, args, args.device, dtype, on_row)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
