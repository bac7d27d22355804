"""benchmarks/layer_probe.py, one attention layer eager against captured (issue 33's next GPU
reading): its harness on CPU, where a CUDA graph cannot be captured and says so in its row."""

import json

import pytest
import torch

from conftest import load_script

pytestmark = pytest.mark.usefixtures("single_thread")

probe = load_script("benchmarks/layer_probe.py", "layer_probe")


def args(**kw):
    base = dict(length=256, dim=64, heads=4, warmup=0, repeat=1, variants=["model", "cuda_graph"])
    return type("Args", (), {**base, **kw})


@pytest.mark.parametrize("name", ["lsg_whole", "led_whole"])
def test_the_layer_runs_the_path_asked_for_and_a_graph_needs_cuda(name):
    seen = []
    part = probe.run_path(name, args(), "cpu", torch.float32, lambda p: seen.append(len(p["rows"])))
    model, graph = part["rows"]
    assert seen == [1, 2] and model["status"] == "ok" and model["path_ran"] == "whole"
    if not torch.cuda.is_available():
        assert graph["status"] == "error" and "CUDA graphs need a CUDA device" in graph["error"]


def test_the_compiled_layer_computes_the_same():
    part = probe.run_path("led_whole", args(variants=["model", "compiled"]), "cpu", torch.float32)
    compiled = part["rows"][1]
    assert compiled["status"] == "ok" and compiled["diff"] <= 1e-5  # float32: the same function


def test_profile_dir_gets_each_paths_op_table_and_the_record_its_times(tmp_path, monkeypatch):
    """--profile-dir: every path's rows timed first, then each path's model call profiled: host time
    and aten calls a call in the record (no device time on CPU), the ops by host time in
    profile_layer_<path>.txt, and the report's table of them."""
    events = []
    for name in ("time_variants", "host_profile"):
        original = getattr(probe, name)
        monkeypatch.setattr(probe, name, lambda *a, _f=original, _n=name, **kw: events.append(_n) or _f(*a, **kw))
    out = tmp_path / "layer.json"
    argv = ["--device", "cpu", "--dtype", "fp32", "--length", "256", "--dim", "64", "--heads", "4", "--warmup", "0"]
    argv += ["--repeat", "1", "--paths", "lsg_whole", "led_whole", "--variants", "model", "--out", str(out)]
    probe.main(argv + ["--profile-dir", str(tmp_path), "--profile-calls", "2"])
    assert events == ["time_variants", "time_variants", "host_profile", "host_profile"]
    result = json.loads(out.read_text())
    for part in result["paths"]:
        pr = part["profile"]
        assert pr["calls"] == 2 and pr["host_ms"] > 0 and pr["device_ms"] == 0 and pr["aten_ops"] > 10
        table = (tmp_path / f"profile_layer_{part['path']}.txt").read_text()
        assert "aten::addmm" in table and "Self CPU" in table
    text = probe.markdown(result)
    assert "| led_whole | " in text.split("under the profiler")[1]
    probe.main(argv)
    without = json.loads(out.read_text())
    assert all("profile" not in part for part in without["paths"]) and "under the profiler" not in probe.markdown(
        without
    )


def test_cli_refuses_what_it_cannot_run(tmp_path, capsys):
    for argv, needle in (
        (["--length", "500"], "--length must be a multiple of 128"),
        (["--device", "cpu", "--variants", "cuda_graph", "model"], "the first must be model"),
    ):
        with pytest.raises(SystemExit) as e:
            probe.main(argv + ["--out", str(tmp_path / "l.json")])
        assert e.value.code == 2 and needle in capsys.readouterr().err
    assert not list(tmp_path.iterdir())
