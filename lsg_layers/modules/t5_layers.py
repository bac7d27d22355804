"""T5 v1.1 building blocks used by LOCOST (spec ``shared/spec/locost.md`` sections 2-3), pure torch.

- :class:`T5LayerNorm`: RMSNorm ``x * rsqrt(mean(x^2) + eps) * w`` (no mean, no bias), in float32.
- :class:`T5DenseGatedGelu`: ``wo(gelu_new(wi_0 h) * wi_1 h)``, no biases.
- :class:`T5Attention`: multi-head attention without the 1/sqrt(d_kv) score scaling, softmax in
  float32 (in eval mode one SDPA call: ``T5Attention.fused``), optional T5 relative position bias
  (bucketed), and fairseq-style incremental decoding.

float16 (``--fp16``, or ``--amp``'s autocast; :mod:`lsg_layers.modules.precision`): as in HF's
T5, ``wo`` runs in float32 and returns float32, so the residual stream it is added to becomes
float32 (the next RMSNorm hands half-precision inputs to the next sublayer again), and the blocks
clamp float16 hidden states; unlike HF's, attention scores are also formed in float32 (without
score scaling, ``q k^T`` of a trained model can pass 65504).

Attribute names mirror HF T5 (``q, k, v, o``, ``relative_attention_bias``, ``wi_0, wi_1, wo``) so
that checkpoints map by name. Incremental decoding follows fairseq's protocol without importing
fairseq: state lives in the caller's ``incremental_state`` dict under a per-module key, and
``reorder_incremental_state(incremental_state, new_order)`` is found by
``FairseqIncrementalDecoder.reorder_incremental_state_scripting`` through ``self.modules()``.
"""

import math
import uuid
from typing import Any, Dict, Optional

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from lsg_layers.modules.lean_ffn import dropout_with_mask, masked_scale
from lsg_layers.modules.precision import autocast_on, float32_region, fp16_in_play

# module key -> its cache: tensors, and the beam of a cross-attention cache (an int)
IncrementalState = Dict[str, Dict[str, Any]]

# T5 v1.1's settings as the LOCOST reference's config.json holds them (spec locost.md section 5),
# keyed by the locost_* flags' names: the one home of these defaults, read by the layers' keyword
# defaults here and in ``locost_blocks``, the ``locost_*`` archs and the converter's config table.
T5_DEFAULTS: Dict[str, Any] = dict(
    layer_norm_eps=1e-6, relative_attention_num_buckets=32, relative_attention_max_distance=128, dropout=0.1
)


class T5LayerNorm(nn.Module):
    """RMSNorm (T5LayerNorm): statistics in float32, output in the weight's dtype if half.

    On CUDA, where x and the weight share a dtype, one fused kernel each way (``F.rms_norm``; torch
    registers CUDA kernels for its forward and backward) does what HF's chain of element-wise passes does
    (:meth:`reference`): float32 statistics, and the product with the weight rounded once where HF
    rounds x * rsqrt(...) to the half dtype first, so half-precision outputs may differ from HF's in
    the last bit (float32: rounding only). tests/test_locost.py bounds both on CPU; the GPU check's
    conformance stage measures them on the card.
    """

    def __init__(self, d_model: int, eps: float = T5_DEFAULTS["layer_norm_eps"]):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d_model))
        self.variance_epsilon = eps

    def fused(self, x: torch.Tensor) -> bool:
        """Whether ``forward`` takes the fused kernel for ``x``."""
        return x.is_cuda and x.dtype == self.weight.dtype

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.fused(x):
            return F.rms_norm(x, (x.size(-1),), self.weight, self.variance_epsilon)
        return self.reference(x)

    def reference(self, x: torch.Tensor) -> torch.Tensor:
        """HF's T5LayerNorm, operation for operation."""
        variance = x.float().pow(2).mean(-1, keepdim=True)  # (... 1)
        x = x * torch.rsqrt(variance + self.variance_epsilon)  # promoted to float32
        if self.weight.dtype in (torch.float16, torch.bfloat16):
            x = x.to(self.weight.dtype)
        return self.weight * x


