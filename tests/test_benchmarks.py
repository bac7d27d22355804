"""benchmarks/run.py --smoke (the suite's plumbing, not its speed) and scripts/plot_attention_pattern.py.

No timing is asserted anywhere (speed targets live in the benchmark's own report as ratios).
"""

import contextlib
import importlib.util
import json
import shutil
import os
import subprocess
import sys

import pytest
import torch

from conftest import load_script as load
from conftest import needs_compiled_layers

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def is_png(path):
    with open(path, "rb") as f:
        return f.read(8) == PNG_MAGIC and os.path.getsize(path) > 1000


def test_benchmark_smoke_writes_every_record_and_output(tmp_path):
    proc = subprocess.run(
        [
            sys.executable,
            os.path.join(REPO_ROOT, "benchmarks", "run.py"),
            "--smoke",
            "--out",
            str(tmp_path),
            "--tag",
            "smoke",
        ],
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    with open(tmp_path / "smoke.json") as f:
        result = json.load(f)
    records = result["records"]
    every_mode = ("bart", "lsg_norm", "linear", "led", "locost")
    expected = {(a, m) for a in every_mode for m in ("enc", "train", "gen")} | {
        ("lsg_pooling", "enc"),
        ("lsg_pooling", "train"),  # a secondary LSG type: train at --train-every-arch-at
        ("locost_cold", "enc"),
        ("locost_ckpt", "train"),
    }
    int8 = importlib.util.find_spec("lsg_fairseq.quantize") is not None
    if int8:  # the int8 archs join the default list once lsg_fairseq.quantize exists
        expected |= {("lsg_norm_int8", "enc"), ("led_int8", "enc")}
    assert {(r["arch"], r["mode"]) for r in records} == expected
    for r in records:
        assert r["status"] == "ok", r
        assert r["length"] == 256 and r["device"] == "cpu"
        assert r["median_s"] > 0 and len(r["times_s"]) >= 1
        assert r["peak_mb"] > 0 and r["activations_mb"] >= 0 and r["params"] > 0
    gen = [r for r in records if r["mode"] == "gen"]
    assert all(r["new_tokens"] == 8 and r["new_tokens_per_s"] > 0 for r in gen)  # min = max length
    for arch in ("locost", "locost_cold"):
        locost = next(r for r in records if (r["arch"], r["mode"]) == (arch, "enc"))
        assert 0 < locost["ssm_conv_s"] and 0 < locost["ssm_proj_s"]
        assert 0 <= locost["ssm_kernel_s"] and locost["ssm_kernel_s"] + locost["ssm_conv_s"] < locost["ssm_total_s"]
    cold = next(r for r in records if (r["arch"], r["mode"]) == ("locost_cold", "enc"))
    assert cold["ssm_kernel_s"] > 0  # the cold arch really generates kernels in the timed call
    warm = next(r for r in records if (r["arch"], r["mode"]) == ("locost", "enc"))
    assert warm["ssm_kernel_s"] == 0.0  # ... and the default one found them in its cache
    run = result["runs"][-1]
    assert run["threads"] == 1 and len(run["load_average_start"]) == 3
    if int8:  # quantized linear weights are no longer parameters
        params = {r["arch"]: r["params"] for r in records if r["mode"] == "enc"}
        assert params["lsg_norm_int8"] < params["lsg_norm"] and params["led_int8"] < params["led"]
    md = (tmp_path / "smoke.md").read_text()
    assert "| lsg_norm |" in md and "Encoder forward" in md and "Growth exponents" in md
    assert "x bart, " in md and "x lin)" in md  # ratio cells
    assert "| 13 |" in md and "not measured" in md  # issue 13's targets need 4K/16K records
    assert is_png(tmp_path / "smoke_time.png") and is_png(tmp_path / "smoke_memory.png")


def test_growth_exponent_fit():
    report = load("benchmarks/report.py", "bench_report")
    assert report.slope([(1024, 1.0), (4096, 16.0), (16384, 256.0)]) == pytest.approx(2.0)
    assert report.slope([(1024, 3.0), (4096, 12.0)]) == pytest.approx(1.0)
    assert report.slope([(1024, 3.0)]) is None


def test_int8_arch_without_the_quantize_module_fails_alone(tmp_path, monkeypatch):
    """Where lsg_fairseq.quantize does not exist, run.py still imports and an int8 arch asked for
    by name is recorded as failed (the other archs of the run are unaffected)."""
    run = load("benchmarks/run.py", "bench_run")
    args = run.parse_args(["--smoke", "--arch", "lsg_norm_int8"])
    monkeypatch.setitem(sys.modules, "lsg_fairseq.quantize", None)  # import -> ModuleNotFoundError
    with pytest.raises(ImportError):
        run.build_model("lsg_norm_int8", 256, args)
    assert run.modes_of("lsg_norm_int8", 256, args) == {"enc"}
    assert run.modes_of("led_int8", 16384, run.parse_args([])) == {"enc"}


def test_int8_script_times_run_rows(tmp_path):
    """benchmarks/int8.py's speed part builds run.py's rows (their tiny archs here) and records fp32
    against int8 for each, with the int8 encoder close to the fp32 one."""
    int8 = load("benchmarks/int8.py", "bench_int8")
    argv = ["--arch-size", "tiny", "--parts", "a", "--lengths", "256", "--repeat", "1", "--threads", "1"]
    int8.main([*argv, "--out", str(tmp_path)])
    result = json.loads((tmp_path / "int8.json").read_text())
    assert [(r["arch"], r["length"]) for r in result["speed"]] == [("lsg_norm", 256), ("led", 256)]
    for row in result["speed"]:
        assert row["fp32_s"] > 0 and row["int8_s"] > 0 and row["encoder_out"]["rel_l2"] < 0.1
    model, _ = int8.build("lsg_norm", 256, "tiny")
    assert model.encoder.layers[0].self_attn.block_size == 128  # run.py's row, not a shape of its own
    assert (tmp_path / "int8.md").stat().st_size > 0


def assert_refused_untouched(call, capsys, prog, table, before, message):
    """``call()`` refuses in one line, ``prog: error: <table>...`` holding ``message``, with exit
    status 2, and leaves the folder as it was: ``table`` holding ``before`` (None: no file at all)."""
    with pytest.raises(SystemExit) as e:
        call()
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"{prog}: error: {table}") and message in err[0], err
    assert sorted(p.name for p in table.parent.iterdir()) == ([] if before is None else [table.name])
    if before is not None:
        assert table.read_bytes() == before


