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

Without autograd (inference) the windows of a chunk of blocks are instead copied side by side
into one small key/value buffer and attended in **one** kernel call (``_gathered_forward``):
fewer calls, one output instead of one per window, no merge. The buffer is a few MiB, reused
chunk after chunk, so the copy stays in cache; nothing per block is kept. Windows that need no
mask and windows that do go into two separate calls (the kernel adds a mask to every score of a
call, a sizeable part of its time), merged as above; a window much longer than all the others of
its call together runs on its own view instead of being copied (``_OWN_VIEW_RATIO``). The figures
behind these choices are in benchmarks/README.md ("Figures behind the constants").

Masks cost time even where they mask nothing, so :func:`split_unmasked` cuts a group into runs of
blocks by which of their windows cover a masked key, trims off window ends that are masked in
every row (padding around the sequence: zero weight anyway), and elsewhere sets
``Window.masked`` False: the kernel then gets no mask (an unpadded input gets none at all).

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

import math
from typing import Dict, List, NamedTuple, Optional, Sequence, Tuple

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
    masked: bool = True  # False: the source's key mask is 0 on every key of this window (not applied)


class QueryGroup(NamedTuple):
    """Queries ``[start, start + blocks * size)`` of every row, cut into blocks of ``size``."""

    start: int
    blocks: int
    size: int
    windows: Sequence[Window]


def supported(x: Tensor, dropout: float) -> bool:
    """Whether the fused path can run: CPU tensors, no attention dropout."""
    return x.device.type == "cpu" and dropout == 0.0


def split_unmasked(groups: Sequence[QueryGroup], masks: Sequence[Optional[Tensor]]) -> List[QueryGroup]:
    """The same attention with as few masked kernel calls as possible (pure index arithmetic).

    ``masks[i]``: source i's additive mask (n, hm, N), or None. For every window and block:

    - keys at the window's ends that are masked in every row and head (the padding around a
      sequence) are cut off: they get exactly zero weight, so the result is the same;
    - what remains gets ``masked=False`` when no row masks any of its keys.

    Blocks are cut into runs that do all this alike; in an unpadded input that is one run of
    interior blocks without any mask and a few edge runs of one block each. A run whose windows
    would all be cut away entirely is left as it was (its queries keep their masked keys).
    """
    # per source: (any masked (N,), masked keys ahead of p, masked keys up to p) or None
    marks: List[Optional[Tuple[Tensor, Tensor, Tensor]]] = []
    for m in masks:
        if m is None:
            marks.append(None)
            continue
        flat = (m != 0).reshape(-1, m.size(-1))  # (n*hm, N)
        some, every = flat.any(0), flat.all(0)
        pos = torch.arange(every.numel(), device=every.device)
        # lead[p]: length of the run of keys masked everywhere that starts at p; trail[p]: ending at p
        nxt = torch.where(every, every.numel(), pos).flip(0).cummin(0).values.flip(0)
        prv = torch.where(every, -1, pos).cummax(0).values
        count = torch.nn.functional.pad(some.to(torch.int64).cumsum(0), (1, 0))  # prefix counts
        marks.append((count.cpu(), (nxt - pos).cpu(), (pos - prv).cpu()))
    out = []
    for g in groups:
        plans = []  # per window: (blocks, 3) int64 [cut ahead, cut behind, any masked key left]
        for w in g.windows:
            mark = marks[w.source]
            if mark is None or not w.masked:
                plans.append(torch.zeros(g.blocks, 3, dtype=torch.int64))
                continue
            count, lead, trail = mark
            first = w.start + torch.arange(g.blocks) * w.stride  # (blocks)
            ahead = lead[first].clamp(max=w.length)
            behind = torch.minimum(trail[first + w.length - 1], w.length - ahead)
            left = count[first + w.length - behind] - count[first + ahead]
            plans.append(torch.stack([ahead, behind, (left > 0).to(torch.int64)], 1))
        plan = torch.stack(plans, 1)  # (blocks, windows, 3)
        change = (plan[1:] != plan[:-1]).flatten(1).any(1).nonzero().flatten().add(1).tolist()
        for b0, b1 in zip([0] + change, change + [g.blocks]):
            windows = []
            for w, (ahead, behind, left) in zip(g.windows, plan[b0].tolist()):
                if ahead + behind == w.length:
                    continue  # every key of this window is masked everywhere: no weight, dropped
                allowed = None if w.allowed is None else w.allowed[:, ahead : w.length - behind]
                windows.append(
                    w._replace(
                        start=w.start + b0 * w.stride + ahead,
                        length=w.length - ahead - behind,
                        allowed=allowed,
                        masked=w.masked and bool(left),
                    )
                )
            if not windows:  # nothing would be left to attend to: keep the masked windows
                windows = [w._replace(start=w.start + b0 * w.stride) for w in g.windows]
            out.append(QueryGroup(g.start + b0 * g.size, b1 - b0, g.size, windows))
    return out