def gelu_new(x: torch.Tensor) -> torch.Tensor:
    """tanh-approximated GELU (HF ``gelu_new``); the erf GELU differs by ~1e-3 on the fixture."""
    return F.gelu(x, approximate="tanh")


class T5DenseGatedGelu(nn.Module):
    """Gated-GeLU feed-forward of T5 v1.1: ``wo(dropout(gelu_new(wi_0 h) * wi_1 h))``."""

    def __init__(self, d_model: int, d_ff: int, dropout: float = 0.0):
        super().__init__()
        self.wi_0 = nn.Linear(d_model, d_ff, bias=False)
        self.wi_1 = nn.Linear(d_model, d_ff, bias=False)
        self.wo = nn.Linear(d_ff, d_model, bias=False)
        self.dropout = nn.Dropout(dropout)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        """h: (.., d_model) -> (.., d_model), float32 where float16 is in play (``wo`` in float32)."""
        wo_fp32 = fp16_in_play(h)
        if torch.is_grad_enabled() and not autocast_on(h):
            # autograd: only h (and a bool dropout mask) are kept, the (.., d_ff) intermediates are
            # recomputed in backward (see GatedGeluFFN); same values as the plain expression below.
            # (Under autocast the plain expression runs: backward would recompute without it.)
            p = self.dropout.p if self.dropout.training else 0.0
            return GatedGeluFFN.apply(h, self.wi_0.weight, self.wi_1.weight, self.wo.weight, p, wo_fp32)
        x = self.dropout(gelu_new(self.wi_0(h)) * self.wi_1(h))  # (.. d_ff)
        if not wo_fp32:
            return self.wo(x)
        with float32_region(h):
            return F.linear(x.float(), self.wo.weight.float())


class GatedGeluFFN(torch.autograd.Function):
    """``wo(dropout(gelu_new(h wi_0^T) * (h wi_1^T)))`` keeping only ``h`` and the dropout mask (bool)
    for backward instead of four (.., d_ff) float tensors: the two input projections and the GeLU
    are recomputed there (two more matmuls out of the six of a forward + backward). At 16K tokens
    this is 12 KB instead of ~40 KB per token and layer for locost_base."""

    @staticmethod
    def forward(ctx, h, w0, w1, wo, p: float, wo_fp32: bool = False):
        a = F.linear(h, w0)  # (.. F)
        x = gelu_new(a).mul_(F.linear(h, w1))  # (.. F)
        del a
        mask = None
        if p > 0:
            x, mask = dropout_with_mask(x, p)
        ctx.p = p
        ctx.save_for_backward(h, w0, w1, wo, mask)
        if wo_fp32:  # float16 in play: wo in float32, the output too (module doc)
            return F.linear(x.float(), wo.float())
        return F.linear(x, wo)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad):
        h, w0, w1, wo, mask = ctx.saved_tensors
        p = ctx.p
        a = F.linear(h, w0)  # (.. F)
        b = F.linear(h, w1)  # (.. F)
        g = gelu_new(a)  # (.. F)
        dx = F.linear(grad, wo.t().to(grad.dtype)).to(a.dtype)  # (.. F): d loss / d (dropped product)
        if mask is not None:
            dx = masked_scale(dx, mask, p)
        d_wo = None
        if ctx.needs_input_grad[3]:
            x = g * b
            if mask is not None:
                x = masked_scale(x, mask, p)  # the forward's dropped product, replayed
            d_wo = grad.reshape(-1, grad.shape[-1]).t() @ x.reshape(-1, x.shape[-1]).to(grad.dtype)  # (C F)
            d_wo = d_wo.to(wo.dtype)
            del x
        db = dx * g  # d / d b
        del g
        da = torch.ops.aten.gelu_backward(dx.mul_(b), a, approximate="tanh")  # d / d a
        del a, b, dx
        h2 = h.reshape(-1, h.shape[-1])
        d_w0 = da.reshape(-1, da.shape[-1]).t() @ h2 if ctx.needs_input_grad[1] else None
        d_w1 = db.reshape(-1, db.shape[-1]).t() @ h2 if ctx.needs_input_grad[2] else None
        d_h = F.linear(da, w0.t()) + F.linear(db, w1.t()) if ctx.needs_input_grad[0] else None
        return d_h, d_w0, d_w1, d_wo, None, None


