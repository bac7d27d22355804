"""benchmarks/op_count.py: what the host issues for one call of a benchmark row (the counter, and
its command on the smoke rows)."""

import json

import pytest
import torch

from conftest import load_script

pytestmark = pytest.mark.usefixtures("single_thread")

op_count = load_script("benchmarks/op_count.py", "op_count")


def test_the_counter_separates_views_from_launches():
    x = torch.ones(4, 3)
    with op_count.OpCounter() as c:
        y = x.add(1).t().reshape(12)  # add launches; t is a view; reshape of a transposed tensor copies
        y.view(3, 4).sum()
    assert c.ops["add"] == 1 and c.ops["t"] == 1 and c.ops["sum"] == 1
    assert c.launches == sum(c.ops.values()) - sum(c.ops[v] for v in op_count.VIEWS)
    assert c.launches >= 3  # add, the copy of reshape, sum
    assert [name for name, _ in c.top_launches(10)] and all(n not in op_count.VIEWS for n, _ in c.top_launches(10))


def test_smoke_rows_are_counted_on_the_paths_a_gpu_runs(tmp_path):
    out = tmp_path / "ops.md"
    op_count.main(["--smoke", "--arch", "linear", "lsg_norm", "led", "--out", str(out)])
    result = json.loads((tmp_path / "ops.json").read_text())
    rows = {r["arch"]: r for r in result["rows"]}
    assert set(rows) == {"linear", "lsg_norm", "led"} and {r["length"] for r in rows.values()} == {256}
    assert rows["lsg_norm"]["path"] == "whole" and rows["led"]["path"] == "whole"
    # an attention issues more than the four projections that stand in for it in `linear`
    assert rows["linear"]["launches"] < rows["lsg_norm"]["launches"] < rows["lsg_norm"]["ops"]
    text = out.read_text()
    assert "| lsg_norm | enc | 256 | whole |" in text and "1.00x" in text


def test_out_must_be_a_markdown_path(tmp_path, capsys):
    with pytest.raises(SystemExit):
        op_count.main(["--smoke", "--out", str(tmp_path / "ops.txt")])
    assert "--out" in capsys.readouterr().err and not list(tmp_path.iterdir())


def test_gen_counts_one_decoding_step(tmp_path):
    """gen: 2N tokens less N, over N: the encoder and the first steps drop out, so the count is the
    same whatever N (here 2 and 3), and a step reads the device (beam search picks on the host)."""
    counts = {}
    for n in (2, 3):
        out = tmp_path / f"gen{n}.md"
        op_count.main(
            ["--smoke", "--arch", "bart", "--modes", "gen", "--beam", "2", "--step-tokens", str(n), "--out", str(out)]
        )
        (row,) = json.loads(out.with_suffix(".json").read_text())["rows"]
        counts[n] = row
    assert counts[2]["mode"] == "gen" and counts[2]["ops"] > counts[2]["launches"] >= counts[2]["reads"] >= 1
    # a step's count, not the call's: the encoder's layers (6 layer norms and more) are not in it
    assert abs(counts[2]["ops"] - counts[3]["ops"]) <= 0.02 * counts[2]["ops"]
    text = (tmp_path / "gen2.md").read_text()
    assert "| bart | gen | 256 |" in text and "(beam 2)" in text


def test_by_module_splits_a_rows_launches_among_its_modules(tmp_path):
    """--by-module: every launch once, under the innermost module whose forward issued it; the
    backward pass (the lean layers' checkpoint recomputes too, which stop early with their modules'
    forwards unfinished) under OUTSIDE, not under a module left on the stack."""
    out = tmp_path / "ops.md"
    op_count.main(["--smoke", "--arch", "lsg_norm", "--modes", "enc", "train", "--by-module", "--out", str(out)])
    rows = {r["mode"]: r for r in json.loads(out.with_suffix(".json").read_text())["rows"]}
    for row in rows.values():
        modules = dict(row["modules"])
        assert sum(modules.values()) == row["launches"]
        assert modules.get("LSGSelfAttention", 0) > 0
    enc, train = dict(rows["enc"]["modules"]), dict(rows["train"]["modules"])
    assert op_count.OUTSIDE not in enc  # an encoder call is all forwards
    forward = sum(k for name, k in train.items() if name != op_count.OUTSIDE)
    assert train[op_count.OUTSIDE] > forward  # backward issues more than the forward it follows
    assert "Launches by the innermost module" in out.read_text()
