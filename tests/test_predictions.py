"""benchmarks/predictions.py and predictions.json: the predictions written before a GPU reading,
judged against it in the GPU report."""

import json
import os

import pytest

from conftest import REPO_ROOT, load_script

predictions = load_script("benchmarks/predictions.py", "predictions")
report = load_script("benchmarks/gpu_check_report.py", "gpu_check_report")


def test_every_prediction_names_a_record_the_check_makes_and_a_range():
    said = predictions.load()
    stages = {tag for tag, _ in report.BENCH_STAGES} & set(
        load_script("benchmarks/gpu_targets.py", "gpu_targets").RECORD_STAGES
    )
    with open(os.path.join(REPO_ROOT, "benchmarks", "gpu_check.sh")) as f:
        script = f.read()
    assert said["rows"] and said["made_after"]
    for p in said["rows"]:
        assert p["stage"] in stages and p["mode"] in ("enc", "train", "gen"), p
        line = next(line for line in script.splitlines() if line.startswith(f"stage {p['stage']} "))
        block = script[script.index(line) :].split("\nstage ")[0]  # the stage's command, continuation lines too
        for array in ("COMPILED", "BATCHED"):  # a stage's flags in an array: the GPU branch's (its first)
            if f'"${{{array}[@]}}"' in block:
                block += " " + script.split(f"{array}=(")[1].split(")")[0]
        archs = block.split("--arch")[1]
        if '"${PATH_ARCHS[@]}"' in archs:  # the paths stage: the archs of the GPU branch's array
            archs = script.split("PATH_ARCHS=(")[1].split(")")[0]
        assert f" {p['arch']}" in f" {archs}", p
        assert f" {p['mode']}" in block.split("--modes")[1].split("--")[0], p
        low, high = p["ms"]
        assert 0 < low <= high and p["said"] and p["from"], p


def write_stage(work, stage, records):
    with open(os.path.join(work, f"{stage}.json"), "w") as f:
        json.dump({"records": records, "runs": []}, f)


SAID = {
    "made_after": "abc",
    "rows": [
        {"stage": "enc", "arch": "linear", "mode": "enc", "length": 16384, "ms": [3.6, 4.4], "said": "~4", "from": "x"},
        {"stage": "enc", "arch": "led", "mode": "enc", "length": 16384, "ms": [7.2, 8.2], "said": "~8", "from": "x"},
        {"stage": "enc", "arch": "bart", "mode": "enc", "length": 16384, "ms": [1, 2], "said": "~1.5", "from": "x"},
        {"stage": "enc", "arch": "lsg_norm", "mode": "enc", "length": 16384, "ms": [1, 2], "said": "~1.5", "from": "x"},
        {"stage": "gen16k", "arch": "led", "mode": "gen", "length": 16384, "ms": [900, 950], "said": "~1", "from": "x"},
    ],
}


@pytest.mark.parametrize("linear_ms, verdict", [(3.6, "held"), (4.4, "held"), (4.41, "wrong"), (3.5, "wrong")])
def test_a_range_holds_its_ends(tmp_path, linear_ms, verdict):
    write_stage(
        tmp_path,
        "enc",
        [dict(arch="linear", mode="enc", length=16384, status="ok", device="cuda", median_s=linear_ms / 1e3)],
    )
    (row, measured, got), *_ = predictions.judge(str(tmp_path), SAID)
    assert got == verdict, measured


def test_wrong_says_by_how_much_and_missing_records_say_why(tmp_path):
    write_stage(
        tmp_path,
        "enc",
        [
            dict(arch="linear", mode="enc", length=16384, status="ok", device="cuda", median_s=3e-3),
            dict(arch="led", mode="enc", length=16384, status="ok", device="cuda", median_s=16.4e-3),
            dict(arch="bart", mode="enc", length=16384, status="out of memory", device="cuda"),
            dict(arch="lsg_norm", mode="enc", length=16384, status="ok", device="cpu", median_s=1.5e-3),
        ],
    )
    got = [(measured, verdict) for _, measured, verdict in predictions.judge(str(tmp_path), SAID)]
    assert got == [
        ("3 ms (0.83x the range's low end)", "wrong"),
        ("16.4 ms (2.00x the range's high end)", "wrong"),
        ("enc: bart enc 16K: out of memory", "not measured"),
        ("enc: lsg_norm enc 16K ran on cpu", "not measured"),
        ("gen16k: not run", "not measured"),
    ]


def test_the_report_judges_a_later_reading_not_the_one_the_predictions_came_from(tmp_path):
    said = predictions.load()
    for commit, judged in ((said["made_after"], False), ("later", True)):
        with open(tmp_path / "env.json", "w") as f:
            json.dump({"commit": commit}, f)
        result = report.build(str(tmp_path))
        assert len(result["predictions"]["rows"]) == len(said["rows"])
        md = report.markdown(result, str(tmp_path))
        assert "## Predictions for this reading" in md
        assert ("| stage: row | before | predicted | measured | verdict | from |" in md) == judged


def test_an_earlier_reading_judged_by_the_current_predictions():
    """The second reading (49a7388) against the current predictions: a row of every stage it ran
    found (it ran no `paths`, no compiled and no batched stages: those rows, and only those, are not
    measured); `extra4k`'s linear encoder at 4K (1.82 ms) inside its range."""
    work = os.path.join(REPO_ROOT, "benchmarks", "results", "h200_49a7388", "gpu_check")
    judged = predictions.judge(work, predictions.load())
    missing = {p["stage"] for p, _, verdict in judged if verdict == "not measured"}
    later = {"paths", "compiled16k", "compiled4k", "train16k_b4"}  # stages it did not run
    assert missing <= later and all(m == f"{p['stage']}: not run" for p, m, _ in judged if p["stage"] in later)
    linear4k = next(m for p, m, v in judged if (p["stage"], p["arch"], p["mode"]) == ("extra4k", "linear", "enc"))
    assert linear4k == "1.82 ms"