@pytest.mark.parametrize(
    "held, argv, message",
    [
        ("int8", ["--arch-size", "tiny"], "holds measured figures, which a --arch-size tiny run would replace"),
        (
            "int8",
            ["--arch-size", "tiny", "--append"],
            "holds measured figures, which a --arch-size tiny run would merge",
        ),
        ("cpu", ["--report-only"], "not int8.py's table (run.py's table): choose another --out or --tag"),
        ("none", ["--report-only"], "does not exist (--report-only redraws a table int8.py wrote;"),
    ],
)
def test_int8_script_refuses_a_table_of_another_kind(tmp_path, capsys, held, argv, message):
    """int8.py's table is refused as run.py's are (``read_table``, ``refuse_mixed_figures``): here the
    committed measured table under a tiny run, and run.py's table read as its own."""
    table, before = tmp_path / "int8.json", None
    if held != "none":
        shutil.copy(os.path.join(REPO_ROOT, "benchmarks", "results", f"{held}.json"), table)
        before = table.read_bytes()
    int8 = load("benchmarks/int8.py", "bench_int8")
    argv = [*argv, "--parts", "a", "--out", str(tmp_path)]
    assert_refused_untouched(lambda: int8.main(argv), capsys, "int8.py", table, before, message)


def test_full_attention_rows_stop_at_the_full_length_limit():
    """bart and its HF peer are quadratic: neither runs beyond --max-full-length; the others do."""
    run = load("benchmarks/run.py", "bench_run")
    args = run.parse_args(["--max-full-length", "16384"])
    for arch in ("bart", "hf_bart"):
        assert run.skipped(arch, 16384, args) is None and "--max-full-length 16384" in run.skipped(arch, 32768, args)
    for arch in ("linear", "lsg_norm", "led", "locost", "hf_led"):
        assert run.skipped(arch, 65536, args) is None


def test_a_row_forces_its_layer_path(monkeypatch):
    """lsg_norm_flex / led_flex run their model inside forced_path(model, "flex") whatever
    --layer-path says; the other rows take --layer-path (the model is built, the timing stubbed)."""
    run = load("benchmarks/run.py", "bench_run")
    forced = []

    @contextlib.contextmanager
    def spy(model, path):
        forced.append(path)
        yield model

    monkeypatch.setattr(run, "forced_path", spy)
    monkeypatch.setattr(run, "measure_model", lambda *a: {})
    args = run.parse_args(["--smoke", "--layer-path", "whole"])
    for arch in ("lsg_norm_flex", "led_flex", "lsg_norm", "led"):
        run.measure(arch, "enc", 256, args)
    assert forced == ["flex", "flex", "whole", "whole"]
    assert not run.ROWS["lsg_norm_flex"].default and not run.ROWS["led_flex"].smoke  # only when named


def test_gen_rows_prepare_the_model_as_fairseq_generate_does():
    """A gen row's model asks its alignment (last) decoder layer only for attention weights, as
    ``fairseq-generate`` and the hub prepare it (``prepare_for_inference_``); a fresh model asks
    every layer, and the plugin decoder's cross-attention then never takes its fused steps."""
    run = load("benchmarks/run.py", "bench_run")
    bench_models = sys.modules["bench_models"]  # imported by run.py from beside it
    args = run.parse_args(["--smoke", "--arch", "lsg_norm"])
    model, dictionary = run.build_model("lsg_norm", 256, args)
    assert all(layer.need_attn for layer in model.decoder.layers)
    bench_models.make_step(model, dictionary, "gen", 256, args, torch.device("cpu"))
    assert not any(layer.need_attn for layer in model.decoder.layers) and not model.training


@needs_compiled_layers()
def test_a_compiled_row_counts_the_graphs_its_timed_calls_compiled():
    """What the GPU check's compiled rows rely on (``--warmup 2``), counted rather than assumed: LSG's
    training step compiles graphs in its first two calls (the second finds its block tables cached),
    so after one warm-up call the timed calls compile, after two they do not."""
    run = load("benchmarks/run.py", "bench_run")
    args = run.parse_args(["--smoke", "--arch", "lsg_norm", "--compile-layers", "--compile-backend", "aot_eager"])
    counts = {}
    for warmup in (1, 2):
        args.warmup, args.repeat = warmup, 2
        counts[warmup] = run.measure("lsg_norm", "train", 256, args, readings=False)["graphs_compiled_while_timed"]
    assert counts[1] > 0 and counts[2] == 0, counts


COLD_ROWS = """
import sys
sys.path.insert(0, "benchmarks")
import processes, run

def child(conn, args):
    before = set(sys.modules)
    run.measure("lsg_norm", "train", 256, args, readings=False)
    conn.send(sorted(m for m in set(sys.modules) - before if m.startswith("torch._dynamo")))

args = run.parse_args(["--smoke", "--arch", "lsg_norm", "--modes", "enc"])
run.measure("lsg_norm", "enc", 256, args, readings=False)
assert "torch._dynamo" not in sys.modules, "an encoder row imported the compiler"
args = run.parse_args(["--smoke", "--arch", "lsg_norm", "--modes", "enc", "train"])
recv, proc = processes._start_child(args, child, args)
imported = recv.recv()
proc.join()
assert "torch._dynamo" in sys.modules and imported == [], imported
"""


def test_a_row_imports_no_compiler_it_does_not_use():
    """Without --compile-layers an encoder row never imports torch._dynamo (seconds of imports, and
    its memory counted in the row's peak on a CPU); a training row imports it at its first backward
    (torch.utils.checkpoint), so a parent that forks rows imports it once, before the first child."""
    r = subprocess.run([sys.executable, "-c", COLD_ROWS], cwd=REPO_ROOT, timeout=120, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-2000:]


def test_every_arch_trains_at_16k_in_the_default_suite():
    run = load("benchmarks/run.py", "bench_run")
    args = run.parse_args([])
    for arch in args.arch:
        modes = run.modes_of(arch, 16384, args)
        assert "train" in modes or arch in ("locost_cold", "lsg_norm_int8", "led_int8"), arch
    assert run.modes_of("lsg_lsh", 4096, args) == {"enc"}  # secondary types: enc only elsewhere
    assert run.modes_of("linear", 1024, args) == {"enc", "train", "gen"}
    assert run.modes_of("lsg_lsh", 16384, run.parse_args(["--train-every-arch-at"])) == {"enc"}


# ---------------------------------------------------------------------------------- report.py
@pytest.fixture(scope="module")
def report():
    return load("benchmarks/report.py", "bench_report")


def rec(arch, mode, length, s=1.0, act=100.0, peak=None, status="ok", **extra):
    if status != "ok":
        return {"arch": arch, "mode": mode, "length": length, "status": status}
    return dict(
        {
            "arch": arch,
            "mode": mode,
            "length": length,
            "status": "ok",
            "median_s": s,
            "activations_mb": act,
            "peak_mb": peak if peak is not None else act + 800.0,
        },
        **extra,
    )


