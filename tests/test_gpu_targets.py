"""benchmarks/gpu_targets.py: the GPU issues' targets judged from a GPU check's work folder, on the
readings committed under benchmarks/results (each reading's README judged them by hand) and on
made-up records at the bounds."""

import json
import os

import pytest

from conftest import REPO_ROOT, load_script

targets = load_script("benchmarks/gpu_targets.py", "gpu_targets")
READINGS = os.path.join(REPO_ROOT, "benchmarks", "results")


def judged(work):
    """{target text: (measured, verdict)} of a work folder."""
    return {target: (measured, verdict) for _, target, measured, verdict in targets.checks(work)}


def row(rows, start):
    (key,) = [k for k in rows if k.startswith(start)]
    return rows[key]


def assert_ratios(rows, expected):
    """Each target starting with a key of ``expected`` shows its (ratio, verdict)."""
    for start, (ratio, verdict) in expected.items():
        measured, got = row(rows, start)
        assert f"**{ratio}**" in measured and got == verdict, (start, measured, got)


def test_the_fifth_reading_is_judged_as_its_readme_judged_it():
    """h200_3ad560a/README.md, "Against the issues' targets": four calls' work folders merged, every
    [GPU] target of issues 32 and 33 measured, three of LOCOST's and four of LSG/LED's met."""
    rows = judged(os.path.join(READINGS, "h200_3ad560a", "gpu_check"))
    assert_ratios(
        rows,
        {
            "`locost` encoder at 16K": ("3.51x", targets.MISSED),
            "`locost` encoder at 64K": ("4.51x", targets.MISSED),
            "`locost` fwd+bwd": ("2.57x", targets.MET),
            "`lsg_norm` encoder at 16K": ("1.73x", targets.MISSED),
            "`lsg_norm` encoder at 64K": ("1.75x", targets.MISSED),
            "`lsg_norm` encoder at 4K": ("1.51x", targets.MISSED),
            "`led` encoder at 16K": ("2.01x", targets.MISSED),
            "`led` encoder at 64K": ("1.95x", targets.MISSED),
            "`lsg_norm` fwd+bwd at 16K: time": ("0.91x", targets.MISSED),
            "`led` fwd+bwd at 16K: time": ("1.04x", targets.MISSED),
            "`lsg_norm` fwd+bwd at 16K: memory": ("0.98x", targets.MET),
            "`led` fwd+bwd at 16K: memory": ("0.99x", targets.MET),
        },
    )
    assert row(rows, "`locost` encoder at 600K") == ("locost600k: **1.4 s**, peak **9.1 GiB**", targets.MET)
    assert row(rows, "flex fwd+bwd")[1] == targets.MET
    assert row(rows, "LOCOST's S4D split")[1] == targets.SHOWN
    assert row(rows, "HF BART")[1] == targets.SHOWN
    assert targets.NOT_MEASURED not in {verdict for _, verdict in rows.values()}


def test_the_fourth_reading_is_judged_as_its_readme_judged_it():
    """h200_1817c8f/README.md, "Against the issues' targets", written by hand from the same records."""
    rows = judged(os.path.join(READINGS, "h200_1817c8f", "gpu_check"))
    assert_ratios(
        rows,
        {
            "`locost` encoder at 16K": ("3.33x", targets.MISSED),
            "`locost` encoder at 64K": ("3.85x", targets.MISSED),
            "`lsg_norm` encoder at 16K": ("1.57x", targets.MISSED),
            "`lsg_norm` encoder at 64K": ("1.56x", targets.MISSED),
            "`led` encoder at 16K": ("3.13x", targets.MISSED),
            "`led` encoder at 64K": ("1.62x", targets.MISSED),
            "`lsg_norm` encoder at 4K": ("1.63x", targets.MISSED),
        },
    )
    assert row(rows, "`locost` fwd+bwd")[1] == targets.NOT_MEASURED  # train16k did not run
    assert row(rows, "`locost` fwd+bwd")[0] == "train16k: not run"
    assert row(rows, "HF BART")[1] == targets.SHOWN  # extra4k's hf rows