def relative_position_bucket(
    relative_position: torch.Tensor,
    bidirectional: bool,
    num_buckets: int = T5_DEFAULTS["relative_attention_num_buckets"],
    max_distance: int = T5_DEFAULTS["relative_attention_max_distance"],
) -> torch.Tensor:
    """T5 buckets for ``memory_position - query_position`` (HF ``_relative_position_bucket``).

    Unidirectional (decoder): only non-positive offsets count; half the buckets are exact offsets
    0..num_buckets/2-1, the rest log-spaced up to ``max_distance``, beyond which all share the last.
    Bidirectional: the buckets are split between the two signs first.
    """
    buckets = torch.zeros_like(relative_position)
    if bidirectional:
        num_buckets //= 2
        buckets = buckets + (relative_position > 0).long() * num_buckets
        relative_position = relative_position.abs()
    else:
        relative_position = -torch.clamp(relative_position, max=0)
    max_exact = num_buckets // 2
    is_small = relative_position < max_exact
    # clamp(min=1) only avoids log(0) on entries that the torch.where below discards anyway
    large = (
        max_exact
        + (
            torch.log(relative_position.clamp(min=1).float() / max_exact)
            / math.log(max_distance / max_exact)
            * (num_buckets - max_exact)
        ).long()
    )
    large = torch.clamp(large, max=num_buckets - 1)
    return buckets + torch.where(is_small, relative_position, large)


