"""benchmarks/layer_ops.py: one layer's ops on both devices and the copy forms' times, tabulated."""

import pytest

from conftest import load_script

pytestmark = pytest.mark.usefixtures("single_thread")

layer_ops = load_script("benchmarks/layer_ops.py", "layer_ops")


def test_later_layers_are_counted_on_both_devices(tmp_path):
    out = tmp_path / "ops.md"
    layer_ops.main(["--length", "512", "--copy-lengths", "256", "--rounds", "1", "--out", str(out)])
    rows = {
        line.split("|")[1].strip(): line
        for line in out.read_text().splitlines()
        if line.startswith(("| lsg ", "| led "))
    }
    assert set(rows) == {"lsg", "led"}
    # the GPU's form of the sparse rows (meta) issues gather, the CPU's index_select
    cpu_ops, meta_ops = layer_ops.layer_ops("lsg", 512, "cpu"), layer_ops.layer_ops("lsg", 512, "meta")
    assert cpu_ops[0] > 0 and meta_ops[0] > 0
    assert "| 256 |" in out.read_text() and "x |" in out.read_text()
