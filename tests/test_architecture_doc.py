"""ARCHITECTURE.md's layer table is the rule tests/test_layers.py enforces (its ``LAYERS``), row for
row; and the comparison does fail on a table that drifted."""

import os
import re

from conftest import REPO_ROOT
from test_layers import LAYERS

DOC = os.path.join(REPO_ROOT, "ARCHITECTURE.md")
# | 3 | `lsg_fairseq.models` | what lives there |
ROW = re.compile(r"^\|\s*(\d+)\s*\|\s*`([\w.]+)`\s*\|")


def layer_table(text: str) -> list:
    """[(prefix, layer)] of the table under the "## Layers" heading, in the document's order."""
    section = text.split("\n## Layers\n", 1)[1].split("\n## ", 1)[0]
    return [(m.group(2), int(m.group(1))) for m in map(ROW.match, section.splitlines()) if m]


def drift(text: str) -> list:
    """How the document's table differs from LAYERS (empty: it does not)."""
    table = layer_table(text)
    missing = [row for row in LAYERS if row not in table]
    extra = [row for row in table if row not in LAYERS]
    out = [f"in LAYERS, not in ARCHITECTURE.md: {row}" for row in missing]
    out += [f"in ARCHITECTURE.md, not in LAYERS: {row}" for row in extra]
    if not out and table != LAYERS:
        out.append("same rows, another order than LAYERS")
    return out


def read_doc() -> str:
    with open(DOC, encoding="utf-8") as f:
        return f.read()


def test_the_layer_table_is_layers():
    assert layer_table(read_doc()) == LAYERS, "\n".join(drift(read_doc()))


def test_the_comparison_can_fail():
    """A row removed, a prefix renamed, a layer renumbered: each is caught and named."""
    text = read_doc()
    assert drift(text) == []
    removed = text.replace("| 1 | `lsg_fairseq.checkpoint_io` |", "| 1 | checkpoint_io (gone) |")
    assert drift(removed) == ["in LAYERS, not in ARCHITECTURE.md: ('lsg_fairseq.checkpoint_io', 1)"]
    renamed = text.replace("`lsg_fairseq.quantize`", "`lsg_fairseq.quantise`")
    assert drift(renamed) == [
        "in LAYERS, not in ARCHITECTURE.md: ('lsg_fairseq.quantize', 3)",
        "in ARCHITECTURE.md, not in LAYERS: ('lsg_fairseq.quantise', 3)",
    ]
    renumbered = text.replace("| 6 | `lsg_fairseq.cli` |", "| 5 | `lsg_fairseq.cli` |")
    assert layer_table(renumbered) != LAYERS and drift(renumbered)