def test_cells_show_ratios_to_bart_and_linear(report):
    records = [
        rec("bart", "enc", 4096, 4.16, 240),
        rec("linear", "enc", 4096, 2.07, 214),
        rec("lsg_norm", "enc", 4096, 3.08, 335, peak=1143),
        rec("led", "enc", 65536, 60.4, 2837),
        rec("linear", "enc", 65536, 35.7, 2133),
        rec("lsg_norm", "gen", 4096, 12.6, 364, new_tokens_per_s=10.2),
        rec("bart", "gen", 4096, 13.6, 256, new_tokens_per_s=9.4),
    ]
    r = {(x["arch"], x["mode"], x["length"]): x for x in records}
    assert report.time_cell(records, r["lsg_norm", "enc", 4096]) == "3.08 (0.74x bart, 1.49x lin)"
    assert report.memory_cell(records, r["lsg_norm", "enc", 4096]) == "335 (1.40x bart, 1.57x lin) / 1,143"
    assert report.time_cell(records, r["bart", "enc", 4096]) == "4.16 (2.01x lin)"  # not its own ratio
    assert report.time_cell(records, r["linear", "enc", 4096]) == "2.07 (0.50x bart)"
    assert report.time_cell(records, r["led", "enc", 65536]) == "60.4 (1.69x lin)"  # no bart at 64K
    assert report.time_cell(records, r["lsg_norm", "gen", 4096]) == "12.6 (0.93x bart), 10.2 tok/s"
    md = report.tables_markdown(records + [rec("lsg_lsh", "enc", 4096, status="died (exit code -9)")])
    assert "| lsg_norm | 3.08 (0.74x bart, 1.49x lin) |  |" in md and "| lsg_lsh | died (exit code -9) |  |" in md


def test_targets_met_missed_and_not_measured(report, tmp_path):
    records = [
        rec("linear", "enc", 4096, 2.0),
        rec("lsg_norm", "enc", 4096, 2.4),  # 1.20x: met
        rec("linear", "enc", 16384, 8.0),
        rec("lsg_norm", "enc", 16384, 12.0),  # 1.50x: missed
        rec("led", "enc", 4096, 2.6, 300),
        rec("led", "enc", 16384, status="died (exit code -9; out of memory?)"),
        rec("bart", "train", 16384, 150, 8000),
        rec("lsg_norm", "train", 16384, 60, 4000),  # 0.50x: met
        rec("led", "train", 16384, 70, 6000),  # 0.75x: missed
        rec("locost", "enc", 16384, 18.0, 900, peak=1900),  # 1.86 GiB: met; 2.25x linear: met
        rec("locost", "train", 16384, status="died (exit code -9; out of memory?)"),  # missed
    ]
    checks = report.target_checks(records)
    v = {c["target"]: c["verdict"] for c in checks}
    assert v["`lsg_norm` encoder forward at 4K <= 1.25x `linear`"] == "MET"
    assert v["`lsg_norm` encoder forward at 16K <= 1.25x `linear`"] == "MISSED"
    assert v["`led` encoder forward at 4K <= 1.25x `linear`"] == "MISSED"  # 1.30x
    assert v["`led` encoder forward at 16K <= 1.25x `linear`"] == "not measured"  # its record failed
    assert v["`lsg_norm` forward+backward peak memory above the weights at 16K <= 0.6x `bart`'s"] == "MET"
    assert v["`led` forward+backward peak memory above the weights at 16K <= 0.6x `bart`'s"] == "MISSED"
    assert v["`locost` encoder forward at 16K: peak RSS <= 2.0 GB"] == "MET"
    assert v["`locost` encoder forward at 16K <= 2.284x `linear` (the ratio before: 20.4 s / 8.93 s)"] == "MET"
    locost_train = next(c for c in checks if c["target"].startswith("`locost` forward+backward at 16K"))
    assert locost_train["verdict"] == "MISSED" and "died" in locost_train["measured"]
    assert v["LOCOST 262,144 tokens encoder forward within 16 GB peak RSS"] == "not measured"
    assert [c["issue"] for c in checks[:9]] == [13] * 9
    led16 = next(c for c in checks if c["target"] == "`led` encoder forward at 16K <= 1.25x `linear`")
    assert "died" in led16["measured"]
    assert not any("0.3" in c["target"] or "14 s" in c["target"] for c in checks)  # the dropped ones
    # the same through run.py --report-only, from a JSON
    with open(tmp_path / "syn.json", "w") as f:
        json.dump({"runs": [], "records": records}, f)
    run = load("benchmarks/run.py", "bench_run")
    run.main(["--report-only", "--out", str(tmp_path), "--tag", "syn", "--no-plots"])
    md = (tmp_path / "syn.md").read_text()
    assert "| 13 | `lsg_norm` encoder forward at 4K <= 1.25x `linear` | 2.40 s / 2.00 s = 1.20x | MET |" in md
    assert "| 13 | `lsg_norm` encoder forward at 16K <= 1.25x `linear` | 12.00 s / 8.00 s = 1.50x | MISSED |" in md
    assert json.loads((tmp_path / "syn.json").read_text())["targets"] == checks


def test_a_gpu_run_gets_no_cpu_targets(report, tmp_path):
    """Issue 13's targets are a CPU's: on a CUDA run's records the report judges none of them (it
    once did, on the card's figures) and says where that run's targets are judged."""
    cpu = [rec("linear", "enc", 4096, 2.0), rec("lsg_norm", "enc", 4096, 2.4)]
    cuda = [dict(r, device="cuda:0") for r in cpu]
    assert [c["verdict"] for c in report.target_checks(cpu)][:1] == ["MET"]
    assert report.target_checks(cuda) == []
    with open(tmp_path / "gpu.json", "w") as f:
        json.dump({"runs": [], "records": cuda}, f)
    run = load("benchmarks/run.py", "bench_run")
    run.main(["--report-only", "--out", str(tmp_path), "--tag", "gpu", "--no-plots"])
    md = (tmp_path / "gpu.md").read_text()
    assert report.CUDA_TARGETS in md and "| 13 |" not in md
    assert json.loads((tmp_path / "gpu.json").read_text())["targets"] == []


