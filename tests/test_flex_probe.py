"""benchmarks/flex_probe.py, the flex kernel in variants (issue 33's next GPU reading): its tables
and its harness, on CPU with flex uncompiled (the kernels themselves are the GPU's to time)."""

import argparse
import os

import pytest
import torch

from conftest import load_script

pytestmark = pytest.mark.usefixtures("single_thread")


probe = load_script("benchmarks/flex_probe.py", "flex_probe")


def args(**kw):
    base = dict(length=384, heads=2, head_dim=16, warmup=0, repeat=1, eager=True)
    return argparse.Namespace(**{**base, **kw})


@pytest.mark.parametrize("pattern", ["lsg", "led"])
def test_all_full_keeps_the_same_tiles_and_none_partial(pattern):
    make = probe.lsg_problem if pattern == "lsg" else probe.led_problem
    _, block_mask = make(1024, 2, 16, "cpu", torch.float32, torch.Generator().manual_seed(0))
    assert int(block_mask.kv_num_blocks.sum()) > 0  # the layer's tables have partial tiles: a real change
    whole = probe.all_full(block_mask)
    assert int(whole.kv_num_blocks.sum()) == 0
    assert torch.equal(whole.to_dense(), block_mask.to_dense())  # the same tiles kept
    assert probe.kept_tiles(whole) == probe.kept_tiles(block_mask)
    # no tensor serves as two tables: on aliased inputs torch 2.11 (the GPU machine's) recompiles
    # flex and fails while logging why (seen with that torch on CPU)
    tables = (whole.kv_num_blocks, whole.kv_indices, whole.full_kv_num_blocks, whole.full_kv_indices)
    assert len({t.untyped_storage().data_ptr() for t in tables}) == len(tables)


def test_every_variant_is_timed_and_the_same_math_agrees():
    part = probe.run_pattern("lsg", probe.LSG_VARIANTS, args(), "cpu", torch.float32)
    rows = {r["variant"]: r for r in part["rows"]}
    assert list(rows) == probe.LSG_VARIANTS
    assert all(r["status"] == "ok" and r["ms"] > 0 for r in rows.values()), part["rows"]
    for name in probe.SAME_MATH - {"model"}:
        assert rows[name]["diff"] <= probe.TOLERANCE, name
    assert rows["model"]["x_model"] == 1.0 and rows["all_full"]["tiles_per_head"] == part["tiles_per_head"]
    band = rows["band"]["tiles_per_head"] / part["query_tiles"]
    assert abs(band - part["tiles_per_head"] / part["query_tiles"]) <= 1.5  # about as many tiles per query tile


def test_a_failing_variant_is_recorded_and_the_others_run(capsys):
    seen = []  # what the caller writes after each row: a probe cut off keeps the rows it measured
    part = probe.run_pattern(
        "led",
        ["model", "no_such_variant", "static"],
        args(),
        "cpu",
        torch.float32,
        lambda p: seen.append(len(p["rows"])),
    )
    assert seen == [1, 2, 3]
    status = [(r["variant"], r["status"]) for r in part["rows"]]
    assert status == [("model", "ok"), ("no_such_variant", "error"), ("static", "ok")]
    assert "ValueError" in part["rows"][1]["error"]


def test_cli_refuses_what_it_cannot_run(tmp_path, capsys):
    for argv, needle in (
        (["--length", "500"], "--length must be a multiple of 128"),
        (["--device", "cuda", "--eager"], "--eager" if torch.cuda.is_available() else "no CUDA GPU"),
    ):
        with pytest.raises(SystemExit) as e:
            probe.main(argv + ["--out", str(tmp_path / "p.json")])
        assert e.value.code == 2 and needle in capsys.readouterr().err
    assert not os.listdir(tmp_path)
