"""LSG's sparse sequences (spec/lsg.md section 4, Step A): pure functions, one per sparsity type.

Each compresses the token keys/values of one encoder layer into a sparse sequence of ns = t / sf
entries that the query blocks attend to besides their local window (LSG paper section 3.2;
``ops.blocks.sparse_window_indices`` says which entries each block sees).

Layout: token-major, the q/k/v projections' own layout, so that nothing is transposed or copied
on the way in or out. Glossary (as ``ops.blocks``): n rows, t tokens (a multiple of the block
size bs), h heads, d head dim, sf sparsity factor, ns = t / sf entries, c = min(bs, sbs) the
chunk that norm and lsh select or merge within.

- k, v: (n, t, h, d); mask: (n, t) additive (0 or ``finfo.min``), or None when nothing is padded;
- returns sparse keys and values (n, ns, h, d) and their additive mask (n, 1 | h, ns), or None.

Types (the reference's names; ``sparse_sequence`` dispatches):

- ``norm``: per chunk of c tokens and per head, the c / sf keys of largest norm (padding never wins);
- ``pooling``: the mean of each group of sf tokens over its real tokens; empty groups masked;
- ``stride``: head hh takes tokens p * sf + (hh mod sf);
- ``block_stride``: in every block, head hh takes the run of bs / sf tokens starting at hh * bs / sf (mod bs);
- ``bos_pooling``: each group of sf tokens attention-pooled with the first token's query, per head;
  groups made only of padding are masked (the reference leaks them, spec section 9);
- ``lsh``: keys hashed by random projections into buckets per chunk (rounds of c buckets, then
  c / sf), each bucket the mean of its members; ``generator`` makes the projections reproducible.
"""

import math
from typing import Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor

Sparse = Tuple[Tensor, Tensor, Optional[Tensor]]


def gather_rows(k: Tensor, v: Tensor, mask: Optional[Tensor], idx: Tensor) -> Sparse:
    """Entry p of head hh is token ``idx[., p, hh]``: idx (n | 1, ns, h) token positions.

    Each (token, head) row of d values is copied whole, token-major, for the whole batch in one
    call per tensor. Two forms of the same copies: on a CPU one ``index_select`` on the (n * t * h,
    d) rows of the batch (:func:`_rows_by_index`: whole rows, the fastest copy there); elsewhere
    one ``gather`` along the tokens by the index expanded over d (:func:`_rows_by_gather`: a GPU's
    gather reads such an index once a row), four ops to issue where the row arithmetic takes a
    dozen: at batch 1 a GPU waits on the host's ops (``benchmarks/op_count.py``)."""
    n, t, h, d = k.shape
    ns = idx.size(1)
    sk, sv = (_rows_by_index if k.device.type == "cpu" else _rows_by_gather)(k, v, idx)
    sm = None
    if mask is not None:
        sm = mask.gather(1, (idx.expand(n, ns, h)).reshape(n, ns * h)).view(n, ns, h).transpose(1, 2)  # (n, h, ns)
    return sk, sv, sm


def _rows_by_index(k: Tensor, v: Tensor, idx: Tensor) -> Tuple[Tensor, Tensor]:
    """:func:`gather_rows`' copies as one ``index_select`` per tensor. One call for the whole batch,
    not one per row: a row's own gather would be a view of it, but in backward each view's gradient
    is laid into zeros the size of the whole batch (n^2 in the batch size)."""
    n, t, h, d = k.shape
    ns = idx.size(1)
    rows = idx * h + torch.arange(h, device=idx.device)  # (n|1, ns, h): rows of one (t * h, d) view
    flat = (rows + torch.arange(0, n * t * h, t * h, device=idx.device)[:, None, None]).reshape(n * ns * h)
    sk = k.reshape(n * t * h, d).index_select(0, flat).view(n, ns, h, d)  # reshape: a copy where rows are apart
    sv = v.reshape(n * t * h, d).index_select(0, flat).view(n, ns, h, d)
    return sk, sv


def _rows_by_gather(k: Tensor, v: Tensor, idx: Tensor) -> Tuple[Tensor, Tensor]:
    """:func:`gather_rows`' copies as one ``gather`` per tensor (k and v may be strided views)."""
    n, t, h, d = k.shape
    rows = idx[..., None].expand(n, idx.size(1), h, d)  # (n, ns, h, d), no copy
    return k.gather(1, rows), v.gather(1, rows)


