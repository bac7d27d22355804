"""S4D's configuration: the initialisation range of the step size dt, the state size's rule and the
kernel generator's product modes, the one home of their defaults and of their checks.

Each channel's ``log dt`` is drawn uniformly in ``[log DT_MIN, log DT_MAX]`` (S4D, Gu et al. 2022,
section 4; the LOCOST reference's values): channels then cover time scales from ~10 to ~1,000
tokens. Read by the layer (``modules.s4d``: ``S4DKernel`` / ``S4D`` keyword defaults) and by the
``locost_*`` architectures (``--ssm-dt-min`` / ``--ssm-dt-max``).

:func:`check_ssm_config` and :func:`check_kernel_product` are called wherever these values arrive:
the layers' constructors, the ``locost_*`` flags and model build, and the converter (an HF config's
``d_state``).
"""

from typing import Callable, Optional

from lsg_layers.ops.ssm import PRODUCT_MODES

# the layers' default real state size N (d_state); the locost_* archs set their own
D_STATE = 64
DT_MIN = 1e-3
DT_MAX = 1e-1


def check_ssm_config(
    d_state: int, dt_min: float = DT_MIN, dt_max: float = DT_MAX, name: Optional[Callable[[str], str]] = None
) -> None:
    """Raise ``ValueError`` for an S4D state size or dt range the layer cannot honour; ``name`` maps
    an argument name to how the caller calls it (a flag, a config field), as in the messages."""
    n = name or str
    if d_state < 2 or d_state % 2:
        raise ValueError(
            f"{n('d_state')} must be even and >= 2 (got {d_state}): the real state is stored as "
            "d_state/2 complex-conjugate modes"
        )
    if not 0 < dt_min <= dt_max:
        raise ValueError(f"need 0 < {n('dt_min')} <= {n('dt_max')} (got {dt_min}, {dt_max})")


def check_kernel_product(
    product: str, kernel_compile: bool = True, name: Optional[Callable[[str], str]] = None
) -> None:
    """Raise ``ValueError`` for a kernel product mode that is not one of ``ops.ssm.PRODUCT_MODES``,
    or that is not fp32 without the fused generator (``kernel_compile``), the only one that honours
    it; ``name`` as in :func:`check_ssm_config`."""
    n = name or str
    if product not in PRODUCT_MODES:
        raise ValueError(f"must be one of {', '.join(PRODUCT_MODES)}, got {product!r}")
    if product != "fp32" and not kernel_compile:
        raise ValueError(f"{n('kernel_product')} {product} is a mode of the fused generator: add {n('kernel_compile')}")
