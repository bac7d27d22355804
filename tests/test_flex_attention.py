"""The FlexAttention path of the LSG and Longformer attentions (``lsg_layers.ops.flex``) on CPU.

- each mask_mod, evaluated with ``create_mask``, equals the dense mask of the slow references
  (``test_lsg_attention.reference_allow``, ``test_longformer_attention.reference_local_keys``);
- the block tables keep exactly that mask: ``dense_flex`` reads them as the kernel does (whole
  tiles without the mask_mod, kept tiles with it, nothing else) and must find the mask again;
- the layers on the flex path, with ``dense_flex`` for the kernel, against the dense references
  (every sparsity type, padding, global tokens), then once each with the compiled kernel;
- one block mask per encoder forward, shared by the layers; the path rule.
"""

import types

import pytest
import torch
from torch.nn.attention.flex_attention import create_mask

from conftest import TOY_LSG, build_task_and_model, toy_batch, write_toy_dict
from lsg_layers.modules import paths
from lsg_layers.modules.paths import CPU, FLEX, WHOLE, PathChoice, attention_path, forced_path, paths_ran
from lsg_layers.ops import compiling, flex
from test_longformer_attention import check as led_check
from test_longformer_attention import dense_reference as led_dense_reference
from test_longformer_attention import inputs as led_inputs
from test_longformer_attention import make as led_make
from test_longformer_attention import reference_local_keys
from test_lsg_attention import TYPES, make, reference_allow, run_both

NEG = torch.finfo(torch.float32).min


# ----------------------------------------------------------------------------- flex, read densely
def _tiles(num, idx, nk):
    """flex's (n, H, nq) counts and (n, H, nq, nk') indices -> (n, H, nq, nk) bool tile grid."""
    kept = torch.arange(idx.size(-1))[None, None, None, :] < num[..., None]
    at = torch.where(kept, idx.long(), nk)
    grid = torch.zeros(*idx.shape[:-1], nk + 1, dtype=torch.bool)
    return grid.scatter_(-1, at, True)[..., :nk]