def _kv_view(src: Tensor, w: Window, blocks: int) -> Tensor:
    """(N, h, d) token-major source -> (blocks, h, length, d) overlapping view, no copy."""
    _, h, d = src.shape
    assert w.start + (blocks - 1) * w.stride + w.length <= src.size(0), "window out of range"
    return src.as_strided(
        (blocks, h, w.length, d), (w.stride * h * d, d, h * d, 1), src.storage_offset() + w.start * h * d
    )


def _mask_view(mask: Optional[Tensor], w: Window, g: QueryGroup, dtype) -> Optional[Tensor]:
    """(hm, N) additive source mask -> (blocks, hm, size, length), broadcast over queries.

    With ``w.allowed`` the pairs it forbids are masked too (a new tensor of that shape); a window
    with ``masked=False`` ignores ``mask``."""
    if not w.masked:
        mask = None
    if mask is None:
        if w.allowed is None:
            return None
        mask = torch.zeros(1, w.start + (g.blocks - 1) * w.stride + w.length, dtype=dtype, device=w.allowed.device)
    hm, N = mask.shape
    view = mask.as_strided((g.blocks, hm, g.size, w.length), (w.stride, N, 0, 1), mask.storage_offset() + w.start)
    if w.allowed is None:
        return view
    return view.masked_fill(~w.allowed, torch.finfo(mask.dtype).min)