def test_report_only_renders_the_committed_cpu_json(tmp_path):
    """Records from before the int8 and linear-train rows, and a JSON from before run.py wrote the
    rows' display metadata, still render (``--report-only``): in the order its runs asked for them,
    with the registry's rows' metadata."""
    shutil.copy(os.path.join(REPO_ROOT, "benchmarks", "results", "cpu.json"), tmp_path / "cpu.json")
    with open(tmp_path / "cpu.json") as f:
        old = json.load(f)
    assert "rows" not in old
    run = load("benchmarks/run.py", "bench_run")
    run.main(["--report-only", "--out", str(tmp_path), "--no-plots"])
    md = (tmp_path / "cpu.md").read_text()
    assert "### Targets" in md and "| 13 |" in md and "x lin)" in md
    first_table = md.split("### Encoder forward")[1].split("\n\n")[2]
    asked = old["runs"][0]["config"]["arch"]
    enc = [a for a in asked if any(r["arch"] == a and r["mode"] == "enc" for r in old["records"])]
    assert [line.split(" | ")[0][2:] for line in first_table.splitlines()[2:]] == enc
    rows = {r["arch"]: r for r in json.loads((tmp_path / "cpu.json").read_text())["rows"]}
    assert list(rows) == asked and rows["bart"]["growth"].startswith("-> 2") and rows["lsg_lsh"]["line"] == "dashed"
    assert rows["locost_cold"]["family"] == "locost" and rows["linear"]["family"] is None


def _kind(smoke: bool, path, batch=None):
    """The committed CPU table, its runs marked as smoke runs or not (and run at ``batch``)."""
    with open(os.path.join(REPO_ROOT, "benchmarks", "results", "cpu.json")) as f:
        table = json.load(f)
    for run in table["runs"]:
        run.setdefault("config", {})["smoke"] = smoke
        if batch is not None:
            run["config"]["batch"] = batch
    path.write_text(json.dumps(table))
    return path.read_bytes()


@pytest.mark.parametrize(
    "held, argv, message",
    [
        ("gpu_check", [], "not run.py's table (gpu_check.sh's report): choose another --out or --tag"),
        ("gpu_check", ["--append"], "not run.py's table (gpu_check.sh's report): choose another --out or --tag"),
        ("gpu_check", ["--report-only"], "not run.py's table (gpu_check.sh's report): choose another --out or --tag"),
        ("truncated", [], "not run.py's table (not JSON: Unterminated string starting at, line 1)"),
        ("measured", ["--smoke"], "holds measured figures, which a --smoke run would replace: choose another --out"),
        ("measured", ["--smoke", "--append"], "holds measured figures, which a --smoke run would merge into"),
        ("smoke", ["--append"], "holds --smoke figures, which a measured run would merge into: choose another --out"),
        ("batch4", ["--append"], "holds rows at batch 4, which a --batch 1 run would merge into: choose another"),
        ("batch4", ["--append", "--batch", "2"], "holds rows at batch 4, which a --batch 2 run would merge into"),
        (
            "none",
            ["--report-only"],
            "does not exist (--report-only redraws a table run.py wrote; --out and --tag name it)",
        ),
    ],
)
def test_a_table_of_another_kind_is_refused_before_anything_runs(tmp_path, capsys, held, argv, message):
    """``<tag>.json`` is run.py's table, measured or smoke: another writer's file there (gpu_check.sh
    writes ``cuda.json`` into ``benchmarks/results`` too), or the other kind of figures, is refused in
    one line before anything is measured, and the file is left as it was."""
    table, before = tmp_path / "t.json", None
    if held == "gpu_check":
        shutil.copy(os.path.join(REPO_ROOT, "benchmarks", "results", "cuda.json"), table)
        before = table.read_bytes()
    elif held == "truncated":
        before = _kind(False, table)[:1000]
        table.write_bytes(before)
    elif held == "batch4":
        before = _kind(False, table, batch=4)
    elif held != "none":
        before = _kind(held == "smoke", table)
    run = load("benchmarks/run.py", "bench_run")
    argv = argv + ["--out", str(tmp_path), "--tag", "t", "--no-plots", "--arch", "linear"]
    assert_refused_untouched(lambda: run.main(argv), capsys, "run.py", table, before, message)


def test_a_table_of_its_own_kind_is_replaced_and_written_whole(tmp_path, monkeypatch):
    """The refusals above leave a table's own kind of run alone (a smoke run replaces a smoke table);
    the JSON and the markdown are replaced together or not at all (a run that fails while writing
    them leaves the last table whole)."""
    run = load("benchmarks/run.py", "bench_run")
    _kind(True, tmp_path / "cpu.json")
    argv = ["--smoke", "--out", str(tmp_path), "--no-plots", "--arch", "linear", "--modes", "enc"]
    run.main(argv)
    table = json.loads((tmp_path / "cpu.json").read_text())
    assert [(r["arch"], r["mode"], r["status"]) for r in table["records"]] == [("linear", "enc", "ok")]
    assert len(table["runs"]) == 1 and table["runs"][0]["config"]["smoke"]
    before = {name: (tmp_path / name).read_bytes() for name in ("cpu.json", "cpu.md")}

    def fails(*a, **kw):
        raise RuntimeError("killed while writing")

    monkeypatch.setattr(run.report, "report_markdown", fails)
    with pytest.raises(RuntimeError):
        run.main(argv)
    assert {name: (tmp_path / name).read_bytes() for name in before} == before
    assert sorted(os.listdir(tmp_path)) == ["cpu.json", "cpu.md"]


def test_report_needs_no_torch():
    code = "import sys; sys.path.insert(0, 'benchmarks'); import report; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, check=True, timeout=60)


def test_report_shows_the_rows_it_is_given(report):
    """Order, expected growth and plot style come from the rows run.py writes; an arch they lack gets
    the defaults, after them."""
    records = [rec(a, "enc", n, s=n / 1024, act=n / 64) for a in ("zeta", "alpha", "old") for n in (1024, 4096)]
    rows = [
        {"arch": "zeta", "growth": "2", "line": "dashed", "color": "gold"},
        {"arch": "alpha", "growth": "1", "line": "solid", "color": None},
    ]
    assert [g["arch"] for g in report.growth_rows(records, rows)] == ["zeta", "alpha", "old"]
    assert [g["expected"] for g in report.growth_rows(records, rows)] == ["2", "1", "1"]
    md = report.tables_markdown(records, rows)
    assert md.index("| zeta |") < md.index("| alpha |") < md.index("| old |")
    runs = [{"started": "t", "load_average_start": None, "config": {"arch": ["old", "zeta"]}}]
    assert report.display_order(records, runs) == ["old", "zeta", "alpha"]  # asked first, then the records'
    md = report.report_markdown(records, runs, [], [])  # no rows: the order the runs asked
    assert md.index("| old |") < md.index("| zeta |") < md.index("| alpha |")


def test_rows_without_a_colour_get_one_no_other_row_has(report):
    records = [rec(a, "enc", 1024) for a in ("linear", "hf_bart", "lsg_norm", "hf_led")]
    rows = [{"arch": "linear", "color": "tab:gray"}, {"arch": "lsg_norm", "color": "tab:purple"}]
    color = report.colors(report.row_table(records, rows))
    assert color["linear"] == "tab:gray" and color["lsg_norm"] == "tab:purple"
    assert len(set(color.values())) == 4 and None not in color.values()