def test_the_third_reading_shows_both_stages_and_decides_by_the_first():
    """ffab7a7: enc and paths both time the encoders; LED at 16K was 16.5 ms in enc (after a
    profile) and 12.7 ms in paths: both are shown, enc's decides; the flex rows ride along."""
    rows = judged(os.path.join(READINGS, "h200_ffab7a7", "gpu_check"))
    measured, verdict = row(rows, "`led` encoder at 16K")
    assert measured.index("enc (whole)") < measured.index("paths (whole)")
    assert "**2.85x**" in measured and "**2.35x**" in measured and "`led_flex`" in measured
    assert verdict == targets.MISSED
    assert "**0.80x**" in row(rows, "`lsg_norm` fwd+bwd at 16K: time")[0]
    assert "**1.17x**" in row(rows, "`led` fwd+bwd at 16K: time")[0]
    assert "**4.36x**" in row(rows, "`locost` fwd+bwd")[0]
    assert row(rows, "`lsg_norm` fwd+bwd at 16K: memory") == (
        "train16k (whole): 2,592 MiB / 2,655 MiB = **0.98x**; paths (whole): 2,592 MiB / 2,622 MiB = "
        "**0.99x** (`lsg_norm_flex` 0.99x)",
        targets.MET,
    )


def test_the_second_reading_is_judged_as_its_readme_judged_it():
    """49a7388: LOCOST at 600K in 1.56 s, 9,690 MiB peak, and flex_grad on the card met; the ratios
    missed as its README's table has them."""
    rows = judged(os.path.join(READINGS, "h200_49a7388", "gpu_check"))
    for start, ratio in (
        ("`locost` encoder at 16K", "3.49x"),
        ("`locost` encoder at 64K", "4.10x"),
        ("`locost` fwd+bwd", "4.43x"),
        ("`lsg_norm` encoder at 16K", "4.83x"),  # flex was auto's path on CUDA then
        ("`lsg_norm` encoder at 64K", "8.15x"),
        ("`lsg_norm` fwd+bwd at 16K: time", "1.13x"),
        ("`led` fwd+bwd at 16K: time", "1.31x"),
    ):
        assert f"**{ratio}**" in row(rows, start)[0] and row(rows, start)[1] == targets.MISSED
    assert row(rows, "`locost` encoder at 600K") == ("locost600k: **1.56 s**, peak **9.5 GiB**", targets.MET)
    assert row(rows, "flex fwd+bwd")[1] == targets.MET
    assert row(rows, "LOCOST's S4D split")[1] == targets.SHOWN  # fused16k's locost_cold


def write_stage(work, stage, records):
    with open(os.path.join(work, f"{stage}.json"), "w") as f:
        json.dump({"records": records, "runs": []}, f)


def rec(arch, mode, length, seconds=None, mib=1000.0, status="ok", device="cuda", **extra):
    return dict(
        arch=arch, mode=mode, length=length, status=status, device=device, median_s=seconds, activations_mb=mib, **extra
    )


@pytest.mark.parametrize("ms, verdict", [(3.0, targets.MET), (3.01, targets.MISSED)])
def test_a_ratio_at_its_bound_is_met_and_just_past_it_missed(tmp_path, ms, verdict):
    write_stage(tmp_path, "enc", [rec("locost", "enc", 16384, ms / 1e3), rec("linear", "enc", 16384, 1e-3)])
    assert row(judged(str(tmp_path)), "`locost` encoder at 16K")[1] == verdict


def test_the_first_stage_decides_even_when_the_second_disagrees(tmp_path):
    write_stage(tmp_path, "enc", [rec("lsg_norm", "enc", 65536, 1.4), rec("linear", "enc", 65536, 1.0)])
    write_stage(tmp_path, "paths", [rec("lsg_norm", "enc", 65536, 1.2), rec("linear", "enc", 65536, 1.0)])
    measured, verdict = row(judged(str(tmp_path)), "`lsg_norm` encoder at 64K")
    assert "**1.40x**" in measured and "**1.20x**" in measured and verdict == targets.MISSED
    os.remove(tmp_path / "enc.json")  # the second stage decides when the first did not run
    measured, verdict = row(judged(str(tmp_path)), "`lsg_norm` encoder at 64K")
    assert measured == "paths: 1.2 s / 1 s = **1.20x**" and verdict == targets.MET


def test_the_compiled_stages_are_shown_and_never_judge(tmp_path):
    """run.py --compile-layers' rows beside the eager ones: shown with their ratio, marked compiled;
    the eager stage decides, and with no eager stage the target stays not measured."""
    train = [rec("bart", "train", 16384, 0.0868), rec("lsg_norm", "train", 16384, 0.0792)]
    write_stage(tmp_path, "train16k", train)
    compiled = [dict(r, median_s=r["median_s"] / 2, compiled_layers=True, layer_path="whole") for r in train]
    compiled[0]["median_s"] = 0.07
    write_stage(tmp_path, "compiled16k", compiled)
    measured, verdict = row(judged(str(tmp_path)), "`lsg_norm` fwd+bwd at 16K: time")
    assert (
        measured
        == "train16k: 79.2 ms / 86.8 ms = **0.91x**; compiled16k (whole, compiled): 39.6 ms / 70 ms = **0.57x**"
    )
    assert verdict == targets.MISSED
    os.remove(tmp_path / "train16k.json")
    measured, verdict = row(judged(str(tmp_path)), "`lsg_norm` fwd+bwd at 16K: time")
    assert measured.startswith("compiled16k (whole, compiled)") and "train16k: not run" in measured
    assert verdict == targets.NOT_MEASURED


