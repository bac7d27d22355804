"""benchmarks/compile_counts.py: the compiled layers' graphs counted call by call, tabulated."""

import json

import pytest

from conftest import load_script, needs_compiled_layers

pytestmark = [pytest.mark.usefixtures("single_thread"), needs_compiled_layers()]

compile_counts = load_script("benchmarks/compile_counts.py", "compile_counts")


def test_graphs_are_counted_call_by_call(tmp_path):
    out = tmp_path / "graphs.md"
    argv = ["--arch", "led", "--modes", "enc", "--repeat", "2", "--lengths", "256", "320", "256"]
    compile_counts.main(argv + ["--dynamic", "true", "--out", str(out)])
    rows = {(r["mode"], r["dynamic"]): r for r in json.loads(out.with_suffix(".json").read_text())["rows"]}
    assert set(rows) == {("enc", "static"), ("train", "true")}
    static, lengths = rows["enc", "static"], rows["train", "true"]
    assert static["lengths"] == [256] * 2 and lengths["lengths"] == [256, 320, 256]
    # one length: every graph in the first calls; a new length compiles LED's layers again, a length
    # seen before does not
    assert 0 < static["graphs"][0] == static["graphs"][-1]
    first, new, again = lengths["graphs"]
    assert 0 < first < new == again
    assert "| led | train | true | 256, 320, 256 |" in out.read_text()


def test_out_must_be_markdown(tmp_path):
    with pytest.raises(SystemExit):
        compile_counts.main(["--out", str(tmp_path / "graphs.txt")])