def test_the_registry_is_the_only_source_of_rows(monkeypatch):
    """A family registered here (no edit to run.py) brings its rows: in the default and --smoke
    lists as its rows say, with its own vocabulary, modes and length limit; its argv gets the
    rows' settings (a BenchSettings from run.py's flags), never run.py's namespace."""
    from lsg_fairseq.convert import registry
    from lsg_fairseq.convert.registry import BenchRow, BenchSettings

    monkeypatch.setattr(registry, "_FAMILIES", dict(registry.families()))  # the registry as it was, after
    seen = []

    @registry.register_family
    class ToyBench(registry.Family):
        name = "toy_bench"

        def benchmarks(self):
            def argv(length, settings):
                seen.append(settings)
                return ["bart_tiny", "--max-source-positions", str(max(length, 1024))]

            return {
                "toy_wide": BenchRow(argv, vocab=1234, modes=("enc", "train"), full_attention=True, color="gold"),
                "toy_quiet": BenchRow(argv, smoke=False),
            }

    run = load("benchmarks/run.py", "bench_run_registry")
    smoke = run.parse_args(["--smoke"])
    assert "toy_wide" in smoke.arch and "toy_quiet" not in smoke.arch and "lsg_norm" in smoke.arch
    args = run.parse_args([])
    assert {"toy_wide", "toy_quiet"} <= set(args.arch)
    assert run.modes_of("toy_wide", 1024, args) == {"enc", "train"}
    assert run.modes_of("toy_quiet", 1024, args) == {"enc", "train", "gen"}
    assert run.skipped("toy_wide", 32768, args) and not run.skipped("toy_quiet", 32768, args)
    model, dictionary = run.build_model("toy_wide", 1024, args)
    assert len(dictionary) == 1234 and model.encoder.embed_tokens.num_embeddings == 1234
    assert len(run.build_model("toy_wide", 256, smoke)[1]) == 100  # --smoke: every row's tiny vocabulary
    assert all(type(s) is BenchSettings for s in seen) and seen[-1].smoke and seen[-1].block_size == 32
    (row,) = run.display_rows([rec("toy_wide", "enc", 1024)], [], args)
    assert row == {"arch": "toy_wide", "family": "toy_bench", "growth": "1", "line": "solid", "color": "gold"}

    @registry.register_family
    class Upstart(registry.Family):  # after toy_bench in the registry's order
        name = "upstart"

        def benchmarks(self):
            return {"toy_wide": BenchRow(lambda length, settings: ["bart_tiny"])}

    with pytest.raises(ValueError, match="row 'toy_wide' of the upstart family is the toy_bench family's"):
        run.family_rows()


def test_bench_settings_are_run_flags_with_the_same_defaults():
    """Each BenchSettings field is a run.py flag of the same name, defaulting to the field's default."""
    import dataclasses

    from lsg_fairseq.convert.registry import BenchSettings

    run = load("benchmarks/run.py", "bench_run")
    args = run.parse_args([])
    assert run.bench_settings(args) == BenchSettings()
    flags = vars(args)
    assert all(flags[f.name] == f.default for f in dataclasses.fields(BenchSettings))


@pytest.fixture(scope="module")
def plot():
    return load("scripts/plot_attention_pattern.py", "plot_attention_pattern")


def lsg_args(plot, *flags):
    return plot.parse_args(
        [
            "--out",
            "unused.png",
            "--length",
            "256",
            "--block-size",
            "16",
            "--sparse-block-size",
            "16",
            "--heads",
            "2",
            "--dim",
            "16",
            *flags,
        ]
    )


def test_lsg_local_only_pattern_is_the_block_window(plot):
    args = lsg_args(plot, "--sparsity-type", "none", "--num-global-tokens", "2")
    attn = plot.build_attention(args)
    G, bs = 2, 16
    queries = [G + 0, G + 100, G + 255]
    cats = plot.pattern(args, attn, queries)
    for row, q in zip(cats, queries):
        b = (q - G) // bs
        expect = torch.full((G + 256,), plot.NONE)
        lo, hi = max(0, (b - 1) * bs), min(256, (b + 2) * bs)
        expect[G + lo : G + hi] = plot.LOCAL
        expect[:G] = plot.GLOBAL
        assert torch.equal(row, expect)
    glob = plot.pattern(args, attn, [0])[0]
    assert (glob == plot.GLOBAL).all()  # a global query sees every key


@pytest.mark.parametrize("stype,per_entry", [("stride", 1), ("pooling", 4), ("norm", 1)])
def test_lsg_sparse_keys_lie_outside_the_local_window(plot, stype, per_entry):
    args = lsg_args(plot, "--sparsity-type", stype)
    attn = plot.build_attention(args)
    row = plot.pattern(args, attn, [1 + 128])[0]  # a middle block: both sparse windows in range
    assert (row == plot.LOCAL).sum() == 3 * 16
    # 2 * sbs sparse entries, each standing for per_entry tokens (one head)
    assert (row == plot.SPARSE).sum() == 2 * 16 * per_entry
    sparse = torch.nonzero(row == plot.SPARSE).flatten() - 1
    assert ((sparse < 112) | (sparse >= 160)).all()


def test_led_pattern_is_the_band_plus_globals(plot):
    args = plot.parse_args(
        [
            "--model",
            "led",
            "--out",
            "unused.png",
            "--length",
            "200",
            "--attention-window",
            "40",
            "--global-positions",
            "0,150",
            "--heads",
            "2",
            "--dim",
            "16",
        ]
    )
    attn = plot.build_attention(args)
    cats = plot.pattern(args, attn, [3, 100, 150])
    j = torch.arange(200)
    for row, q in zip(cats[:2], [3, 100]):
        band = (j - q).abs() <= 20
        assert torch.equal(row == plot.LOCAL, band & (j != 0) & (j != 150))
        assert torch.equal(row == plot.GLOBAL, (j == 0) | (j == 150))
    assert (cats[2] == plot.GLOBAL).all()