def test_rows_of_several_sequences_a_call_judge_no_target(tmp_path):
    """The targets are at batch 1: a stage's rows at batch 4 (``run.py --batch``) are not a target's
    reading, and say why; a prediction is judged by them all the same."""
    write_stage(tmp_path, "train16k", [rec("bart", "train", 16384, 0.26, batch=4), rec("led", "train", 16384, 0.15)])
    measured, verdict = row(judged(str(tmp_path)), "`led` fwd+bwd at 16K: time")
    assert measured == "train16k: bart train 16K ran at batch 4" and verdict == targets.NOT_MEASURED
    predictions = load_script("benchmarks/predictions.py", "predictions")
    said = {"rows": [{"stage": "train16k", "arch": "bart", "mode": "train", "length": 16384, "ms": [230, 290]}]}
    assert [verdict for _, _, verdict in predictions.judge(str(tmp_path), said)] == [predictions.HELD]


def test_failed_cpu_and_absent_records_are_not_measured_and_say_why(tmp_path):
    write_stage(
        tmp_path,
        "enc",
        [
            rec("locost", "enc", 16384, status="timed out after 240 s"),
            rec("linear", "enc", 16384, 1e-3),
            rec("led", "enc", 16384, 1e-3, device="cpu"),
            rec("linear", "enc", 65536, 1e-3),
        ],
    )
    rows = judged(str(tmp_path))
    assert row(rows, "`locost` encoder at 16K") == ("enc: locost enc 16K: timed out after 240 s", targets.NOT_MEASURED)
    assert row(rows, "`led` encoder at 16K") == ("enc: led enc 16K ran on cpu; paths: not run", targets.NOT_MEASURED)
    assert row(rows, "`locost` encoder at 64K") == ("enc: no locost enc 64K record", targets.NOT_MEASURED)


@pytest.mark.parametrize(
    "seconds, peak_mib, verdict",
    [(3.0, 16 * 1024, targets.MET), (3.1, 9000, targets.MISSED), (1.5, 16 * 1024 + 1, targets.MISSED)],
)
def test_600k_needs_both_its_time_and_its_memory(tmp_path, seconds, peak_mib, verdict):
    write_stage(tmp_path, "locost600k", [rec("locost", "enc", 600000, seconds, peak_mb=peak_mib)])
    assert row(judged(str(tmp_path)), "`locost` encoder at 600K")[1] == verdict


def test_the_gpu_report_carries_the_targets(tmp_path):
    report = load_script("benchmarks/gpu_check_report.py", "gpu_check_report")
    write_stage(tmp_path, "enc", [rec("locost", "enc", 16384, 2e-3), rec("linear", "enc", 16384, 1e-3)])
    result = report.build(str(tmp_path))
    assert result["targets"][0] == {
        "issue": 32,
        "target": "`locost` encoder at 16K: time <= 3x `linear`'s",
        "measured": "enc: 2 ms / 1 ms = **2.00x**",
        "verdict": targets.MET,
    }
    text = report.markdown(result, str(tmp_path))
    assert "## Against the issues' targets" in text
    assert "| 32 | `locost` encoder at 16K: time <= 3x `linear`'s | enc: 2 ms / 1 ms = **2.00x** | met |" in text


@pytest.mark.parametrize(
    "flex, verdict",
    [
        ({"device": "cuda", "backward": True, "tolerance": 1e-4, "all_ok": True}, targets.MET),
        ({"device": "cuda", "backward": True, "tolerance": 1e-4, "all_ok": False}, targets.MISSED),
        ({"device": "cpu", "backward": False, "tolerance": 1e-4, "all_ok": True}, targets.NOT_MEASURED),
    ],
)
def test_the_flex_gradient_check_counts_on_the_card_only(tmp_path, flex, verdict):
    rows = [{"case": "lsg_norm", "gradients": 2e-7 if flex["backward"] else None}]
    with open(tmp_path / "flex_grad.json", "w") as f:
        json.dump(dict(flex, rows=rows), f)
    assert row(judged(str(tmp_path)), "flex fwd+bwd")[1] == verdict
