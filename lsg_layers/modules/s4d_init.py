"""S4D's initialisation range of the step size dt, the one home of its default.

Each channel's ``log dt`` is drawn uniformly in ``[log DT_MIN, log DT_MAX]`` (S4D, Gu et al. 2022,
section 4; the LOCOST reference's values): channels then cover time scales from ~10 to ~1,000
tokens. Read by the layer (``modules.s4d``: ``S4DKernel`` / ``S4D`` keyword defaults) and by the
``locost_*`` architectures (``--ssm-dt-min`` / ``--ssm-dt-max``).
"""

DT_MIN = 1e-3
DT_MAX = 1e-1
