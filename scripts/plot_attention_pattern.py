#!/usr/bin/env python
"""Draw which keys each query attends to for an LSG or LED (Longformer) attention config.

The picture of the LSG paper's Figures 1/4: a queries x keys grid, keys coloured local / sparse /
global, plus the row of one chosen query. Nothing is re-implemented here: the real attention
module (``LSGSelfAttention`` / ``LongformerSelfAttention``, tiny width, random weights) runs on a
random input and a key counts as attended when the query's output has a non-zero gradient with
respect to that key's projected key or value (masked keys get exactly zero weight, so exactly zero
gradient). Keys are then named with the index helpers the modules use (``ops.blocks``): global =
global token, local = inside the query block's local window (``local_window_indices``; LED: the
band), sparse = anything else that was attended.

    python scripts/plot_attention_pattern.py --out lsg.png                  # LSG norm, 512 tokens
    python scripts/plot_attention_pattern.py --sparsity-type pooling --query 300 --out pool.png
    python scripts/plot_attention_pattern.py --model led --attention-window 64 --out led.png

Data-dependent sparsity types (norm, lsh) depend on the input: the picture shows one random
input. Per-head types (norm, stride, block_stride, lsh) differ per head: ``--head`` picks one
(default 0; ``--head all`` draws the union over heads).
"""

import argparse
import os
import sys

import torch

from lsg_layers.modules.longformer_attention import LongformerSelfAttention
from lsg_layers.modules.lsg_attention import LSGSelfAttention
from lsg_layers.modules.lsg_config import MAX_GLOBAL_TOKENS, SPARSITY_TYPES
from lsg_layers.ops.blocks import local_window_indices, num_blocks
from lsg_text.argtypes import NON_NEGATIVE_INT, POSITIVE_INT, TORCH_SEED, int_range
from lsg_text.atomic import atomic_files
from lsg_text.errors import OneLineArgumentParser, report
from lsg_text.fileio import DataError, check_output_path

PROG = "plot_attention_pattern.py"
NONE, LOCAL, SPARSE, GLOBAL = 0, 1, 2, 3
NAMES = {LOCAL: "local", SPARSE: "sparse", GLOBAL: "global"}
COLOURS = ["#ffffff", "#1f77b4", "#ff7f0e", "#2ca02c"]  # none, local, sparse, global


def build_attention(args):
    torch.manual_seed(args.seed)
    if args.model == "lsg":
        return LSGSelfAttention(
            args.dim,
            args.heads,
            num_global_tokens=args.num_global_tokens,
            block_size=args.block_size,
            sparse_block_size=args.sparse_block_size,
            sparsity_factor=args.sparsity_factor,
            sparsity_type=args.sparsity_type,
        ).eval()
    attn = LongformerSelfAttention(args.dim, args.heads, args.attention_window).eval()
    attn.fold_global = False  # project every token with the global k/v: ``attended`` hooks those outputs
    return attn


def attended(attn, x, queries, head, glob=None) -> torch.Tensor:
    """Bool (len(queries), positions): the keys each output position depends on (one head or all).

    One forward; then one backward per query through the same graph.
    """
    names = ["k_proj", "v_proj"]
    if isinstance(attn, LongformerSelfAttention):
        names += ["k_proj_global", "v_proj_global"]
    outputs = []
    hooks = [getattr(attn, n).register_forward_hook(lambda m, i, o: outputs.append(o)) for n in names]
    try:
        kwargs = {} if glob is None else {"global_attention_mask": glob}
        out, _ = attn(x, x, x, **kwargs)  # (T, 1, C)
    finally:
        for h in hooks:
            h.remove()
    T = x.size(0)
    seen = torch.zeros(len(queries), T, dtype=torch.bool)
    for row, q in enumerate(queries):
        grads = torch.autograd.grad(out[q].sum(), outputs, retain_graph=True, allow_unused=True)
        for g in grads:
            if g is None:
                continue
            # projections run batch-first on the (internally padded) input: (1, S, C), S >= T
            g = g.reshape(g.size(1), attn.num_heads, -1).abs().sum(dim=-1)  # (S, h)
            g = g if head == "all" else g[:, int(head) : int(head) + 1]
            seen[row] |= (g.sum(dim=1) != 0)[:T]  # padding positions dropped
    return seen


