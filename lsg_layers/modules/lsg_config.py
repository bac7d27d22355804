"""LSG attention's configuration: the sparsity types, the reference's defaults and the one check
of a configuration, read by the layer (``lsg_attention.LSGSelfAttention``), the ``lsg_bart``
archs and flags (``models/lsg_bart.py``) and the converter (``convert/lsg_bart.py``), so that each
value has one home and one check wherever it arrives. Names: ``lsg_attention``'s glossary.
"""

from typing import Any, Callable, Dict, Optional

SPARSITY_TYPES = ("none", "norm", "pooling", "stride", "block_stride", "lsh", "bos_pooling")
# Rows of the global-token embedding table, the reference's fixed size (HF LSG checkpoints carry
# all of them; the first num_global_tokens are used).
MAX_GLOBAL_TOKENS = 512
# The reference's defaults (spec/lsg.md section 1): the layer's keyword defaults and the lsg_bart
# archs' (models/lsg_bart.py), so both read them from here.
LSG_DEFAULTS: Dict[str, Any] = dict(
    num_global_tokens=1,
    block_size=128,
    sparse_block_size=128,
    sparsity_factor=2,
    sparsity_type="norm",
    lsh_num_pre_rounds=1,
)


def check_lsg_config(
    block_size: int,
    sparse_block_size: int,
    sparsity_factor: int,
    sparsity_type,
    num_global_tokens: int,
    lsh_num_pre_rounds: int = 1,
    name: Optional[Callable[[str], str]] = None,
) -> None:
    """Raise ``ValueError`` for hyper-parameters the LSG attention cannot honour.

    ``name`` maps an argument name to how the caller calls it (e.g. its CLI flag), so messages
    name what the user typed. ``sparsity_type`` is one of :data:`SPARSITY_TYPES` as spelled there
    (the reference's ``None`` is mapped to ``"none"`` where HF configs are read, ``convert.lsg_bart``).
    """
    n = {
        k: (name or str)(k)
        for k in (
            "block_size",
            "sparse_block_size",
            "sparsity_factor",
            "sparsity_type",
            "num_global_tokens",
            "lsh_num_pre_rounds",
        )
    }
    if sparsity_type not in SPARSITY_TYPES:
        raise ValueError(
            f"{n['sparsity_type']}={sparsity_type!r} is not a known sparsity type; choose one of "
            f"{', '.join(SPARSITY_TYPES)}"
        )
    if block_size < 1:
        raise ValueError(f"{n['block_size']} must be >= 1, got {block_size}")
    if not 1 <= num_global_tokens <= MAX_GLOBAL_TOKENS:
        raise ValueError(f"{n['num_global_tokens']} must be in [1, {MAX_GLOBAL_TOKENS}], got {num_global_tokens}")
    if sparse_block_size < 0:
        raise ValueError(f"{n['sparse_block_size']} must be >= 0, got {sparse_block_size}")
    if sparsity_factor < 1:
        raise ValueError(f"{n['sparsity_factor']} must be >= 1, got {sparsity_factor}")
    if block_size % sparsity_factor != 0:
        raise ValueError(f"{n['sparsity_factor']} ({sparsity_factor}) must divide {n['block_size']} ({block_size})")
    if sparsity_type == "none" or sparse_block_size == 0:
        return
    step = block_size // sparsity_factor
    if sparse_block_size < step:
        raise ValueError(
            f"{n['sparse_block_size']} ({sparse_block_size}) must be >= {n['block_size']} / "
            f"{n['sparsity_factor']} ({step}) when sparse attention is on (or use "
            f"{n['sparsity_type']}=none / {n['sparse_block_size']}=0)"
        )
    if sparsity_type in ("norm", "lsh") and sparsity_factor > 1:
        # these types select/merge tokens inside chunks of c = min(bs, sbs) tokens
        c = min(block_size, sparse_block_size)
        if block_size % c != 0 or c % sparsity_factor != 0:
            raise ValueError(
                f"{n['sparsity_type']}={sparsity_type} works on chunks of min({n['block_size']}, "
                f"{n['sparse_block_size']}) = {c} tokens, which must divide {n['block_size']} "
                f"({block_size}) and be a multiple of {n['sparsity_factor']} ({sparsity_factor})"
            )
    if sparsity_type == "lsh" and lsh_num_pre_rounds < 0:
        raise ValueError(f"{n['lsh_num_pre_rounds']} must be >= 0, got {lsh_num_pre_rounds}")