def test_plot_script_writes_a_png(tmp_path):
    out = tmp_path / "pattern.png"
    proc = subprocess.run(
        [
            sys.executable,
            os.path.join(REPO_ROOT, "scripts", "plot_attention_pattern.py"),
            "--length",
            "128",
            "--block-size",
            "16",
            "--sparse-block-size",
            "16",
            "--sparsity-type",
            "pooling",
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert is_png(out)
    assert "48 local" in proc.stdout and "1 global" in proc.stdout


# ---------------------------------------------------------------------------------- GPU plumbing
CUDA_CALLS = (
    "_lazy_init",
    "init",
    "is_available",
    "device_count",
    "get_device_name",
    "current_device",
    "synchronize",
    "set_device",
)


@pytest.fixture
def run_module(monkeypatch):
    module = load("benchmarks/run.py", "run")
    monkeypatch.setitem(sys.modules, "run", module)  # a spawned child finds its functions by name
    return module


@pytest.fixture
def cuda_booby_trapped(monkeypatch):
    """Every way this process could initialise CUDA raises (spawned children import torch afresh)."""

    def touched(*a, **kw):
        raise AssertionError("the benchmark's parent process called CUDA")

    for name in CUDA_CALLS:
        monkeypatch.setattr(torch.cuda, name, touched)


def test_cuda_measurements_are_spawned_not_forked(run_module):
    args = run_module.parse_args(["--device", "cuda"])
    assert run_module.start_method(args) == "spawn"
    assert run_module.start_method(run_module.parse_args([])) == "fork"
    assert run_module.start_method(run_module.parse_args(["--device", "cuda", "--start-method", "fork"])) == "fork"


def test_parent_never_initialises_cuda(run_module, cuda_booby_trapped, monkeypatch, tmp_path):
    """The whole parent side of a --device cuda run (probe, loop, reports) with CUDA booby-trapped:
    forking a CUDA child from a parent that initialised CUDA fails ('Cannot re-initialize CUDA in
    forked subprocess'), which is how every row of the first GPU run died."""
    seen = []

    def fake_run_one(arch, mode, length, args):
        seen.append(run_module.start_method(args))
        return {
            "arch": arch,
            "mode": mode,
            "length": length,
            "device": "cuda",
            "status": "ok",
            "times_s": [0.1],
            "median_s": 0.1,
            "peak_mb": 10.0,
            "base_mb": 1.0,
            "activations_mb": 9.0,
            "params": 1,
        }

    monkeypatch.setattr(
        run_module, "probe_device", lambda args: {"available": True, "name": "Fake GPU", "torch": "x", "cuda": "13.0"}
    )
    monkeypatch.setattr(run_module, "run_one", fake_run_one)
    run_module.main(
        [
            "--device",
            "cuda",
            "--arch",
            "bart",
            "linear",
            "--modes",
            "enc",
            "--lengths",
            "1024",
            "--out",
            str(tmp_path),
            "--tag",
            "t",
            "--no-plots",
        ]
    )
    assert seen == ["spawn", "spawn"]
    with open(tmp_path / "t.json") as f:
        assert json.load(f)["runs"][-1]["device"] == "Fake GPU"


def test_device_probe_runs_in_a_spawned_child(run_module, cuda_booby_trapped, tmp_path, capsys):
    """The real probe (no GPU here): the child finds no CUDA device, the parent exits with one line."""
    with pytest.raises(SystemExit) as exit_info:
        run_module.main(["--device", "cuda", "--arch", "bart", "--out", str(tmp_path), "--no-plots"])
    assert exit_info.value.code == 2
    assert capsys.readouterr().err == "run.py: error: --device cuda: no such device visible to torch\n"


def test_spawned_whole_tensor_and_hf_rows(tmp_path):
    """Measurements in a spawned child (as on a GPU; one for every row, --one-process, as
    benchmarks/gpu_check.sh runs them), the layers' whole-tensor paths forced on CPU, and the HF
    peers' rows (transformers' own BART with SDPA and LED)."""
    proc = subprocess.run(
        [
            sys.executable,
            os.path.join(REPO_ROOT, "benchmarks", "run.py"),
            "--smoke",
            "--arch",
            "lsg_norm",
            "led",
            "locost",
            "hf_bart",
            "hf_led",
            "--modes",
            "enc",
            "--start-method",
            "spawn",
            "--one-process",
            "--layer-path",
            "whole",
            "--out",
            str(tmp_path),
            "--tag",
            "spawned",
            "--no-plots",
        ],
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    with open(tmp_path / "spawned.json") as f:
        result = json.load(f)
    records = {r["arch"]: r for r in result["records"]}
    assert set(records) == {"lsg_norm", "led", "locost", "hf_bart", "hf_led"}
    assert all(r["status"] == "ok" and r["median_s"] > 0 for r in records.values()), records
    assert result["runs"][-1]["layer_path"] == "whole"


@pytest.mark.parametrize("arch", ["linear", "hf_led"])
def test_batch_rows_run_several_sequences_a_call(run_module, arch, monkeypatch):
    """``--batch N``: each call takes N sequences of the length (a fairseq row and an HF peer),
    its record says so, and a generation row counts every sequence's new tokens."""
    args = run_module.parse_args(["--smoke", "--arch", arch, "--batch", "3"])
    shapes = []
    monkeypatch.setattr(torch.nn.Embedding, "forward", _recording(torch.nn.Embedding.forward, shapes))
    rec = run_module.measure(arch, "train", 256, args)
    assert rec["median_s"] > 0 and (3, 256) in shapes
    if arch == "linear":
        (one,) = [r for r in run_module.run_rows([(arch, "gen", 256)], args) if r["status"] == "ok"]
        assert one["batch"] == 3 and one["new_tokens"] == 3 * args.new_tokens


def _recording(forward, shapes):
    def wrapped(self, ids, *a, **kw):
        shapes.append(tuple(ids.shape))
        return forward(self, ids, *a, **kw)

    return wrapped


@pytest.mark.parametrize("arch", ["hf_bart", "hf_led", "locost"])
def test_train_rows_of_the_peers_and_of_the_whole_tensor_path(run_module, arch):
    args = run_module.parse_args(["--smoke", "--arch", arch, "--layer-path", "whole"])
    rec = run_module.measure(arch, "train", 256, args)
    assert rec["median_s"] > 0 and rec["params"] > 0
    assert rec["layer_path"] == ("whole" if arch == "locost" else None)  # the path the layers took


def test_cpu_path_by_head_dim_smoke_times_both_paths(tmp_path):
    """benchmarks/cpu_path_by_head_dim.py --smoke: both attention paths of both layers run and are tabulated."""
    bench = load("benchmarks/cpu_path_by_head_dim.py", "cpu_path_by_head_dim")
    out = tmp_path / "table.md"
    rows = bench.main(["--smoke", "--repeat", "1", "--threads", "1", "--out", str(out)])
    assert sorted(r["layer"] for r in rows) == ["led", "lsg_norm"]
    assert all(r["ratio"] > 0 and r["head"] == 16 for r in rows)
    text = out.read_text()
    assert "--smoke --repeat 1" in text and text.count("| tiny (d 64, 4 heads) | 16 |") == 2


# ---------------------------------------------------------------- the S4D breakdown
def _row(key, device, cpu_us, device_us):
    from types import SimpleNamespace

    from torch.autograd import DeviceType

    return SimpleNamespace(
        key=key, device_type=getattr(DeviceType, device), cpu_time_total=cpu_us, device_time_total=device_us
    )


def test_breakdown_of_a_gpu_trace_with_nested_labels():
    """A CUDA trace as the profiler gives it: host-side rows whose device time includes the kernels
    of nested labels (layer 100 us > kernel 60 + projections 25), and GPU user-annotation rows of the
    same keys that credit each kernel to its innermost label only (layer 15). The split reads the
    host-side rows; the first GPU reading let the annotation rows in and printed a negative conv."""
    rows = [
        _row("s4d.layer", "CPU", 400.0, 100.0),
        _row("s4d.kernel", "CPU", 90.0, 60.0),
        _row("s4d.projection", "CPU", 200.0, 25.0),
        _row("aten::mm", "CPU", 150.0, 25.0),
        _row("s4d.layer", "CUDA", 0.0, 15.0),
        _row("s4d.kernel", "CUDA", 0.0, 60.0),
        _row("s4d.projection", "CUDA", 0.0, 25.0),
    ]
    readings = load("benchmarks/readings.py", "readings")
    split = readings.breakdown_from_rows(rows, cuda=True, total=0.0002)
    assert split["ssm_layer_s"] == pytest.approx(100e-6) and split["ssm_kernel_s"] == pytest.approx(60e-6)
    assert split["ssm_proj_s"] == pytest.approx(25e-6) and split["ssm_conv_s"] == pytest.approx(15e-6)
    assert split["ssm_share"] == pytest.approx(75e-6 / 0.0002)
    cpu = readings.breakdown_from_rows(rows, cuda=False, total=0.001)  # host times on CPU
    assert cpu["ssm_conv_s"] == pytest.approx(110e-6)
    # the rows the first reading used (last one per key wins): a negative conv, now never
    old = {r.key: r.device_time_total for r in rows if r.key.startswith("s4d.")}
    assert old["s4d.layer"] - old["s4d.kernel"] - old["s4d.projection"] < 0
    assert readings.breakdown_from_rows(rows[4:], cuda=True, total=1.0)["ssm_conv_s"] == 0.0


def test_breakdown_of_a_real_cpu_trace_adds_up():
    """A profiled S4D layer (labels nested: kernel and projections inside the layer) on CPU."""
    from lsg_layers.modules.s4d import S4D

    layer = S4D(32, 16).eval()
    layer.kernel_cache_mb = 0  # generate the kernels inside the profiled call
    u = torch.randn(1, 512, 32)

    def step():
        with torch.no_grad():
            return layer(u)

    split = load("benchmarks/readings.py", "readings").ssm_breakdown(layer, step, torch.device("cpu"))
    parts = split["ssm_kernel_s"] + split["ssm_proj_s"] + split["ssm_conv_s"]
    assert split["ssm_kernel_s"] > 0 and split["ssm_proj_s"] > 0 and split["ssm_conv_s"] > 0
    assert parts == pytest.approx(split["ssm_layer_s"]) and split["ssm_layer_s"] <= split["ssm_total_s"]


def test_flex_gradient_check_scales_by_the_model_not_by_each_tensor():
    """The GPU check's gradient comparison (benchmarks/flex_gradcheck.py) on two correct computations:
    the whole-tensor path's gradients in float32 against float64, CPU. An attention's key bias has a
    zero gradient in exact arithmetic, so each tensor's own scale compares rounding noise with noise
    (the first GPU reading's 1.5-2.8); the model's scale passes them and still catches a real error."""
    check = load("benchmarks/flex_gradcheck.py", "flex_gradcheck")
    torch.manual_seed(0)
    model = check.build(check.CASES["lsg_norm"]).eval()
    single = check.run(model, "whole", "cpu", True)[2]
    double = check.run(model.double(), "whole", "cpu", True)[2]
    per_tensor = max(check.rel_max(single[n].double(), g) for n, g in double.items())
    worst, where = check.gradient_difference({n: g.double() for n, g in single.items()}, double)
    assert per_tensor > 1 and "k_proj.bias" in max(double, key=lambda n: check.rel_max(single[n].double(), double[n]))
    assert worst < check.TOLERANCE and where in double
    wrong = dict(double)
    name = "encoder.layers.0.self_attn.v_proj.weight"
    wrong[name] = double[name] * 1.01  # a 1% error in one attention's gradient
    assert check.gradient_difference(wrong, double)[0] > check.TOLERANCE
    assert check.gradient_difference(wrong, double)[1] == name


# ------------------------------------------------------------------------------ ab_commits.sh's table
def _ab_rounds(root, commit, seconds_by_round):
    """round<r>.json as run.py writes them: {arch: median seconds} per round."""
    os.makedirs(root / commit, exist_ok=True)
    for r, by_arch in enumerate(seconds_by_round, 1):
        records = [
            {"arch": a, "mode": "enc", "length": 16384, "status": "ok", "median_s": s} for a, s in by_arch.items()
        ]
        records.append({"arch": "led", "mode": "enc", "length": 16384, "status": "oom", "median_s": None})
        (root / commit / f"round{r}.json").write_text(json.dumps({"records": records}))


def test_ab_report_judges_each_change_against_the_old_commits_spread(tmp_path):
    """Ratios to linear per round; the tolerance is 5% unless the old rounds spread more; a row that
    moved beyond it says NO; rows that did not run are left out."""
    ab = load("benchmarks/ab_report.py", "ab_report")
    _ab_rounds(tmp_path, "old", [{"linear": 10, "lsg": 12, "locost": 20}, {"linear": 20, "lsg": 24, "locost": 30}])
    _ab_rounds(tmp_path, "new", [{"linear": 10, "lsg": 12.4, "locost": 18}, {"linear": 10, "lsg": 12.4, "locost": 15}])
    rows = ab.read_rounds(str(tmp_path), ("old", "new"), 2)
    got = {
        arch: (round(change, 4), round(tol, 4)) for _, _, arch, _, _, change, tol in ab.comparisons(rows, "old", "new")
    }
    # lsg: 1.2 -> 1.24 (+3.3%), old spread 0: within 5%. locost: old 2.0, 1.5 (spread 0.5/1.75), new 1.8, 1.5
    assert got == {"lsg": (0.0333, 0.05), "locost": (round(1.65 / 1.75 - 1, 4), round(0.5 / 1.75, 4))}
    table = ab.render(rows, "old", "new", 2, 60, "0.1", "0.2", "--modes enc", "cpu")
    assert "| 16384 | enc | lsg | 1.200x (1.200, 1.200) | 1.240x (1.240, 1.240) | +3.3% | 5.0% | yes |" in table
    assert "| 16384 | enc | locost |" in table and "led" not in table
    _ab_rounds(tmp_path, "new", [{"linear": 10, "lsg": 13, "locost": 18}, {"linear": 10, "lsg": 13, "locost": 15}])
    table = ab.render(ab.read_rounds(str(tmp_path), ("old", "new"), 2), "old", "new", 2, 60, "", "", "", "")
    assert "| +8.3% | 5.0% | NO |" in table


def test_ab_report_pairs_each_arch_with_linear_of_the_same_round(tmp_path, capsys):
    """A row that failed in one round is left out of that round only: its other rounds are divided by
    their own round's linear (pairing by position gave 24 / 10 here: +100%, NO). A row that never ran
    in one commit is shown as such, not compared; a missing round file is one line naming it."""
    ab = load("benchmarks/ab_report.py", "ab_report")
    _ab_rounds(tmp_path, "old", [{"linear": 10, "lsg": 12, "locost": 20}, {"linear": 20, "lsg": 24, "locost": 40}])
    _ab_rounds(tmp_path, "new", [{"linear": 10, "locost": 20}, {"linear": 20, "lsg": 24, "locost": 40}])
    table = ab.render(ab.read_rounds(str(tmp_path), ("old", "new"), 2), "old", "new", 2, 60, "", "", "", "")
    assert "| 16384 | enc | lsg | 1.200x (1.200, 1.200) | 1.200x (1.200) | +0.0% | 5.0% | yes |" in table
    _ab_rounds(tmp_path, "new", [{"linear": 10, "locost": 20}, {"linear": 20, "locost": 40}])
    table = ab.render(ab.read_rounds(str(tmp_path), ("old", "new"), 2), "old", "new", 2, 60, "", "", "", "")
    assert "| 16384 | enc | lsg | 1.200x (1.200, 1.200) | did not run | n/a | | not compared |" in table
    with pytest.raises(SystemExit) as e:
        ab.read_rounds(str(tmp_path), ("old", "new"), 3)
    assert str(e.value) == (
        f"ab_report.py: error: {tmp_path / 'old' / 'round3.json'}: No such file or directory "
        "(did round 3 of old finish?)"
    )
    with pytest.raises(SystemExit) as e:
        ab.main([str(tmp_path), "old", "new", "2"])
    assert str(e.value).endswith("ab_report.py: error: expected 9 arguments, got 4")


def test_ab_report_needs_no_torch():
    code = "import sys; sys.path.insert(0, 'benchmarks'); import ab_report; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, check=True, timeout=60)


def test_one_process_times_every_row_before_it_profiles_any(run_module, monkeypatch, tmp_path):
    """--one-process with --profile (and LOCOST's S4D split): all rows timed, then each profiled in a
    model built again, its record sent again with the readings; the times are the first pass's. A
    profiler with CUDA activity stays attached after its block and slows later launches, so no row
    may be timed after another's profile (the fork start method: the child has these patches)."""
    events = tmp_path / "events"

    def logged(name, fn):
        def wrapper(*a, **kw):
            with open(events, "a") as f:
                f.write(f"{name} {a[2]}\n")  # the arch
            return fn(*a, **kw)

        return wrapper

    monkeypatch.setattr(run_module, "measure_model", logged("time", run_module.measure_model))
    monkeypatch.setattr(run_module, "take_readings", logged("read", run_module.take_readings))
    args = run_module.parse_args(
        [
            "--smoke",
            "--arch",
            "linear",
            "locost",
            "--modes",
            "enc",
            "--one-process",
            "--profile",
            "--out",
            str(tmp_path),
        ]
    )
    assert run_module.start_method(args) == "fork"
    records = list(run_module.run_rows([("linear", "enc", 256), ("locost", "enc", 256)], args))
    assert events.read_text().split("\n")[:-1] == ["time linear", "time locost", "read linear", "read locost"]
    assert [(r["arch"], "profile" in r) for r in records] == [
        ("linear", False),
        ("locost", False),
        ("linear", True),
        ("locost", True),
    ]
    timed, read = records[1], records[3]
    assert read["times_s"] == timed["times_s"] and read["status"] == "ok"
    assert 0 <= read["ssm_share"] <= 1 and os.path.exists(read["profile"])


def test_control_row_times_the_first_row_again_last(run_module, monkeypatch, tmp_path):
    """--control-row: after every row is timed, the first is timed again in a model built again and
    its record sent again with ``control`` (its times and the ratio to the first timing); the first
    timing's times stay the record's. Without the flag, or with one row, nothing more is timed."""
    events = tmp_path / "events"
    medians = iter([0.010, 0.020, 0.015])

    def fake(arch, mode, length, args, readings=True):
        with open(events, "a") as f:
            f.write(f"{arch}\n")
        m = next(medians)
        return {"times_s": [m], "median_s": m, "host_share": 0.5}

    monkeypatch.setattr(run_module, "measure", fake)
    argv = ["--smoke", "--arch", "linear", "--modes", "enc", "--one-process", "--out", str(tmp_path)]
    rows = [("linear", "enc", 256), ("led", "enc", 256)]
    records = list(run_module.run_rows(rows, run_module.parse_args(argv + ["--control-row"])))
    assert events.read_text().split() == ["linear", "led", "linear"]
    assert [(r["arch"], "control" in r) for r in records] == [("linear", False), ("led", False), ("linear", True)]
    again = records[2]
    assert again["times_s"] == [0.010] and again["control"]["median_s"] == 0.015
    assert again["control"]["ratio"] == pytest.approx(1.5)

    events.unlink()
    medians = iter([0.010, 0.020, 0.015])
    assert all("control" not in r for r in run_module.run_rows(rows, run_module.parse_args(argv)))
    assert events.read_text().split() == ["linear", "led"]
    events.unlink()
    medians = iter([0.010])
    one = list(run_module.run_rows(rows[:1], run_module.parse_args(argv + ["--control-row"])))
    assert len(one) == 1 and "control" not in one[0]


def test_one_process_rows_not_timed_say_why(run_module, monkeypatch, tmp_path):
    """A child that dies: the rows timed keep their records, the first one not timed says it died,
    the rest that they did not run."""

    def dies(arch, *a, **kw):
        if arch == "locost":
            os._exit(3)
        return {"times_s": [1.0], "median_s": 1.0}

    monkeypatch.setattr(run_module, "measure", dies)
    args = run_module.parse_args(
        ["--smoke", "--arch", "linear", "--modes", "enc", "--one-process", "--out", str(tmp_path)]
    )
    rows = [("linear", "enc", 256), ("locost", "enc", 256), ("led", "enc", 256)]
    records = list(run_module.run_rows(rows, args))
    assert [(r["arch"], r["status"]) for r in records] == [
        ("linear", "ok"),
        ("locost", "died (exit code 3; out of memory?)"),
        ("led", "not run: died (exit code 3; out of memory?) in an earlier row"),
    ]
