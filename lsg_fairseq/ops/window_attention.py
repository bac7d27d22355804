"""Attention of query blocks over a few strided key windows, merged by log-sum-exp (CPU fast path).

Block-sparse encoder attentions (LSG, Longformer/LED) give every block of queries the same *kind*
of key set: a few runs of consecutive keys whose start moves by a fixed stride from one block to
the next (LSG: the 3 local blocks, the sparse run before and the one after, the global tokens;
LED: the band of neighbouring blocks and the global tokens). Each run is a strided **view** of one
token-major source, so nothing is gathered: block b of window ``W`` sees

    keys[W.start + b * W.stride : W.start + b * W.stride + W.length]

(``stride`` 0: every block sees the same keys, e.g. the global tokens).

Each window runs PyTorch's fused CPU flash kernel
(``aten._scaled_dot_product_flash_attention_for_cpu``) straight on the view; it returns the
window's output o_w and log-sum-exp l_w per query, and the windows are merged exactly:

    O = sum_w exp(l_w - L) o_w,   L = logsumexp_w l_w

which is softmax over the union of the windows' keys (masked keys, additive ``finfo.min``, get
exactly zero weight; a fully masked window has l_w = finfo.min and weight 0).

Backward (``WindowAttention``) keeps only what it was given (queries, the window sources, their
masks), the merged output O and the l_w: no per-block copy of anything. For window w it calls
the fused backward with ``grad_out = exp(l_w - L) dO`` and ``out = O``: the kernel's row term
``D = rowsum(grad_out * out)`` is then exactly the joint softmax's, so the window's score
gradient ``P_w (dO V_w^T - rowsum(dO O))`` is the joint one restricted to its keys. The key and
value gradients of overlapping views are added back into their sources by shifted slices.

Glossary: n rows, B query blocks per row, M queries per block, h heads, d head dim; a source is
(N, h, d) token-major (the layout of the q/k/v projections); masks are (hm, N) additive with
hm 1 (every head) or h. The private aten ops have been stable since torch 2.2 (this project pins
torch 2.13); there is no dropout (the callers fall back to their gathered-SDPA path then).
"""
from typing import List, NamedTuple, Optional, Sequence

import torch
from torch import Tensor

_flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default
_flash_backward = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward.default


class Window(NamedTuple):
    """One run of keys per query block: source index ``start + b * stride + [0, length)``.

    ``allowed`` (size, length) bool, optional: which (query in block, key in window) pairs may
    attend, the same for every block (e.g. the edges of a sliding-window band); combined with
    the source's key mask.
    """

    source: int  # which (keys, values, mask) source of the call
    start: int
    stride: int
    length: int
    allowed: Optional[Tensor] = None


class QueryGroup(NamedTuple):
    """Queries ``[start, start + blocks * size)`` of every row, cut into blocks of ``size``."""

    start: int
    blocks: int
    size: int
    windows: Sequence[Window]


def supported(x: Tensor, dropout: float) -> bool:
    """Whether the fused path can run: CPU tensors, no attention dropout."""
    return x.device.type == "cpu" and dropout == 0.0


def _kv_view(src: Tensor, w: Window, blocks: int) -> Tensor:
    """(N, h, d) token-major source -> (blocks, h, length, d) overlapping view, no copy."""
    _, h, d = src.shape
    assert w.start + (blocks - 1) * w.stride + w.length <= src.size(0), "window out of range"
    return src.as_strided((blocks, h, w.length, d), (w.stride * h * d, d, h * d, 1),
                          src.storage_offset() + w.start * h * d)


def _mask_view(mask: Optional[Tensor], w: Window, g: QueryGroup, dtype) -> Optional[Tensor]:
    """(hm, N) additive source mask -> (blocks, hm, size, length), broadcast over queries.

    With ``w.allowed`` the pairs it forbids are masked too (a new tensor of that shape)."""
    if mask is None:
        if w.allowed is None:
            return None
        mask = torch.zeros(1, w.start + (g.blocks - 1) * w.stride + w.length, dtype=dtype,
                           device=w.allowed.device)
    hm, N = mask.shape
    view = mask.as_strided((g.blocks, hm, g.size, w.length), (w.stride, N, 0, 1),
                           mask.storage_offset() + w.start)
    if w.allowed is None:
        return view
    return view.masked_fill(~w.allowed, torch.finfo(mask.dtype).min)


