"""lsg-layers: the long-input attention and state-space layers of lsg-fairseq, without fairseq.

Two sub-packages, lowest first: ``ops`` (pure tensor functions: block and band index arithmetic,
LSG's sparse sequences, the windowed attention kernel, FlexAttention masks, S4D kernel math) and
``modules`` (``torch.nn`` layers built from them: LSG and Longformer self-attention, the S4D layer,
the T5 pieces of LOCOST). Nothing here imports fairseq or ``lsg_fairseq``
(``tests/test_layers.py`` checks it from the source and in a fresh interpreter), so the layers can
be used, tested and read with torch alone. The fairseq plugin (``lsg_fairseq``) wires them into
fairseq models; its old paths ``lsg_fairseq.ops.*`` and ``lsg_fairseq.modules.*`` still import
these same modules. Importing it checks the torch version first (``torch_version.py``).
"""

from lsg_layers import torch_version

torch_version.check()  # one line for a torch older than the floor, before a module fails obscurely