def lsg_categories(attn, L: int, queries, head, seed: int = 0) -> torch.Tensor:
    """(len(queries), G + L) category of every key position (globals first) for each query."""
    G, bs = attn.num_global_tokens, attn.block_size
    x = torch.randn(G + L, 1, attn.embed_dim, generator=torch.Generator().manual_seed(seed))
    seen = attended(attn, x, queries, head)
    window, valid = local_window_indices(num_blocks(L, bs), bs, 1, 1)  # (nb, 3*bs)
    cats = torch.full(seen.shape, NONE, dtype=torch.long)
    for row, query in enumerate(queries):
        cat = cats[row]
        if query < G:  # a global query attends to every key: the global row of the paper's figure
            cat[:] = GLOBAL
        elif L <= 2 * bs:  # short inputs: plain full attention, no blocks
            cat[G:] = LOCAL
        else:
            b = (query - G) // bs
            local = window[b][valid[b]]
            cat[G + local[local < L]] = LOCAL
            cat[G:][(cat[G:] == NONE) & seen[row, G:]] = SPARSE
        cat[:G] = GLOBAL
        cat[~seen[row]] = NONE
    return cats


def led_categories(attn, L: int, queries, head, global_positions, seed: int = 0) -> torch.Tensor:
    """(len(queries), L) category of every key position for each query."""
    x = torch.randn(L, 1, attn.embed_dim, generator=torch.Generator().manual_seed(seed))
    glob = torch.zeros(1, L, dtype=torch.bool)
    glob[0, list(global_positions)] = True
    seen = attended(attn, x, queries, head, glob)
    cats = torch.where(seen, LOCAL, NONE)
    cats[:, glob[0]] = GLOBAL  # global keys (column) ...
    cats[glob[0][list(queries)]] = GLOBAL  # ... and global queries (row, every key)
    cats[~seen] = NONE
    return cats


def pattern(args, attn, queries) -> torch.Tensor:
    if args.model == "lsg":
        return lsg_categories(attn, args.length, queries, args.head, args.seed)
    return led_categories(attn, args.length, queries, args.head, args.global_positions, args.seed)


def output_path(out: str) -> str:
    """--out as it will be written, refused up front if matplotlib cannot write it: a name without
    an extension gets .png, as matplotlib's savefig would silently add."""
    from matplotlib.backend_bases import FigureCanvasBase

    check_output_path(out, "--out")
    ext = os.path.splitext(out)[1][1:].lower()
    if not ext:
        check_output_path(out + ".png", "--out")  # the name written (a folder pdir.png for --out pdir)
        return out + ".png"
    formats = FigureCanvasBase.get_supported_filetypes()
    if ext not in formats:
        raise DataError(
            f"--out {out}: matplotlib cannot write .{ext} files (use one of .{', .'.join(sorted(formats))})"
        )
    return out


def parse_args(argv=None):
    p = OneLineArgumentParser(
        prog=PROG,
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=__doc__.split("\n\n", 1)[1],
    )
    p.add_argument("--model", choices=["lsg", "led"], default="lsg")
    p.add_argument("--length", type=POSITIVE_INT, default=512, help="input tokens (without LSG global tokens)")
    p.add_argument(
        "--query",
        type=NON_NEGATIVE_INT,
        default=None,
        help="token position of the highlighted query (default: middle of the input)",
    )
    p.add_argument("--head", default="0", help="head index, or 'all' for the union over heads")
    p.add_argument("--block-size", type=POSITIVE_INT, default=32)
    p.add_argument("--sparse-block-size", type=NON_NEGATIVE_INT, default=32)
    p.add_argument("--sparsity-factor", type=POSITIVE_INT, default=4)
    p.add_argument("--sparsity-type", default="norm", choices=SPARSITY_TYPES)
    p.add_argument("--num-global-tokens", type=int_range(1, MAX_GLOBAL_TOKENS), default=1)
    p.add_argument("--attention-window", type=POSITIVE_INT, default=64, help="LED: full window W (w = W/2 per side)")
    p.add_argument("--global-positions", default="0", help="LED: comma-separated global token positions")
    p.add_argument("--heads", type=POSITIVE_INT, default=4, help="heads of the tiny module drawn")
    p.add_argument("--dim", type=POSITIVE_INT, default=32, help="width of the tiny module drawn")
    p.add_argument(
        "--no-matrix",
        action="store_true",
        help="draw only the chosen query's row (the matrix costs one backward per query)",
    )
    p.add_argument("--seed", type=TORCH_SEED, default=0)
    p.add_argument("--out", required=True, help="PNG path")
    args = p.parse_args(argv)
    try:
        args.out = output_path(args.out)
    except DataError as e:
        p.exit(report(e, PROG))
    try:
        args.global_positions = [int(v) for v in args.global_positions.split(",") if v.strip()]
    except ValueError:
        p.error(f"--global-positions must be comma-separated token positions, got {args.global_positions!r}")
    if args.head != "all":
        if not args.head.isdigit() or int(args.head) >= args.heads:
            p.error(f"--head must be 'all' or an index < --heads ({args.heads}), got {args.head!r}")
    if args.query is None:
        args.query = args.length // 2
    if not 0 <= args.query < args.length:
        p.error(f"--query must be in [0, {args.length}), got {args.query}")
    if args.model == "led" and any(not 0 <= g < args.length for g in args.global_positions):
        p.error("--global-positions must lie inside the input")
    return args