def _fold_into(dst: Tensor, grad: Tensor, w: Window) -> None:
    """Add a (blocks, h, length, d) window gradient back onto its (N, h, d) source ``dst``."""
    B, h, length, d = grad.shape
    g = grad.transpose(1, 2)  # (B, length, h, d)
    if w.stride == 0:
        dst[w.start:w.start + length] += g.sum(0)
    elif length % w.stride == 0:
        # the window is length/stride chunks of one stride; chunk c of block b is source
        # chunk b + c: one shifted slice add per chunk
        s = w.stride
        for c in range(length // s):
            lo = w.start + c * s
            dst[lo:lo + B * s].view(B, s, h, d).add_(g[:, c * s:(c + 1) * s])
    else:
        index = (w.start + torch.arange(B, device=grad.device)[:, None] * w.stride
                 + torch.arange(length, device=grad.device)[None, :]).reshape(-1)
        dst.index_add_(0, index, g.reshape(B * length, h, d))


def _row_forward(q: Tensor, srcs, groups: Sequence[QueryGroup], out: Tensor, scale: float):
    """One row: q, out (S, h, d); srcs [(keys, values, mask)]. Returns every window's lse."""
    lses = []
    for g in groups:
        qv = q[g.start:g.start + g.blocks * g.size].view(g.blocks, g.size, *q.shape[1:]).transpose(1, 2)
        outs, ls = [], []
        for w in g.windows:
            k, v, m = srcs[w.source]
            o, lse = _flash(qv, _kv_view(k, w, g.blocks), _kv_view(v, w, g.blocks),
                            attn_mask=_mask_view(m, w, g, q.dtype), scale=scale)  # (B, h, M, d), (B, h, M)
            outs.append(o)
            ls.append(lse)
        ls = torch.stack(ls)  # (windows, B, h, M), fp32 for every dtype
        weights = (ls - torch.logsumexp(ls, dim=0)).exp_()[..., None]  # (windows, B, h, M, 1)
        # merged straight into ``out`` (same token-major layout as the kernel's outputs)
        dst = out[g.start:g.start + g.blocks * g.size].view(g.blocks, g.size, *q.shape[1:]).transpose(1, 2)
        if out.dtype == weights.dtype:
            torch.mul(outs[0], weights[0], out=dst)
            for o, w in zip(outs[1:], weights[1:]):
                dst.addcmul_(o, w)
        else:  # low precision: accumulate in fp32
            dst.copy_(sum(o * w for o, w in zip(outs, weights)))
        lses.append(ls)
    return lses


class WindowAttention(torch.autograd.Function):
    """``window_attention`` with a backward that keeps no per-block copy (see module doc)."""

    @staticmethod
    def forward(ctx, groups, scale, q, *flat):
        srcs = [tuple(flat[i:i + 3]) for i in range(0, len(flat), 3)]  # per source (k, v, mask)
        n = q.size(0)
        out = torch.empty_like(q, memory_format=torch.contiguous_format)  # (n, S, h, d)
        lses = [_row_forward(q[r], [(k[r], v[r], None if m is None else m[r]) for k, v, m in srcs],
                             groups, out[r], scale) for r in range(n)]
        ctx.groups, ctx.scale, ctx.n_src = groups, scale, len(srcs)
        ctx.has_mask = [m is not None for _, _, m in srcs]
        ctx.save_for_backward(q, out, *[t for s in srcs for t in s[:2]],
                              *[m for _, _, m in srcs if m is not None],
                              *[lse for row in lses for lse in row])
        ctx.set_materialize_grads(True)
        return out

    @staticmethod
    def backward(ctx, grad_out):
        saved = list(ctx.saved_tensors)
        q, out = saved[:2]
        kv = saved[2:2 + 2 * ctx.n_src]
        n_masks = sum(ctx.has_mask)
        masks_it = iter(saved[2 + 2 * ctx.n_src:2 + 2 * ctx.n_src + n_masks])
        masks = [next(masks_it) if has else None for has in ctx.has_mask]
        lse_it = iter(saved[2 + 2 * ctx.n_src + n_masks:])
        groups, scale = ctx.groups, ctx.scale
        n = q.size(0)
        grad_q = torch.zeros_like(q)
        grad_kv = [torch.zeros_like(t) for t in kv]
        for r in range(n):
            for g in groups:
                lses = next(lse_it)  # (windows, B, h, M)
                weights = (lses - torch.logsumexp(lses, dim=0)).exp()
                sl = slice(g.start, g.start + g.blocks * g.size)
                qv = q[r, sl].view(g.blocks, g.size, *q.shape[2:]).transpose(1, 2)
                ov = out[r, sl].view(g.blocks, g.size, *q.shape[2:]).transpose(1, 2)
                dov = grad_out[r, sl].view(g.blocks, g.size, *q.shape[2:]).transpose(1, 2)
                gq = grad_q[r, sl].view(g.blocks, g.size, *q.shape[2:]).transpose(1, 2)
                for i, w in enumerate(g.windows):
                    k, v, m = kv[2 * w.source][r], kv[2 * w.source + 1][r], masks[w.source]
                    # the kernel returns one key/value gradient per block and window row: in
                    # chunks of blocks, so that this transient stays within the source's size
                    step = max(1, min(g.blocks, k.size(0) // max(1, w.length)))
                    for b0 in range(0, g.blocks, step):
                        b1 = min(g.blocks, b0 + step)
                        wc, gc = w._replace(start=w.start + b0 * w.stride), g._replace(blocks=b1 - b0)
                        dq, dk, dv = _flash_backward(
                            (weights[i, b0:b1, ..., None] * dov[b0:b1]).to(q.dtype), qv[b0:b1],
                            _kv_view(k, wc, b1 - b0), _kv_view(v, wc, b1 - b0), ov[b0:b1], lses[i, b0:b1],
                            0.0, False, attn_mask=_mask_view(None if m is None else m[r], wc, gc, q.dtype),
                            scale=scale)
                        gq[b0:b1].add_(dq)
                        _fold_into(grad_kv[2 * w.source][r], dk, wc)
                        _fold_into(grad_kv[2 * w.source + 1][r], dv, wc)
        grads = []
        for s in range(ctx.n_src):
            grads += [grad_kv[2 * s], grad_kv[2 * s + 1], None]
        return (None, None, grad_q, *grads)


def window_attention(q: Tensor, sources: List[tuple], groups: Sequence[QueryGroup],
                     scale: Optional[float] = None) -> Tensor:
    """Attention of query blocks over strided key windows, merged exactly (see module doc).

    q (n, S, h, d) token-major; ``sources`` [(keys (n, N, h, d), values (n, N, h, d),
    mask (n, hm, N) additive or None)], each contiguous; ``groups`` say which queries attend to
    which windows of which source. Returns (n, S, h, d); rows of q in no group are undefined.
    """
    scale = q.size(-1) ** -0.5 if scale is None else scale
    flat = []
    for k, v, m in sources:
        flat += [k.contiguous(), v.contiguous(), None if m is None else m.contiguous()]
    return WindowAttention.apply(tuple(groups), scale, q.contiguous(), *flat)