def kept_pairs(block_mask, n, h, q_len, kv_len):
    """(n, h, q_len, kv_len) bool: the pairs the kernel lets attend, read from the tables as it
    reads them (whole tiles: all pairs; other kept tiles: where the mask_mod says so), and the
    mask_mod's own mask."""
    bq, bk = block_mask.BLOCK_SIZE
    nk = -(-kv_len // bk)

    def pairs(grid):  # (n, H, nq, nk) tiles -> (n, H, q_len, kv_len) pairs
        return grid.repeat_interleave(bq, 2)[:, :, :q_len].repeat_interleave(bk, 3)[..., :kv_len]

    partial = pairs(_tiles(block_mask.kv_num_blocks, block_mask.kv_indices, nk))
    full = pairs(_tiles(block_mask.full_kv_num_blocks, block_mask.full_kv_indices, nk))
    mask = create_mask(block_mask.mask_mod, n, h, q_len, kv_len, device="cpu")
    return (full | partial & mask).expand(n, h, q_len, kv_len), mask


def dense_flex(q, k, v, block_mask, scale):
    """What ``flex.flex_attention`` computes, with dense scores (a stand-in that needs no compile)."""
    n, h, lq, _ = q.shape
    keep, mask = kept_pairs(block_mask, n, h, lq, k.size(2))
    assert torch.equal(keep, mask), "the block tables lose pairs of the mask or keep masked ones whole"
    scores = (q @ k.transpose(-1, -2) * scale).masked_fill(~keep, float("-inf"))
    return torch.softmax(scores, -1) @ v


@pytest.fixture
def dense_kernel(monkeypatch):
    monkeypatch.setattr(flex, "flex_attention", dense_flex)


# ----------------------------------------------------------------------------- LSG masks
def _lsg_pieces(stype, G, bs, sbs, sf, t, lengths, hide_first=False, h=2):
    """A layer and the inputs of its mask: key_ok (n, t + G), sparse_ok (n, h, ns) or None, the
    reference's valid (n, S) keys."""
    attn = make(stype, G=G, bs=bs, sbs=sbs, sf=sf, h=h, C=16 * h)
    n, S = len(lengths), G + t
    pad = torch.arange(S)[None, :] >= G + torch.tensor(lengths)[:, None]  # (n, S)
    if hide_first:
        pad[:, G] = True  # --mask-first-token: a key hidden inside the row
    x = torch.randn(n, S, attn.embed_dim)
    with torch.no_grad():
        q, k, v = (p(x).view(n, S, h, -1) for p in (attn.q_proj, attn.k_proj, attn.v_proj))
        key_mask = torch.zeros(n, S).masked_fill(pad, NEG)
        ns = 0
        sparse_ok = None
        if attn.has_sparse:
            attn.generator = torch.Generator().manual_seed(0)
            _, _, sm = attn._sparse(q, k[:, G:], v[:, G:], key_mask[:, G:])
            ns = t // sf
            sparse_ok = torch.ones(n, h, ns, dtype=torch.bool) if sm is None else (sm == 0).expand(n, h, ns)
    key_ok = ~torch.cat([pad[:, G:], pad[:, :G]], 1)
    return attn, key_ok, sparse_ok, ~pad, ns


@pytest.mark.parametrize("stype", TYPES)
@pytest.mark.parametrize(
    "G,bs,sbs,sf,t,lengths,hide_first",
    [
        (2, 4, 4, 2, 32, (32, 21), True),
        (1, 8, 4, 4, 48, (40, 48), False),
        (3, 6, 3, 3, 42, (42, 25), False),  # odd step
    ],
)
def test_lsg_mask_mod_equals_the_reference_mask(stype, G, bs, sbs, sf, t, lengths, hide_first):
    attn, key_ok, sparse_ok, valid, ns = _lsg_pieces(stype, G, bs, sbs, sf, t, lengths, hide_first)
    layout = flex.LSGLayout(t, G, bs, bs // sf, sbs, ns)
    mod = flex.lsg_mask_mod(layout, key_ok, sparse_ok)
    got = create_mask(mod, len(lengths), 2, t, layout.length, device="cpu")  # (n, h, t, KV)
    S = G + t
    # the reference's columns [globals | tokens | sparse] where the layout puts them
    at = torch.cat([torch.arange(t, t + G), torch.arange(t), torch.arange(ns) + layout.sparse_at])
    for b in range(len(lengths)):
        sok = torch.zeros(2, 0, dtype=torch.bool) if sparse_ok is None else sparse_ok[b]
        ref = torch.zeros(2, t, layout.length, dtype=torch.bool)
        ref[:, :, at] = reference_allow(G, t, bs, sbs, sf, valid[b], sok)[:, G:S]  # token queries
        assert torch.equal(got[b], ref), (b, (got[b] != ref).nonzero()[:5])


@pytest.mark.parametrize("stype", ["none", "norm", "stride"])
@pytest.mark.parametrize(
    "tile,bs,sbs,sf,t,lengths",
    [
        (4, 4, 4, 2, 40, (40, 40)),  # tiles = blocks: local windows are whole tiles
        (4, 8, 8, 2, 64, (64, 37)),
        (8, 4, 4, 1, 40, (40, 23)),  # tiles of two blocks
        (16, 4, 8, 4, 64, (64, 50)),
        (128, 4, 4, 2, 32, (32, 21)),  # flex's tile: one tile
    ],
)
def test_lsg_block_tables_keep_exactly_the_mask(stype, tile, bs, sbs, sf, t, lengths, monkeypatch):
    monkeypatch.setattr(flex, "BLOCK", tile)
    G = 2
    attn, key_ok, sparse_ok, _, ns = _lsg_pieces(stype, G, bs, sbs, sf, t, lengths)
    layout = flex.LSGLayout(t, G, bs, bs // sf, sbs, ns)
    block_mask = flex.lsg_block_mask(layout, key_ok, flex.lsg_mask_mod(layout, key_ok, sparse_ok))
    keep, mask = kept_pairs(block_mask, len(lengths), 2, t, layout.length)
    assert torch.equal(keep, mask.expand_as(keep))
    if 4 * tile <= t:  # tiles left out
        kept = int(block_mask.kv_num_blocks.sum() + block_mask.full_kv_num_blocks.sum())
        assert kept < block_mask.kv_indices[..., 0].numel() * block_mask.kv_indices.size(-1)
    if tile == bs and lengths[0] == t:
        assert int(block_mask.full_kv_num_blocks[0].sum()) > 0  # and whole tiles where the window is


# ----------------------------------------------------------------------------- LED masks
@pytest.mark.parametrize("tile", [4, 8, 128])
@pytest.mark.parametrize("w", [1, 3, 8])
def test_led_mask_mod_and_tables_equal_the_reference_mask(w, tile, monkeypatch):
    monkeypatch.setattr(flex, "BLOCK", tile)
    T, lengths = 40, (40, 27)
    real = torch.arange(T)[None, :] < torch.tensor(lengths)[:, None]
    glob = torch.zeros(2, T, dtype=torch.bool)
    glob[0, [0, 5, 6, 39]] = True
    glob[1, [0, 26, 30]] = True  # 30: a flag on padding, ignored
    glob &= real
    mod = flex.led_mask_mod(w, real, glob)
    block_mask = flex.led_block_mask(w, real, glob, mod)
    keep, mask = kept_pairs(block_mask, 2, 1, T, T)
    for b in range(2):
        assert torch.equal(mask[b, 0], reference_local_keys(real[b], glob[b], w))
    assert torch.equal(keep, mask)
    if tile == 4 and w == 8:
        assert int(block_mask.full_kv_num_blocks.sum()) > 0


def test_block_tables_need_no_query_by_key_grid():
    """At 64K tokens (base LSG: blocks 128, sparse blocks 128, factor 2; LED: window 1,024) the
    block masks are built from per-tile ranges: nothing near 64K x 64K is allocated, and nothing
    is read on the host (meta tensors have no values)."""
    from test_whole_tensor_paths import OpCounter

    t, G = 65536, 1
    largest = []

    class Sizes(OpCounter):
        def __torch_dispatch__(self, func, types_, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            for o in out if isinstance(out, (tuple, list)) else [out]:
                if isinstance(o, torch.Tensor):
                    largest.append(o.numel())
            return out

    key_ok = torch.ones(2, t + G, dtype=torch.bool, device="meta")
    sparse_ok = torch.ones(2, 12, t // 2, dtype=torch.bool, device="meta")
    real = torch.ones(2, t, dtype=torch.bool, device="meta")
    layout = flex.LSGLayout(t, G, 128, 64, 128, t // 2)
    with Sizes():
        lsg = flex.lsg_block_mask(layout, key_ok, flex.lsg_mask_mod(layout, key_ok, sparse_ok))
        led = flex.led_block_mask(512, real, real & False, flex.led_mask_mod(512, real, real & False))
    assert lsg.kv_indices.shape == (2, 1, 512, 769) and led.kv_indices.shape == (2, 1, 512, 512)
    assert max(largest) <= 2 * 769 * 769, max(largest)  # (rows, tiles, tiles); t x t would be 4.3e9


@pytest.mark.parametrize("t", [16384, 65536])
def test_block_tables_keep_a_constant_number_of_tiles_per_query_tile(t):
    """The kernel's work grows with the tokens, not faster: base LSG (3 local key tiles, the sparse
    entries of 1-2 tiles each side, the global's tile) and LED with a 1,024 window (its band: 9
    tiles) keep the same number of key tiles per query tile at 16K and 64K (benchmarks/flex_gpu_notes.md
    asked whether LSG's 6.1x time for 4x tokens on the first GPU reading came from the tables)."""
    G = 1
    layout = flex.LSGLayout(t, G, 128, 64, 128, t // 2)
    key_ok = torch.ones(1, t + G, dtype=torch.bool)
    lsg = flex.lsg_block_mask(
        layout, key_ok, flex.lsg_mask_mod(layout, key_ok, torch.ones(1, 12, t // 2, dtype=torch.bool))
    )
    real = torch.ones(1, t, dtype=torch.bool)
    led = flex.led_block_mask(512, real, real & False, flex.led_mask_mod(512, real, real & False))
    for mask, most in ((lsg, 7), (led, 9)):
        kept = mask.kv_num_blocks + mask.full_kv_num_blocks  # (1, 1, query tiles)
        assert int(kept.max()) <= most and float(kept.float().mean()) > most - 1, (t, kept.float().mean())


# ----------------------------------------------------------------------------- layers on the flex path
def _flex(layer):
    layer.path = FLEX
    return layer


@pytest.mark.parametrize("stype", TYPES)
@pytest.mark.parametrize("G,L,lengths", [(1, 29, None), (2, 29, [29, 17]), (4, 24, [11, 24])])
def test_lsg_flex_path_matches_dense_reference(stype, G, L, lengths, dense_kernel):
    attn = _flex(make(stype, G=G, bs=4, sbs=4, sf=2, h=2, C=32))
    fast, slow, mask = run_both(attn, G + L, 2, lengths, gen_seed=7 if stype == "lsh" else None)
    assert attn.ran == FLEX
    keep = torch.ones(G + L, 2, dtype=torch.bool) if mask is None else ~mask.t()
    assert torch.allclose(fast[keep], slow[keep], atol=1e-5), (fast - slow)[keep].abs().max()


@pytest.mark.parametrize("stype", ["norm", "pooling", "stride"])
@pytest.mark.parametrize("bs,sbs,sf", [(6, 3, 3), (4, 8, 1), (8, 10, 2)])  # odd step, sparse = tokens, sbs % step
def test_lsg_flex_path_any_sparse_windows(stype, bs, sbs, sf, dense_kernel):
    attn = _flex(make(stype, G=2, bs=bs, sbs=sbs, sf=sf, h=2, C=32))
    L = 7 * bs + 1
    fast, slow, mask = run_both(attn, 2 + L, 2, [L, L - bs - 1])
    keep = ~mask.t()
    assert torch.allclose(fast[keep], slow[keep], atol=1e-5), (fast - slow)[keep].abs().max()


@pytest.mark.parametrize("window", [2, 8, 64])
def test_led_flex_path_matches_dense_reference(window, dense_kernel):
    attn = _flex(led_make(window, C=32, h=2))
    lengths = [50, 33]
    x, pad, glob = led_inputs(lengths, 50, C=32, n_glob=([0, 1, 7, 49], [0, 3, 32]))
    with torch.no_grad():
        led_check(attn, x, pad, glob, lengths)
        led_check(attn, x, pad, None, lengths)  # no global token
        led_check(attn, x, None, glob, [50, 50])
    assert attn.ran == FLEX


def test_lsg_compiled_flex_matches_dense_reference():
    """The compiled kernel itself (one compile for the six types with sparse keys: same shapes),
    per-head sparse validity (stride, an odd length), a hidden key inside a row, globals."""
    for stype in [s for s in TYPES if s != "none"]:
        attn = _flex(make(stype, G=2, bs=4, sbs=4, sf=2, h=2, C=32))
        fast, slow, mask = run_both(attn, 2 + 37, 2, [37, 19], gen_seed=7 if stype == "lsh" else None)
        assert attn.ran == FLEX
        keep = ~mask.t()
        assert torch.allclose(fast[keep], slow[keep], atol=1e-5), (stype, (fast - slow)[keep].abs().max())


def test_led_compiled_flex_matches_dense_reference():
    attn = _flex(led_make(8, C=32, h=2))
    lengths = [70, 41]
    x, pad, glob = led_inputs(lengths, 70, C=32, n_glob=([0, 1, 9, 69], [0, 40]))
    with torch.no_grad():
        out, _ = attn(x, x, x, key_padding_mask=pad, global_attention_mask=glob)
    ref = led_dense_reference(attn, x, pad, glob)
    assert attn.ran == FLEX
    for b, L in enumerate(lengths):
        assert (out[:L, b].double() - ref[:L, b]).abs().max() < 1e-5


def test_compiled_flex_may_keep_many_versions(monkeypatch):
    """Past dynamo's recompile limit flex runs uncompiled (the dense fallback, with a warning only):
    the first compiled call raises the limit, and never lowers a higher one."""
    from torch import _dynamo

    config, name = _dynamo.config, compiling.limit_setting()
    saved = getattr(config, name)  # (set back by hand: monkeypatch deletes a config entry on undo)
    try:
        setattr(config, name, 8)
        monkeypatch.setattr(flex, "_compiled", {})
        test_led_compiled_flex_matches_dense_reference()
        assert getattr(config, name) == compiling.RECOMPILE_LIMIT > 8
        compiling.raise_recompile_limit(4)
        assert getattr(config, name) == compiling.RECOMPILE_LIMIT
    finally:
        setattr(config, name, saved)


def test_cuda_calls_take_the_measured_kernel_options(monkeypatch):
    """CUDA flex calls pass ``CUDA_KERNEL_OPTIONS`` (the measured faster tiles); CPU calls none."""
    calls = []
    fake = {d: (lambda *a, **kw: calls.append(kw["kernel_options"])) for d in ("cpu", "cuda")}
    monkeypatch.setattr(flex, "_compiled", fake)
    for device in ("cuda", "cpu"):
        q = types.SimpleNamespace(device=types.SimpleNamespace(type=device))
        flex.flex_attention(q, None, None, None, 1.0)
    assert calls == [{"BLOCK_N": 64}, None] and calls[0] is flex.CUDA_KERNEL_OPTIONS


# ----------------------------------------------------------------------------- models: one block mask per forward
@pytest.mark.parametrize(
    "arch,extra,builder",
    [
        ("lsg_bart_tiny", TOY_LSG, "lsg_block_mask"),
        ("led_tiny", ["--attention-window", "8", "--global-token-ids", "7"], "led_block_mask"),
    ],
)
def test_models_build_one_block_mask_per_forward(arch, extra, builder, tmp_path, dense_kernel, monkeypatch):
    """Two encoder layers, one block mask per encoder forward; the same encoder output as the
    CPU path (head dim 16: the tiny archs' 64 / 4)."""
    data = write_toy_dict(tmp_path)
    _, model = build_task_and_model(
        [
            data,
            "--task",
            "long_document_summarization",
            "--arch",
            arch,
            "--max-source-positions",
            "64",
            "--dropout",
            "0",
        ]
        + extra
    )
    built = []
    original = getattr(flex, builder)
    monkeypatch.setattr(flex, builder, lambda *a: built.append(1) or original(*a))
    src, lengths, _ = toy_batch(L=45, lengths=(45, 30))
    model.eval()
    outs = {}
    for path in (CPU, FLEX):
        with forced_path(model, path), torch.no_grad():
            out = model.encoder(src, src_lengths=lengths)
            assert paths_ran(model.encoder) == path
        pad = out["encoder_padding_mask"][0].t()[..., None]
        outs[path] = out["encoder_out"][0].masked_fill(pad, 0)
    assert len(model.encoder.layers) == 2 and len(built) == 1
    assert torch.allclose(outs[CPU], outs[FLEX], atol=1e-5), (outs[CPU] - outs[FLEX]).abs().max()


# ----------------------------------------------------------------------------- the path rule
def test_path_rule():
    # auto: the CPU kernels on a CPU, whole tensors on a GPU (flex measured slower there:
    # benchmarks/results/h200_49a7388), for inference and training alike
    assert attention_path("auto", "cpu", 64, 0.0, grad=True) == CPU
    # small heads on a CPU: one gathered call beats the strided windows (cpu_path_by_head_dim.md)
    assert attention_path("auto", "cpu", 32, 0.0, grad=True) == WHOLE
    assert attention_path("auto", "cpu", 16, 0.0, grad=False) == WHOLE
    assert attention_path("cpu", "cpu", 16, 0.0, grad=True) == CPU  # forcing still forces
    assert attention_path("auto", "cuda", 64, 0.0, grad=False) == WHOLE
    assert attention_path("auto", "cuda", 64, 0.0, grad=True) == WHOLE
    assert attention_path("auto", "cuda", 64, 0.1, grad=True) == WHOLE
    assert attention_path("auto", "cpu", 64, 0.1, grad=True) == WHOLE  # attention dropout
    assert attention_path("auto", "meta", 64, 0.0, grad=False) == WHOLE
    # forced: flex on CUDA where it can run, and on a CPU without autograd (tests); whole tensors
    # where it cannot
    assert attention_path("flex", "cuda", 64, 0.0, grad=False) == FLEX
    assert attention_path("flex", "cuda", 64, 0.0, grad=True) == FLEX
    assert attention_path("flex", "cuda", 64, 0.1, grad=True) == WHOLE  # attention dropout
    assert attention_path("flex", "cuda", 8, 0.0, grad=False) == WHOLE  # head dim under 16
    assert attention_path("flex", "cpu", 64, 0.0, grad=False) == FLEX
    assert attention_path("flex", "cpu", 64, 0.0, grad=True) == WHOLE  # no backward on CPU
    assert attention_path("whole", "cuda", 64, 0.0, grad=False) == WHOLE
    assert attention_path("cpu", "cuda", 64, 0.0, grad=False) == WHOLE


def test_layers_choose_their_path_on_a_pretend_cuda_device():
    attn = make("norm", G=1, bs=4, sbs=4, sf=2, h=2, C=32, dropout=0.1)  # eval(): no dropout
    cuda = types.SimpleNamespace(device=torch.device("cuda"), requires_grad=False)
    assert attn.choose_attention_path(cuda, attn.head_dim, 0.0) == WHOLE and attn.ran == WHOLE
    attn.path = FLEX
    assert attn.choose_attention_path(cuda, attn.head_dim, 0.0) == FLEX and attn.ran == FLEX
    attn.train()
    assert attn.choose_attention_path(cuda, attn.head_dim, attn.dropout) == WHOLE
    attn.dropout = 0.0
    assert attn.choose_attention_path(cuda, attn.head_dim, attn.dropout) == FLEX  # training, no dropout
    led = led_make(8, C=32, h=2)
    assert led.choose_attention_path(cuda, led.head_dim, 0.0) == WHOLE
    led.path = FLEX
    assert led.choose_attention_path(cuda, led.head_dim, 0.0) == FLEX


def test_layers_without_flex_take_whole_tensors():
    layer = PathChoice()
    layer.path = FLEX
    assert layer.whole_tensors(torch.zeros(1)) and layer.ran == WHOLE
    layer.path = paths.AUTO
    assert not layer.whole_tensors(torch.zeros(1)) and layer.ran == CPU