def title(args) -> str:
    if args.model == "lsg":
        return (
            f"LSG: block {args.block_size}, sparse block {args.sparse_block_size}, factor "
            f"{args.sparsity_factor}, {args.sparsity_type}, {args.num_global_tokens} global, "
            f"{args.length} tokens, head {args.head}"
        )
    return (
        f"LED: window {args.attention_window} (w = {args.attention_window // 2}), globals at "
        f"{args.global_positions}, {args.length} tokens"
    )


def main(argv=None):
    args = parse_args(argv)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.colors import ListedColormap
    from matplotlib.patches import Patch

    try:
        attn = build_attention(args)
    except ValueError as e:
        sys.exit(report(e, PROG))
    G = args.num_global_tokens if args.model == "lsg" else 0
    offset = G  # the query's index in the attention input (LSG puts the globals first)
    torch.set_num_threads(1)  # hundreds of tiny backward passes: threads only add overhead
    T = args.length + G
    queries = [args.query + offset] if args.no_matrix else list(range(T))
    cats = pattern(args, attn, queries)  # (queries, keys)
    row = cats[queries.index(args.query + offset)]
    counts = {NAMES[c]: int((row == c).sum()) for c in (LOCAL, SPARSE, GLOBAL)}
    cmap = ListedColormap(COLOURS)

    panels = 1 if args.no_matrix else 2
    fig, axes = plt.subplots(
        panels,
        1,
        figsize=(8, 1.6 + (6.4 if panels == 2 else 0)),
        gridspec_kw={"height_ratios": [5, 1] if panels == 2 else [1]},
        squeeze=False,
    )
    if panels == 2:
        ax = axes[0][0]
        ax.imshow(cats.numpy(), cmap=cmap, vmin=0, vmax=3, interpolation="nearest", aspect="auto")
        ax.axhline(args.query + offset, color="black", lw=0.6, ls=":")
        ax.set_ylabel("query position" + (" (globals first)" if G else ""))
        ax.set_title(title(args), fontsize=9)
    ax = axes[-1][0]
    ax.imshow(row[None].numpy(), cmap=cmap, vmin=0, vmax=3, interpolation="nearest", aspect="auto")
    ax.axvline(args.query + offset, color="black", lw=0.8)
    ax.set_yticks([])
    ax.set_xlabel("key position" + (" (globals first)" if G else ""))
    ax.set_ylabel(f"query {args.query}", rotation=0, ha="right", va="center")
    if panels == 1:
        ax.set_title(title(args), fontsize=9)
    handles = [
        Patch(color=COLOURS[c], label=f"{NAMES[c]} ({counts[NAMES[c]]} keys for query {args.query})")
        for c in (LOCAL, SPARSE, GLOBAL)
    ]
    fig.legend(handles=handles, loc="lower center", ncol=3, fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0.05, 1, 1))
    with atomic_files([args.out]) as (f,):  # no half-written picture
        fig.savefig(f, format=os.path.splitext(args.out)[1][1:].lower(), dpi=90)
    print(
        f"wrote {args.out}: query {args.query} attends to " + ", ".join(f"{v} {k}" for k, v in counts.items()) + " keys"
    )


if __name__ == "__main__":
    main()