def _fold_into(dst: Tensor, grad: Tensor, w: Window) -> None:
    """Add a (blocks, h, length, d) window gradient back onto its (N, h, d) source ``dst``."""
    B, h, length, d = grad.shape
    g = grad.transpose(1, 2)  # (B, length, h, d)
    if w.stride == 0:
        dst[w.start : w.start + length] += g.sum(0)
    elif length % w.stride == 0:
        # the window is length/stride chunks of one stride; chunk c of block b is source
        # chunk b + c: one shifted slice add per chunk
        s = w.stride
        for c in range(length // s):
            lo = w.start + c * s
            dst[lo : lo + B * s].view(B, s, h, d).add_(g[:, c * s : (c + 1) * s])
    else:
        index = (
            w.start
            + torch.arange(B, device=grad.device)[:, None] * w.stride
            + torch.arange(length, device=grad.device)[None, :]
        ).reshape(-1)
        dst.index_add_(0, index, g.reshape(B * length, h, d))


def _row_forward(q: Tensor, srcs, groups: Sequence[QueryGroup], out: Tensor, scale: float):
    """One row: q, out (S, h, d); srcs [(keys, values, mask)]. Returns every window's lse."""
    lses = []
    for g in groups:
        qv = q[g.start : g.start + g.blocks * g.size].view(g.blocks, g.size, *q.shape[1:]).transpose(1, 2)
        outs, ls = [], []
        for w in g.windows:
            k, v, m = srcs[w.source]
            o, lse = _flash(
                qv,
                _kv_view(k, w, g.blocks),
                _kv_view(v, w, g.blocks),
                attn_mask=_mask_view(m, w, g, q.dtype),
                scale=scale,
            )  # (B, h, M, d), (B, h, M)
            outs.append(o)
            ls.append(lse)
        dst = out[g.start : g.start + g.blocks * g.size].view(g.blocks, g.size, *q.shape[1:]).transpose(1, 2)
        lses.append(_merge(outs, ls, dst))
    return lses


def _merge(outs: List[Tensor], lses: List[Tensor], dst: Tensor) -> Tensor:
    """dst = sum_w exp(l_w - L) o_w (the joint softmax's output); returns the stacked l_w.

    outs: (B, h, M, d) per window, lses: (B, h, M) per window (fp32 for every dtype); dst (B, h,
    M, d) may be a view of the token-major output (the kernel's own output layout)."""
    ls = torch.stack(lses)  # (windows, B, h, M)
    if len(outs) == 1:
        dst.copy_(outs[0])
        return ls
    weights = (ls - torch.logsumexp(ls, dim=0)).exp_()[..., None]  # (windows, B, h, M, 1)
    if dst.dtype == weights.dtype:
        torch.mul(outs[0], weights[0], out=dst)
        for o, w in zip(outs[1:], weights[1:]):
            dst.addcmul_(o, w)
    else:  # low precision: accumulate in fp32
        dst.copy_(sum(o * w for o, w in zip(outs, weights)))
    return ls


# Floats per key (and per value) buffer of the gathered forward: small enough that the copies stay
# in the last-level cache; at least one block is gathered at a time whatever its size.
_GATHER_ELEMS = 1 << 21
# In the gathered forward, a window longer than this many times all the others of its call together
# runs on its own view: copying it would cost more than the kernel call it saves.
_OWN_VIEW_RATIO = 4


def _parts(g: QueryGroup, srcs) -> List[List[Window]]:
    """The kernel calls of one group in the gathered forward: windows that need no mask, then those
    that do (each list may be empty; a window needs a mask if it has ``allowed`` or applies its
    source's mask). In each call, a window more than ``_OWN_VIEW_RATIO`` times as long as all the
    others together runs on its own view (LED's band beside one global key); LSG's local window
    beside its sparse runs and global keys is copied."""

    def needs_mask(w):
        return w.allowed is not None or (w.masked and srcs[w.source][2] is not None)

    calls = []
    for part in ([w for w in g.windows if not needs_mask(w)], [w for w in g.windows if needs_mask(w)]):
        if len(part) > 1:
            longest = max(part, key=lambda w: w.length)
            if longest.length > _OWN_VIEW_RATIO * (sum(w.length for w in part) - longest.length):
                calls.append([longest])
                part = [w for w in part if w is not longest]
        if part:
            calls.append(part)
    return calls


def _gathered_call(
    q: Tensor, srcs, g: QueryGroup, windows: List[Window], b0: int, blocks: int, scale: float, buffers: dict
):
    """One kernel call for blocks ``b0 .. b0 + blocks`` of ``g`` over ``windows`` (of one row).

    A single window is attended on its strided view; several are copied side by side into the
    reused ``buffers``. Returns the kernel's (output (blocks, h, M, d), lse (blocks, h, M))."""
    _, h, d = q.shape
    qv = q[g.start + b0 * g.size : g.start + (b0 + blocks) * g.size].view(blocks, g.size, h, d).transpose(1, 2)
    shifted = [w._replace(start=w.start + b0 * w.stride) for w in windows]
    part = g._replace(blocks=blocks)
    if len(windows) == 1:
        k, v, m = srcs[windows[0].source]
        w = shifted[0]
        return _flash(
            qv, _kv_view(k, w, blocks), _kv_view(v, w, blocks), attn_mask=_mask_view(m, w, part, q.dtype), scale=scale
        )
    kn = sum(w.length for w in windows)
    keys = _buffer(buffers, "k", (blocks, kn, h, d), q)
    values = _buffer(buffers, "v", (blocks, kn, h, d), q)
    masks = [_mask_view(srcs[w.source][2], w, part, q.dtype) for w in shifted]
    mask = None
    if any(m is not None for m in masks):
        hm = max(m.size(1) for m in masks if m is not None)
        rows = g.size if any(w.allowed is not None for w in windows) else 1  # per query, or broadcast
        mask = _buffer(buffers, "m", (blocks, hm, rows, kn), q)
    off = 0
    for w, wm in zip(shifted, masks):
        k, v, _ = srcs[w.source]
        sl = slice(off, off + w.length)
        keys[:, sl] = _kv_view(k, w, blocks).transpose(1, 2)  # (blocks, length, h, d)
        values[:, sl] = _kv_view(v, w, blocks).transpose(1, 2)
        if mask is not None:
            if wm is None:
                mask[..., sl] = 0
            else:
                mask[..., sl] = wm[:, :, : mask.size(2)]
        off += w.length
    if mask is not None:
        mask = mask.expand(blocks, mask.size(1), g.size, kn)
    return _flash(qv, keys.transpose(1, 2), values.transpose(1, 2), attn_mask=mask, scale=scale)


def _buffer(buffers: dict, name: str, shape, like: Tensor) -> Tensor:
    """A (shape) view of a reused flat buffer of ``like``'s dtype/device, grown on demand."""
    numel = math.prod(shape)
    buf = buffers.get(name)
    if buf is None or buf.numel() < numel:
        buf = buffers[name] = like.new_empty(numel)
    return buf[:numel].view(shape)


def _gathered_forward(q: Tensor, srcs, groups: Sequence[QueryGroup], scale: float, inplace: bool = False) -> Tensor:
    """The forward without autograd: per group and chunk of blocks, one kernel call per
    :func:`_parts` entry, merged by log-sum-exp (see module doc). With ``inplace`` the output
    is written over ``q``: a chunk's query rows are read before its output rows are written."""
    n, S, h, d = q.shape
    out = q if inplace else torch.empty_like(q, memory_format=torch.contiguous_format)  # (n, S, h, d)
    buffers: Dict[str, Tensor] = {}
    for r in range(n):
        row = [(k[r], v[r], None if m is None else m[r]) for k, v, m in srcs]
        for g in groups:
            calls = _parts(g, row)
            widest = max(sum(w.length for w in c) for c in calls if len(c) > 1) if any(len(c) > 1 for c in calls) else 0
            chunk = g.blocks if not widest else max(1, min(g.blocks, _GATHER_ELEMS // (widest * h * d)))
            for b0 in range(0, g.blocks, chunk):
                blocks = min(chunk, g.blocks - b0)
                res = [_gathered_call(q[r], row, g, c, b0, blocks, scale, buffers) for c in calls]
                rows = out[r, g.start + b0 * g.size : g.start + (b0 + blocks) * g.size]
                _merge([o for o, _ in res], [lse for _, lse in res], rows.view(blocks, g.size, h, d).transpose(1, 2))
    return out


class WindowAttention(torch.autograd.Function):
    """``window_attention`` with a backward that keeps no per-block copy (see module doc)."""

    @staticmethod
    def forward(ctx, groups, scale, q, *flat):
        srcs = [tuple(flat[i : i + 3]) for i in range(0, len(flat), 3)]  # per source (k, v, mask)
        n = q.size(0)
        out = torch.empty_like(q, memory_format=torch.contiguous_format)  # (n, S, h, d)
        lses = [
            _row_forward(q[r], [(k[r], v[r], None if m is None else m[r]) for k, v, m in srcs], groups, out[r], scale)
            for r in range(n)
        ]
        ctx.groups, ctx.scale, ctx.n_src = groups, scale, len(srcs)
        ctx.has_mask = [m is not None for _, _, m in srcs]
        ctx.save_for_backward(
            q,
            out,
            *[t for s in srcs for t in s[:2]],
            *[m for _, _, m in srcs if m is not None],
            *[lse for row in lses for lse in row],
        )
        ctx.set_materialize_grads(True)
        return out

    @staticmethod
    def backward(ctx, grad_out):
        saved = list(ctx.saved_tensors)
        q, out = saved[:2]
        kv = saved[2 : 2 + 2 * ctx.n_src]
        n_masks = sum(ctx.has_mask)
        masks_it = iter(saved[2 + 2 * ctx.n_src : 2 + 2 * ctx.n_src + n_masks])
        masks = [next(masks_it) if has else None for has in ctx.has_mask]
        lse_it = iter(saved[2 + 2 * ctx.n_src + n_masks :])
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
                            (weights[i, b0:b1, ..., None] * dov[b0:b1]).to(q.dtype),
                            qv[b0:b1],
                            _kv_view(k, wc, b1 - b0),
                            _kv_view(v, wc, b1 - b0),
                            ov[b0:b1],
                            lses[i, b0:b1],
                            0.0,
                            False,
                            attn_mask=_mask_view(None if m is None else m[r], wc, gc, q.dtype),
                            scale=scale,
                        )
                        gq[b0:b1].add_(dq)
                        _fold_into(grad_kv[2 * w.source][r], dk, wc)
                        _fold_into(grad_kv[2 * w.source + 1][r], dv, wc)
        grads = []
        for s in range(ctx.n_src):
            grads += [grad_kv[2 * s], grad_kv[2 * s + 1], None]
        return (None, None, grad_q, *grads)


def window_attention(
    q: Tensor, sources: List[tuple], groups: Sequence[QueryGroup], scale: Optional[float] = None, inplace: bool = False
) -> Tensor:
    """Attention of query blocks over strided key windows, merged exactly (see module doc).

    q (n, S, h, d) token-major; ``sources`` [(keys (n, N, h, d), values (n, N, h, d),
    mask (n, hm, N) additive or None)], each contiguous; ``groups`` say which queries attend to
    which windows of which source. Returns (n, S, h, d); rows of q in no group are undefined.
    ``inplace``: without autograd, the result is written over a contiguous ``q`` (which the caller
    no longer needs and which is no source): one (n, S, h, d) buffer less on long inputs, where
    each fresh buffer is also paid in page faults.
    """
    scale = q.size(-1) ** -0.5 if scale is None else scale
    flat = []
    for k, v, m in sources:
        flat += [k.contiguous(), v.contiguous(), None if m is None else m.contiguous()]
    if not (torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in [q] + flat)):
        srcs = [tuple(flat[i : i + 3]) for i in range(0, len(flat), 3)]
        return _gathered_forward(q.contiguous(), srcs, groups, scale, inplace=inplace and q.is_contiguous())
    return WindowAttention.apply(tuple(groups), scale, q.contiguous(), *flat)