def norm(k: Tensor, v: Tensor, mask: Optional[Tensor], chunk: int, sf: int, order_matters: bool) -> Sparse:
    """Per chunk of ``chunk`` tokens and per head, the chunk / sf keys of largest norm.

    ``order_matters`` (the sparse windows cut through the chunks' selections): entries keep the
    reference's order, ascending norm (its argsort-then-take-last); otherwise only the set counts."""
    n, t, h, d = k.shape
    keep = chunk // sf
    with torch.no_grad():
        norms = k.detach().norm(dim=-1)  # (n, t, h): over contiguous rows of d
        if mask is not None:
            norms = norms.masked_fill(mask[..., None] != 0, 0.0)  # padding never wins
        norms = norms.transpose(1, 2).reshape(n, h, t // chunk, chunk)  # (n, h, t/c, c)
        idx = norms.topk(keep, dim=-1, largest=True, sorted=order_matters).indices  # (n, h, t/c, keep)
        if order_matters:
            idx = idx.flip(-1)
        idx = idx + torch.arange(0, t, chunk, device=k.device)[:, None]  # token positions
        idx = idx.reshape(n, h, -1).transpose(1, 2)  # (n, ns, h)
    return gather_rows(k, v, mask, idx)


def pooling(k: Tensor, v: Tensor, mask: Optional[Tensor], sf: int) -> Sparse:
    """Mean of each group of sf tokens over its real tokens; a group of padding only is masked."""
    n, t, h, d = k.shape
    kg, vg = k.reshape(n, t // sf, sf, h, d), v.reshape(n, t // sf, sf, h, d)
    if mask is None:  # every group full: sum / (sf + 1e-6), as the reference computes it
        return kg.sum(2) / (sf + 1e-6), vg.sum(2) / (sf + 1e-6), None
    valid = (mask == 0).to(k.dtype).view(n, t // sf, sf, 1, 1)
    count = valid.sum(2)  # (n, ns, 1, 1)
    sk = (kg * valid).sum(2) / (count + 1e-6)  # (n, ns, h, d)
    sv = (vg * valid).sum(2) / (count + 1e-6)
    sm = (count.view(n, 1, -1) == 0).to(k.dtype) * torch.finfo(k.dtype).min  # (n, 1, ns)
    return sk, sv, sm


def stride(k: Tensor, v: Tensor, mask: Optional[Tensor], sf: int) -> Sparse:
    """Head hh takes tokens p * sf + (hh mod sf)."""
    n, t, h, d = k.shape
    heads = torch.arange(h, device=k.device) % sf  # (h)
    idx = torch.arange(0, t, sf, device=k.device)[:, None] + heads  # (ns, h)
    return gather_rows(k, v, mask, idx[None])


def block_stride(k: Tensor, v: Tensor, mask: Optional[Tensor], bs: int, sf: int) -> Sparse:
    """In every block, head hh takes the run b * bs + ((r + hh * step) mod bs), r < step = bs / sf."""
    n, t, h, d = k.shape
    step = bs // sf
    r = torch.arange(step, device=k.device)[None, :, None]  # (1, step, 1)
    heads = torch.arange(h, device=k.device)[None, None, :] * step  # (1, 1, h)
    starts = torch.arange(0, t, bs, device=k.device)[:, None, None]  # (nb, 1, 1)
    idx = ((r + heads) % bs + starts).reshape(-1, h)  # (nb*step, h)
    return gather_rows(k, v, mask, idx[None])


def bos_pooling(q0: Tensor, k: Tensor, v: Tensor, mask: Optional[Tensor], sf: int) -> Sparse:
    """Attention-pool each group of sf tokens with ``q0`` (n, h, d), the first token's query."""
    n, t, h, d = k.shape
    kg, vg = k.reshape(n, t // sf, sf, h, d), v.reshape(n, t // sf, sf, h, d)
    scores = torch.einsum("ngshd,nhd->nghs", kg, q0) / math.sqrt(d)  # (n, ns, h, sf)
    if mask is not None:
        mg = mask.view(n, t // sf, 1, sf)
        scores = scores + mg
    w = torch.softmax(scores, dim=-1)
    sk = torch.einsum("nghs,ngshd->nghd", w, kg)  # (n, ns, h, d)
    sv = torch.einsum("nghs,ngshd->nghd", w, vg)
    if mask is None:
        return sk, sv, None
    # Fix of the reference (spec section 9): a group made only of padding is masked. The reference
    # averages the mask, which overflows to -inf in fp32 and unmasks the group.
    empty = (mg != 0).all(dim=-1).view(n, 1, -1)  # (n, 1, ns)
    return sk, sv, empty.to(k.dtype) * torch.finfo(k.dtype).min


def lsh(
    q0: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Optional[Tensor],
    chunk: int,
    sf: int,
    pre_rounds: int,
    sparse_block_size: int,
    generator: Optional[torch.Generator] = None,
) -> Sparse:
    """Hashed centroids: ``pre_rounds`` rounds of ``chunk`` buckets per chunk, then chunk / sf.

    ``mask`` is required (empty buckets are masked). With sf == sparse_block_size this is
    ``bos_pooling`` (the reference's delegation)."""
    if sf == sparse_block_size:
        return bos_pooling(q0, k, v, mask, sf)
    if mask is None:  # (sparse_sequence refuses it first, naming the setting)
        raise ValueError("lsh needs a key mask (zeros when nothing is padded): it can leave buckets empty")
    n, t, h, d = k.shape
    # head-major inside (the projections are drawn per head, as the reference draws them)
    kh, vh = k.permute(0, 2, 1, 3), v.permute(0, 2, 1, 3)  # (n, h, t, d) views
    valid = (mask == 0).to(k.dtype).view(n, 1, t // chunk, chunk, 1)
    kc = kh.reshape(n, h, t // chunk, chunk, d) * valid  # (n, h, t/c, c, d)
    vc = vh.reshape(n, h, t // chunk, chunk, d) * valid
    weight = valid.expand(n, h, t // chunk, chunk, 1)  # tokens merged into each bucket
    for _ in range(pre_rounds):
        kc, vc, weight = _lsh_round(kc, vc, weight, chunk, generator)
    kc, vc, weight = _lsh_round(kc, vc, weight, chunk // sf, generator)
    sk = (kc / (weight + 1e-8)).reshape(n, h, -1, d).transpose(1, 2).contiguous()  # (n, ns, h, d)
    sv = (vc / (weight + 1e-8)).reshape(n, h, -1, d).transpose(1, 2).contiguous()
    sm = (weight.reshape(n, h, -1) == 0).to(k.dtype) * torch.finfo(k.dtype).min  # (n, h, ns)
    return sk, sv, sm


def _lsh_round(k: Tensor, v: Tensor, weight: Tensor, buckets: int, generator: Optional[torch.Generator]):
    """Hash each key direction into ``buckets`` bins per chunk (random projections, argmax over
    [xR, -xR]) and sum keys, values and weights per bin. k, v (n, h, nc, c, d); weight (.., 1)."""
    n, h, nc, c, d = k.shape
    with torch.no_grad():
        n_hashes = buckets // 2
        proj = torch.randn(
            1,
            h,
            1,
            d,
            n_hashes,
            generator=generator,
            device=k.device if generator is None else generator.device,
            dtype=k.dtype,
        ).to(k.device)
        codes = (F.normalize(k, dim=-1) * weight.clamp(0, 1)) @ proj  # (n, h, nc, c, hashes)
        if n_hashes == 0:  # one bucket: everything merges (the reference would crash)
            bucket = torch.zeros(n, h, nc, c, 1, dtype=torch.long, device=k.device)
        else:
            bucket = torch.cat([codes, -codes], dim=-1).argmax(dim=-1, keepdim=True)  # (.., c, 1)
    zeros = k.new_zeros(n, h, nc, buckets, d)
    k = zeros.scatter_add(3, bucket.expand(n, h, nc, c, d), k)
    v = zeros.scatter_add(3, bucket.expand(n, h, nc, c, d), v)
    weight = weight.new_zeros(n, h, nc, buckets, 1).scatter_add(3, bucket, weight)
    return k, v, weight


def sparse_sequence(
    sparsity_type: str,
    q0: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Optional[Tensor],
    *,
    block_size: int,
    sparse_block_size: int,
    sparsity_factor: int,
    lsh_num_pre_rounds: int = 1,
    generator: Optional[torch.Generator] = None,
) -> Sparse:
    """The sparse sequence of type ``sparsity_type`` (module doc); with sf = 1 the tokens themselves.

    ``lsh`` always needs a mask (pass zeros when nothing is padded): it can leave buckets empty."""
    sf = sparsity_factor
    if sf == 1:
        return k, v, None if mask is None else mask[:, None, :]
    chunk = min(block_size, sparse_block_size)
    if sparsity_type == "lsh" and mask is None:
        raise ValueError("lsh needs a key mask (zeros when nothing is padded): it can leave buckets empty")
    # the type was checked where the settings arrived (lsg_config.check_lsg_config)
    return {
        # norm: do the sparse windows cut through the chunks' c/sf selected tokens?
        "norm": lambda: norm(k, v, mask, chunk, sf, order_matters=sparse_block_size % max(chunk // sf, 1) != 0),
        "pooling": lambda: pooling(k, v, mask, sf),
        "stride": lambda: stride(k, v, mask, sf),
        "block_stride": lambda: block_stride(k, v, mask, block_size, sf),
        "bos_pooling": lambda: bos_pooling(q0, k, v, mask, sf),
        "lsh": lambda: lsh(q0, k, v, mask, chunk, sf, lsh_num_pre_rounds, sparse_block_size, generator),
    }[sparsity_type]()