class T5Attention(nn.Module):
    """T5 attention: no score scaling (folded into the init), fp32 softmax, optional position bias.

    ``forward`` takes batch-first tensors (B, T, C). ``bias`` is an additive float tensor
    broadcastable to (B, heads, T, S) that already combines position bias and masks.

    Incremental decoding: with ``incremental_state`` given, self-attention appends this step's keys /
    values to the cached ones; cross-attention (``static_kv=True``) projects the memory once and
    reuses it.
    """

    def __init__(
        self,
        d_model: int,
        d_kv: int,
        num_heads: int,
        has_relative_attention_bias: bool = False,
        relative_attention_num_buckets: int = T5_DEFAULTS["relative_attention_num_buckets"],
        relative_attention_max_distance: int = T5_DEFAULTS["relative_attention_max_distance"],
        bidirectional: bool = False,
        dropout: float = 0.0,
    ):
        super().__init__()
        inner = num_heads * d_kv
        self.num_heads, self.d_kv = num_heads, d_kv
        self.q = nn.Linear(d_model, inner, bias=False)
        self.k = nn.Linear(d_model, inner, bias=False)
        self.v = nn.Linear(d_model, inner, bias=False)
        self.o = nn.Linear(inner, d_model, bias=False)
        self.dropout = dropout
        self.bidirectional = bidirectional
        self.num_buckets = relative_attention_num_buckets
        self.max_distance = relative_attention_max_distance
        if has_relative_attention_bias:
            self.relative_attention_bias = nn.Embedding(relative_attention_num_buckets, num_heads)
        self._state_key = f"{uuid.uuid4()}.t5_attn_state"

    def compute_bias(self, q_len: int, k_len: int, q_offset: int = 0, device=None) -> torch.Tensor:
        """Position bias (1, heads, q_len, k_len) for queries at positions q_offset..q_offset+q_len-1."""
        weight = self.relative_attention_bias.weight
        device = device or weight.device
        ctx = torch.arange(q_offset, q_offset + q_len, device=device)[:, None]  # (T 1)
        mem = torch.arange(k_len, device=device)[None, :]  # (1 S)
        buckets = relative_position_bucket(mem - ctx, self.bidirectional, self.num_buckets, self.max_distance)  # (T S)
        return self.relative_attention_bias(buckets).permute(2, 0, 1).unsqueeze(0)  # (1 heads T S)

    def _shape(self, x: torch.Tensor) -> torch.Tensor:
        B, T, _ = x.shape
        return x.view(B, T, self.num_heads, self.d_kv).transpose(1, 2)  # (B heads T d_kv)

    def forward(
        self,
        x: torch.Tensor,
        memory: Optional[torch.Tensor] = None,
        bias: Optional[torch.Tensor] = None,
        incremental_state: Optional[IncrementalState] = None,
        static_kv: bool = False,
    ) -> torch.Tensor:
        """x: (B, T, C); memory: (B_m, S, C) for cross-attention (None: self-attention) -> (B, T, C).

        Cross-attention is "beamable": ``memory`` (and ``bias``) may hold one row per source while
        ``x`` holds ``beam`` rows per source (B = beam * B_m, beams of a source adjacent, as in
        fairseq's SequenceGenerator); keys / values are then projected and cached once per source
        instead of once per hypothesis. With ``incremental_state``, cross-attention caches its keys,
        values and bias at the first step and ignores ``memory`` / ``bias`` afterwards.
        """
        B, T, _ = x.shape
        q = self._shape(self.q(x))  # (B heads T d_kv)
        saved = None
        if incremental_state is not None:
            saved = incremental_state.get(self._state_key)
        if static_kv and saved is not None:
            # cached at the first step; only a reorder changes this state
            k, v, bias = saved["prev_key"], saved["prev_value"], saved.get("bias")
        else:
            src = x if memory is None else memory
            k, v = self._shape(self.k(src)), self._shape(self.v(src))  # (B_m heads S d_kv)
            if saved is not None:
                k = torch.cat([saved["prev_key"], k], dim=2)  # (B heads S_prev+T d_kv)
                v = torch.cat([saved["prev_value"], v], dim=2)
            if incremental_state is not None:
                state: Dict[str, Any] = {"prev_key": k, "prev_value": v}
                if static_kv:
                    if bias is not None:
                        state["bias"] = bias
                    # hypotheses per cached row (> 1 for beamable cross-attention), for reordering:
                    # a Python int, so that a reorder reads no tensor
                    state["beam"] = B // k.shape[0]
                incremental_state[self._state_key] = state

        beam = B // k.shape[0]
        if beam * k.shape[0] != B:
            raise ValueError(f"attention: {B} query rows cannot be split over {k.shape[0]} memory rows")
        if beam > 1:
            # beamable cross-attention: a source's beam queries become extra query rows against its
            # one copy of the keys. (A broadcast matmul over a beam axis would have torch expand and
            # copy K and V beam times at every decoding step: benchmarks/README, "Figures behind the constants".)
            Bm = k.shape[0]
            q = q.view(Bm, beam, self.num_heads, T, self.d_kv).transpose(1, 2)  # (B_m heads beam T d_kv)
            q = q.reshape(Bm, self.num_heads, beam * T, self.d_kv)  # (B_m heads beam*T d_kv)
        if memory is not None and self.training and torch.is_grad_enabled():
            # training cross-attention: the (heads, T, S) probabilities would be kept for backward
            # three times (softmax, dropout, matmul: GiBs at long sources, benchmarks/README, "Figures
            # behind the constants"); they are recomputed in backward instead, with the same dropout
            # mask (RNG restored)
            out = checkpoint(self._attend, q, k, v, bias, use_reentrant=False)
        else:
            out = self._attend(q, k, v, bias)  # (B_m heads beam*T d_kv)
        if beam > 1:
            out = out.view(k.shape[0], self.num_heads, beam, T, self.d_kv).transpose(1, 2)  # (B_m beam heads T d_kv)
        out = out.reshape(B, self.num_heads, T, self.d_kv)  # (B heads T d_kv)
        out = out.transpose(1, 2).reshape(B, T, self.num_heads * self.d_kv)  # (B T heads*d_kv)
        return self.o(out)

    def fused(self, q: torch.Tensor) -> bool:
        """Whether :meth:`_attend` takes one ``F.scaled_dot_product_attention`` call for ``q``: in
        eval mode (no dropout), neither float16 nor autocast in play. Its scores stay float32 inside
        the kernel where :meth:`reference` (HF's arithmetic) rounds them to a half dtype first, and
        the float32 bias enters it in q's dtype: float32 agrees with HF's to rounding, bfloat16 is no
        further from float64 than HF's (tests/test_precision.py). One call where HF's chain is a
        dozen ops: a decoding step waits on the host (benchmarks/locost_gpu_notes.md)."""
        return not self.training and not fp16_in_play(q) and not autocast_on(q)

    def _attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: Optional[torch.Tensor]) -> torch.Tensor:
        """softmax(q k^T + bias) v, no score scaling (T5): :meth:`reference`, or one fused call
        (:meth:`fused`)."""
        if self.fused(q):
            mask = None if bias is None else bias.to(q.dtype)
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=1.0)
        return self.reference(q, k, v, bias)

    def reference(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: Optional[torch.Tensor]
    ) -> torch.Tensor:
        """softmax(q k^T + bias) v, dropout on the probabilities, no score scaling, HF T5's operations;
        q (B_m, heads, beam*T, d_kv), k, v (B_m, heads, S, d_kv), bias (B_m or 1, heads or 1, T or 1, S)."""
        if fp16_in_play(q):  # unscaled scores can pass float16's range: formed in float32
            with float32_region(q):
                scores = torch.matmul(q.float(), k.float().transpose(-1, -2))  # (B_m heads beam*T S)
        else:
            scores = torch.matmul(q, k.transpose(-1, -2)).float()  # (B_m heads beam*T S)
        if bias is not None:
            scores = scores + bias  # bias: (B_m or 1, heads or 1, T or 1, S)
        attn = F.softmax(scores, dim=-1).type_as(q)
        attn = F.dropout(attn, p=self.dropout, training=self.training)
        return torch.matmul(attn, v)  # (B_m heads beam*T d_kv)

    def cached_length(self, incremental_state: Optional[IncrementalState]) -> int:
        """Number of key positions already cached (0 without state)."""
        if incremental_state is None or self._state_key not in incremental_state:
            return 0
        return incremental_state[self._state_key]["prev_key"].shape[2]

    def reorder_incremental_state(self, incremental_state: IncrementalState, new_order: torch.Tensor):
        """Beam search: select batch rows ``new_order`` (hypotheses) of the cached keys / values.

        A cross-attention cache holds the source's keys: one row per source under beamable
        cross-attention (beam > 1, set only while a generator runs; ``new_order`` indexes
        hypotheses source * beam + k, so the rows kept are the sources of its groups of ``beam``),
        one row per hypothesis otherwise, the rows of a source's hypotheses alike (the encoder output
        tiled). It is left as it is when every source still has hypotheses, decided from sizes alone,
        as fairseq's ``MultiheadAttention.reorder_incremental_state`` does for every beam size: a
        sequence generator moves hypotheses within their source only, so sources that all remain are
        in order. (A check of the indices would wait for the device, and a selection would copy
        every layer's source keys, at every step.) Self-attention caches take ``new_order``'s rows."""
        saved = incremental_state.get(self._state_key)
        if saved is None:
            return
        beam = saved.get("beam", 1)
        if "beam" in saved and new_order.numel() == saved["prev_key"].shape[0] * beam:
            return
        rows = new_order.view(-1, beam)[:, 0] // beam if beam > 1 else new_order  # (B_m')
        incremental_state[self._state_key] = {
            name: (t if name == "beam" else t.index_select(0, rows)) for name, t in saved.items()
        }
