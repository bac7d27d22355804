"""benchmarks/run.py --smoke (the suite's plumbing, not its speed) and scripts/plot_attention_pattern.py.

No timing is asserted anywhere (speed targets live in the benchmark's own report as ratios).
"""
import importlib.util
import json
import os
import subprocess
import sys

import pytest
import torch

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def load(path, name):
    spec = importlib.util.spec_from_file_location(name, os.path.join(REPO_ROOT, path))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def is_png(path):
    with open(path, "rb") as f:
        return f.read(8) == PNG_MAGIC and os.path.getsize(path) > 1000


def test_benchmark_smoke_writes_every_record_and_output(tmp_path):
    proc = subprocess.run([sys.executable, os.path.join(REPO_ROOT, "benchmarks", "run.py"), "--smoke",
                           "--out", str(tmp_path), "--tag", "smoke"],
                          capture_output=True, text=True, cwd=REPO_ROOT, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    with open(tmp_path / "smoke.json") as f:
        result = json.load(f)
    records = result["records"]
    expected = {("bart", m) for m in ("enc", "train", "gen")} | {("lsg_norm", m) for m in ("enc", "train", "gen")} \
        | {("led", m) for m in ("enc", "train", "gen")} | {("locost", m) for m in ("enc", "train", "gen")} \
        | {("linear", "enc"), ("linear", "train"), ("locost_cold", "enc"), ("locost_ckpt", "train"),
           ("lsg_norm_int8", "enc"), ("led_int8", "enc")}
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
    md = (tmp_path / "smoke.md").read_text()
    assert "| lsg_norm |" in md and "Encoder forward" in md and "Growth exponents" in md
    assert is_png(tmp_path / "smoke_time.png") and is_png(tmp_path / "smoke_memory.png")


def _rec(arch, mode, length, s, mib, status="ok"):
    return {"arch": arch, "mode": mode, "length": length, "median_s": s, "activations_mb": mib,
            "peak_mb": mib + 800, "status": status}


def test_ratio_cells_and_issue_13_targets():
    run = load("benchmarks/run.py", "bench_run")
    records = [_rec("bart", "enc", 4096, 4.0, 240), _rec("linear", "enc", 4096, 2.0, 200),
               _rec("lsg_norm", "enc", 4096, 2.4, 300), _rec("led", "enc", 4096, 2.7, 280),
               _rec("bart", "train", 16384, 150.0, 8000), _rec("lsg_norm", "train", 16384, 70.0, 4000),
               _rec("led", "train", 16384, 80.0, 5000),
               _rec("locost", "train", 16384, 0.0, 0.0, status="died (exit code -9; out of memory?)")]
    assert run._time_cell(records, records[2]) == "2.4 (0.60x bart, 1.20x lin)"
    assert run._time_cell(records, records[1]) == "2 (0.50x bart)"
    assert run._time_cell(records, records[0]) == "4 (2.00x lin)"
    checks = {t: (v, ok) for t, v, ok in run.target_checks(records)}
    assert checks["`lsg_norm` encoder forward at 4K <= 1.25x `linear`"] == ("2.40 s / 2.00 s = 1.20x", "met")
    assert checks["`led` encoder forward at 4K <= 1.25x `linear`"][1] == "MISSED"  # 1.35x
    assert checks["`lsg_norm` fwd+bwd at 16K, peak above the weights <= 0.6x `bart`"][1] == "met"  # 0.50x
    assert checks["`led` fwd+bwd at 16K, peak above the weights <= 0.6x `bart`"][1] == "MISSED"  # 0.62x
    died = checks["`locost` fwd+bwd at 16K without activation checkpointing completes within 16 GB"]
    assert died == ("died (exit code -9; out of memory?)", "MISSED")
    assert not any("16K" in t and "led" in t and "enc" in t for t in checks)  # nothing measured there
    md = run.tables_markdown(records)
    assert "| lsg_norm | 2.4 (0.60x bart, 1.20x lin) |  |" in md  # columns 4,096 and 16,384
    assert "| led |  | 5,000 (0.62x bart) [5,800] |" in md  # memory: ratio, then the absolute peak


def test_growth_exponent_fit():
    run = load("benchmarks/run.py", "bench_run")
    assert run.slope([(1024, 1.0), (4096, 16.0), (16384, 256.0)]) == pytest.approx(2.0)
    assert run.slope([(1024, 3.0), (4096, 12.0)]) == pytest.approx(1.0)
    assert run.slope([(1024, 3.0)]) is None


@pytest.fixture(scope="module")
def plot():
    return load("scripts/plot_attention_pattern.py", "plot_attention_pattern")


def lsg_args(plot, *flags):
    return plot.parse_args(["--out", "unused.png", "--length", "256", "--block-size", "16",
                            "--sparse-block-size", "16", "--heads", "2", "--dim", "16", *flags])


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
        expect[G + lo:G + hi] = plot.LOCAL
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
    args = plot.parse_args(["--model", "led", "--out", "unused.png", "--length", "200",
                            "--attention-window", "40", "--global-positions", "0,150",
                            "--heads", "2", "--dim", "16"])
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
    proc = subprocess.run([sys.executable, os.path.join(REPO_ROOT, "scripts", "plot_attention_pattern.py"),
                           "--length", "128", "--block-size", "16", "--sparse-block-size", "16",
                           "--sparsity-type", "pooling", "--out", str(out)],
                          capture_output=True, text=True, cwd=REPO_ROOT, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert is_png(out)
    assert "48 local" in proc.stdout and "1 global" in proc.stdout
