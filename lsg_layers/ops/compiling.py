"""What the compiled fast paths share: how many compiled versions of one function dynamo keeps.

Dynamo keeps at most ``recompile_limit`` versions of a compiled function (8 by default) and then
runs it uncompiled, with a warning only. Each new mask_mod, dtype, grad mode or specialised shape
is a version: for FlexAttention the uncompiled run is the dense fallback, every score of every head
materialised (gigabytes per layer at 16K tokens); for S4D's fused kernel generator it is the eager
generator, slower (benchmarks/locost_gpu_notes.md). A conformance run on one card hit the limit in the model's own
flex (the second GPU reading's conformance.log), so the compiled paths raise it when they compile.
"""

import torch

RECOMPILE_LIMIT = 64


def raise_recompile_limit(limit: int = RECOMPILE_LIMIT) -> None:
    """Let dynamo keep ``limit`` compiled versions of a function (never lowers a higher setting)."""
    if torch.compiler.is_compiling():  # inside a compiled caller (dynamo cannot trace a config write)
        return
    from torch import _dynamo

    config, name = _dynamo.config, limit_setting()
    setattr(config, name, max(getattr(config, name), limit))


def limit_setting() -> str:
    """The name of dynamo's setting in this torch: ``recompile_limit``, or on torch 2.6
    ``cache_size_limit`` (an alias of the new name in later versions)."""
    from torch import _dynamo

    return "recompile_limit" if hasattr(_dynamo.config, "recompile_limit") else "cache_size_limit"
