"""benchmarks/gpu_check.sh, the one command that measures a GPU, run end to end on CPU at tiny sizes
(DEV=cpu) so that it cannot rot while no GPU is at hand; and its report when the time runs out."""

import json
import os
import subprocess
import sys

import pytest
import torch

from conftest import BIN, REPO_ROOT, load_script

from lsg_layers.torch_version import COMPILED_LAYERS_TORCH, at_least

STAGES = [
    "conformance",
    "flex_grad",
    "enc",
    "train_smoke",
    "train16k",
    "train64k_ckpt",
    "locost600k",
    "paths",
    "compiled16k",
    "compiled4k",
    "train16k_b4",
    "layerprobe",
    "convprobe",
    "fused16k",
    "flexprobe",
    "extra4k",
    "peers16k",
    "gen16k",
    "fused16k_tf32",
]


def gpu_check(results, **env):
    full = dict(os.environ, PATH=f"{BIN}:{os.environ['PATH']}", RESULTS=str(results), COMMIT="abc1234", **env)
    return subprocess.run(
        ["bash", "benchmarks/gpu_check.sh"], cwd=REPO_ROOT, env=full, capture_output=True, text=True, timeout=900
    )


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    results = tmp_path_factory.mktemp("gpu_check")
    proc = gpu_check(results, DEV="cpu")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    with open(results / "cuda.json") as f:
        return json.load(f), (results / "cuda.md").read_text()


def test_every_stage_runs_and_is_reported(smoke):
    result, md = smoke
    assert [s["stage"] for s in result["stages"]] == STAGES
    assert all(s["status"] == "ok" for s in result["stages"]), result["stages"]
    env = result["env"]
    assert env["device"] == "cpu" and env["commit"] == "abc1234" and len(env["load_average_start"]) == 3
    assert env["torch"] and env["card"].startswith("CPU: ")
    for heading in (
        "## 1. Conformance",
        "## 2. Encoder forward",
        "## 3. fairseq-train smokes",
        "## 4a. Forward + backward",
        "## 4b. Forward + backward with --checkpoint-activations",
        "## 5f. LOCOST",
    ):
        assert heading in md
    sections = md.split("## Against the issues' targets")[0] + md.split("## 1. Conformance")[1]
    assert "not measured" not in sections
    # the issues' targets are GPU figures: a CPU's records judge none of them
    assert result["targets"] and {t["verdict"] for t in result["targets"]} == {"not measured"}


def test_flex_probe_stage_times_both_patterns(smoke):
    result, md = smoke
    probe = result["flexprobe"]
    assert probe["eager"] and probe["device"] == "cpu"  # the harness only, on a CPU
    for pattern in ("lsg", "led"):
        rows = probe["patterns"][pattern]["rows"]
        assert [r["variant"] for r in rows] == ["model", "all_full"] and all(r["status"] == "ok" for r in rows), rows
    assert "## 5b''. The flex kernel alone" in md and "| all_full |" in md


def test_layer_probe_stage_times_the_layers(smoke):
    result, md = smoke
    parts = result["layerprobe"]["paths"]
    assert [p["path"] for p in parts] == ["lsg_whole", "led_whole"]
    for part in parts:
        model, graph = part["rows"]
        assert model["status"] == "ok" and model["path_ran"] == "whole"
        assert graph["status"] == ("ok" if torch.cuda.is_available() else "error")
        assert part["profile"]["host_ms"] > 0  # the stage profiles each path's model call
    assert "## 5b'. One attention layer alone" in md and "`model` under the profiler" in md


def test_conv_probe_stage_compares_the_variants(smoke):
    result, md = smoke
    rows = result["convprobe"]["lengths"][0]["rows"]
    assert [(r["variant"], r["status"]) for r in rows] == [("model", "ok"), ("transposed", "ok")]
    assert rows[1]["diff"] <= 1e-2  # bf16 outputs of the same float32 math
    assert "## 5a''. LOCOST's S4D layer alone" in md


def test_conformance_stage_compares_with_the_references(smoke):
    conformance = smoke[0]["conformance"]
    assert conformance["all_fp32_within_tolerance"] and conformance["layer_path"] == "whole"
    assert {r["set"] for r in conformance["rows"]} == {"long", "mid", "short"}
    for row in conformance["rows"]:
        assert 0 < row["logits_vs_reference"] <= 1e-4 and 0 < row["enc_vs_cpu"] <= 1e-4  # paths differ a little
        assert 1e-4 < row["bf16_logits_rel_vs_cpu"] < 0.1  # bfloat16 drifts, boundedly
    # the forms a GPU takes against what they replace, measured on the device (here the CPU)
    assert all(r["values"] and r["grads"] for r in conformance["gelu_one_pass"].values())
    rms = conformance["rms_norm_fused"]
    # (exactly 0 on torch 2.6, whose F.rms_norm computes HF's operations on a CPU)
    assert all(r["ok"] for r in rms.values()) and 0 <= rms["bf16"]["values"] <= 2**-7
    sdpa = conformance["decoder_sdpa"]
    assert set(sdpa) == {"cross_step", "t5"} and all(r["ok"] for c in sdpa.values() for r in c.values())
    assert all(0 < c["fp32"]["fused"] <= 1e-5 and 0 < c["bf16"]["fused"] < 0.05 for c in sdpa.values())


def test_flex_stage_compares_with_the_whole_tensor_path(smoke):
    flex = smoke[0]["flex_grad"]
    assert flex["all_ok"] and not flex["backward"]  # CPU: forward only
    assert [(r["case"], r["ran"]) for r in flex["rows"]] == [("led", "flex")]
    assert 0 < flex["rows"][0]["encoder"] <= 1e-4  # two kernels: close, not bitwise


def test_benchmark_stages_measure_every_row_in_one_process(smoke):
    benchmarks = smoke[0]["benchmarks"]
    expected = {
        "enc": {"linear", "bart", "lsg_norm", "led", "locost", "locost_cold"},
        "train64k_ckpt": {"linear", "lsg_norm", "led", "locost"},
        "peers16k": {"hf_bart", "hf_led"},
        "paths": {"lsg_norm", "led", "led_flex"},  # on CUDA: linear and lsg_norm_flex too
        "fused16k": {"bart", "locost", "locost_cold"},
        "train16k_b4": {"lsg_norm", "led"},  # on CUDA: linear and bart too, 4 sequences a call
    }
    for tag, archs in expected.items():
        records = benchmarks[tag]["records"]
        assert {r["arch"] for r in records} == archs and all(r["status"] == "ok" for r in records)
        config = benchmarks[tag]["runs"][-1]["config"]
        assert config["one_process"] and config["dtype"] == "bf16"
    assert benchmarks["train64k_ckpt"]["runs"][-1]["config"]["checkpoint_activations"]
    assert all(r["batch"] == 2 for r in benchmarks["train16k_b4"]["records"])
    assert all(r["batch"] == 1 for r in benchmarks["train16k"]["records"])
    assert benchmarks["fused16k"]["runs"][-1]["config"]["locost_kernel_compile"]
    assert benchmarks["fused16k_tf32"]["runs"][-1]["config"]["locost_kernel_product"] == "tf32"
    # the compiled stages: the layers compiled, and each record says so (one row on a CPU: its plumbing)
    # (the rows the host sets at batch 1: training at 16K, the encoder at 4K)
    for tag, mode in (("compiled16k", "train"), ("compiled4k", "enc")):
        (rec,) = benchmarks[tag]["records"]
        assert (rec["arch"], rec["mode"]) == ("lsg_norm", mode)
        if at_least(COMPILED_LAYERS_TORCH):
            assert rec["status"] == "ok" and rec["compiled_layers"], rec
        else:  # scripts/torch_versions.sh's older torch: the row refused in one line, the stage goes on
            assert rec["status"].startswith("failed: RuntimeError: compiling the encoder layers needs torch >= 2.10")
        assert benchmarks[tag]["runs"][-1]["config"]["compile_layers"]
    # the compiled encoder's output against its eager one (aot_eager on a CPU: the same kernels)
    if at_least(COMPILED_LAYERS_TORCH):
        assert benchmarks["compiled4k"]["records"][0]["compiled_vs_eager"] < 1e-2
        # the smoke times with no warm-up call: its one timed call compiles, and the report says so
        for tag in ("compiled16k", "compiled4k"):
            assert benchmarks[tag]["records"][0]["graphs_compiled_while_timed"] > 0
        assert "**Compiled during the timed calls**" in smoke[1] and "lsg_norm enc 256: " in smoke[1]
    # the _flex rows force flex (forward only on a CPU: their training falls back to whole tensors)
    ran = {(r["arch"], r["mode"]): r["layer_path"] for r in benchmarks["paths"]["records"]}
    assert ran["led_flex", "enc"] == "flex" and ran["led_flex", "train"] == "whole"
    assert ran["lsg_norm", "enc"] != "flex" and ran["led", "enc"] != "flex"
    locost = next(r for r in benchmarks["enc"]["records"] if r["arch"] == "locost")
    assert locost["ssm_conv_s"] >= 0 and 0 < locost["ssm_share"] < 1
    assert locost["ssm_cache_mb"] > 0  # kernels cached in the warm-up: the record says they are in its peak
    cold = next(r for r in benchmarks["enc"]["records"] if r["arch"] == "locost_cold")
    assert 0 < cold["ssm_share"] < 1 and not cold.get("ssm_cache_mb")  # split, every kernel made in the call
    # the host's share of each call (1 on a CPU: the call has run when it returns)
    assert all(0.9 <= r["host_share"] <= 1.0 for r in benchmarks["enc"]["records"])
    # each stage of several rows times its first row again last (--control-row): a drift check
    for tag in expected:
        config = benchmarks[tag]["runs"][-1]["config"]
        (first,) = [r for r in benchmarks[tag]["records"] if "control" in r]
        assert config["control_row"] and first["arch"] == config["arch"][0], tag  # the plan's first row
        assert first["control"]["median_s"] > 0 and first["control"]["ratio"] > 0


def test_the_report_says_how_much_of_each_gpu_call_the_host_took():
    gpu_report = load_script("benchmarks/gpu_check_report.py", "gpu_check_report")

    def rec(arch, length, share, device_name="NVIDIA H200"):
        return dict(
            arch=arch,
            mode="enc",
            length=length,
            median_s=0.01,
            activations_mb=1.0,
            status="ok",
            host_share=share,
            device_name=device_name,
        )

    table = gpu_report.bench_tables([rec("led", 16384, 0.97), rec("linear", 16384, 0.31), rec("linear", 4096, 0.99)])
    assert "Host share of the wall" in table
    assert "linear 4,096 0.99, linear 16,384 0.31, led 16,384 0.97" in table
    cpu = [rec("linear", 4096, 1.0, device_name=None)]
    assert "Host share" not in gpu_report.bench_tables(cpu)


def test_the_report_shows_the_control_row():
    """The first row timed again at the end of its process (run.py --control-row): one line under
    its mode's table with both medians and their ratio; none where no record has a control."""
    gpu_report = load_script("benchmarks/gpu_check_report.py", "gpu_check_report")
    first = dict(arch="linear", mode="enc", length=4096, median_s=0.00362, activations_mb=1.0, status="ok")
    later = dict(first, arch="led", median_s=0.00626)
    assert "timed again" not in gpu_report.bench_tables([first, later])
    controlled = dict(first, control={"median_s": 0.0019, "ratio": 0.0019 / 0.00362, "times_s": [0.0019]})
    table = gpu_report.bench_tables([controlled, later])
    assert "first row timed again after its other rows" in table
    assert "linear 4,096 3.62 -> 1.9 ms (**0.52x**)" in table


def test_train_smokes_fall_and_keep_locost_groups(smoke):
    runs = {(r["arch"], r["precision"]): r for r in smoke[0]["train_smoke"]}
    assert set(runs) == {("locost_tiny", "fp16"), ("lsg_bart_tiny", "bf16")}
    assert all(r["finite"] and r["fell"] and r["updates"] == 4 for r in runs.values())
    locost = runs["locost_tiny", "fp16"]
    assert locost["non_flat_note"]  # --fp16 built per-tensor master copies ...
    assert "grouped_adam: group ssm: 10 tensors, lr x0.1, weight decay 0.0" in locost["groups"]  # ... groups kept


def test_a_check_out_of_time_still_leaves_a_report(tmp_path):
    proc = gpu_check(tmp_path, DEV="cpu", BUDGET_S="20")
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads((tmp_path / "cuda.json").read_text())
    assert [s["stage"] for s in result["stages"]] == STAGES
    assert all(s["status"].startswith("not run: ") for s in result["stages"])
    sections = (tmp_path / "cuda.md").read_text().split("## 1. Conformance")[1]  # after the targets
    assert (
        sections.count("not measured") == 1 + 1 + 1 + 3 + 13
    )  # conformance, flex, smokes, the three probes, benchmarks


def test_stages_selects_what_runs(tmp_path):
    """A device call's time is short: STAGES names the stages to run (a session can skip what an
    earlier reading measured); the others are reported as not selected, and the header says so."""
    proc = gpu_check(tmp_path, DEV="cpu", STAGES="convprobe")  # the cheapest stage: no fairseq import
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads((tmp_path / "cuda.json").read_text())
    status = {s["stage"]: s["status"] for s in result["stages"]}
    assert [s["stage"] for s in result["stages"]] == STAGES
    assert status.pop("convprobe") == "ok"
    assert set(status.values()) == {"not selected (STAGES)"}
    assert result["env"]["stages_selected"] == ["convprobe"]
    md = (tmp_path / "cuda.md").read_text()
    assert "Command: `STAGES='convprobe' benchmarks/gpu_check.sh`" in md
    assert result["convprobe"]["lengths"] and not result["benchmarks"]  # no benchmark stage ran


@pytest.mark.parametrize("group", ["timed", "untimed"])
def test_stage_groups_name_the_timed_and_the_untimed_stages(tmp_path, group):
    """gpu_call.sh runs the timed stages alone on the GPU and the untimed ones (right or wrong, not
    fast or slow) beside other work: the groups are defined once, in gpu_check.sh."""
    proc = gpu_check(tmp_path, DEV="cpu", STAGES=group, BUDGET_S="1")  # nothing fits: selection only
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads((tmp_path / "cuda.json").read_text())
    untimed = ["conformance", "flex_grad", "train_smoke"]
    expected = untimed if group == "untimed" else [s for s in STAGES if s not in untimed]
    assert result["env"]["stages_selected"] == expected
    for s in result["stages"]:
        assert s["status"].startswith("not run: " if s["stage"] in expected else "not selected"), s


def test_a_folder_that_holds_a_check_is_replaced_only_when_asked(tmp_path):
    """RESULTS defaults to benchmarks/results, where the committed reading lies: a check into a folder
    that holds one is refused in one line, that folder untouched; FORCE=1 replaces it as a whole, so
    that no stage file of the earlier check reaches this one's report (it reads every file it finds)."""
    work = tmp_path / "gpu_check"
    work.mkdir()
    held = {
        tmp_path / "cuda.json": '{"env": {"card": "NVIDIA H200"}}',
        tmp_path / "cuda.md": "# GPU check: NVIDIA H200 (cuda)\n",
        work / "stages.tsv": "flexprobe\tok\t108\n",
        work / "flexprobe.json": open(
            os.path.join(REPO_ROOT, "benchmarks/results/h200_1817c8f/gpu_check/flexprobe.json")
        ).read(),
    }
    for path, text in held.items():
        path.write_text(text)
    proc = gpu_check(tmp_path, DEV="cpu", STAGES="untimed", BUDGET_S="1")
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.strip().splitlines() == [
        f"gpu_check.sh: error: RESULTS={tmp_path} holds a check ({tmp_path}/cuda.md): another RESULTS for a new one,"
        " or FORCE=1 to replace it"
    ]
    assert {p: p.read_text() for p in held} == held and sorted(os.listdir(work)) == ["flexprobe.json", "stages.tsv"]
    # an interrupted check (its stages, no report yet) is a check too, and the refusal names what is there
    for report in ("cuda.md", "cuda.json"):
        (tmp_path / report).unlink()
    proc = gpu_check(tmp_path, DEV="cpu", STAGES="untimed", BUDGET_S="1")
    assert proc.returncode == 2 and f"holds a check ({work}/stages.tsv): " in proc.stderr
    assert sorted(os.listdir(work)) == ["flexprobe.json", "stages.tsv"]
    proc = gpu_check(tmp_path, DEV="cpu", STAGES="untimed", BUDGET_S="1", FORCE="1")
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads((tmp_path / "cuda.json").read_text())
    assert result["flexprobe"] is None and not (work / "flexprobe.json").exists()
    assert [s["stage"] for s in result["stages"]] == STAGES and "not measured" in (tmp_path / "cuda.md").read_text()


def test_an_unknown_stage_is_one_line(tmp_path):
    proc = gpu_check(tmp_path, DEV="cpu", STAGES="enc trian16k")
    assert proc.returncode == 2 and not (tmp_path / "cuda.md").exists()
    assert (
        proc.stderr.strip()
        .splitlines()[-1]
        .startswith("gpu_check.sh: error: STAGES: unknown stage 'trian16k' (stages: conformance flex_grad enc ")
    )


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is here: DEV=cuda would run the whole check")
def test_cuda_without_a_gpu_is_one_line(tmp_path):
    proc = gpu_check(tmp_path, DEV="cuda")
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1] == (
        "gpu_check.sh: error: DEV=cuda: torch sees no CUDA GPU here (DEV=cpu runs the tiny check)"
    )


def test_report_needs_no_torch():
    code = "import sys; sys.path.insert(0, 'benchmarks'); import gpu_check_report; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, check=True, timeout=60)


def test_report_refuses_a_mistyped_path_in_one_line(tmp_path, capsys):
    """Redrawing a fetched reading (benchmarks/README.md) with a path mistyped: a usage error naming
    the flag, neither an empty report of no stages nor a traceback from the write."""
    gpu_report = load_script("benchmarks/gpu_check_report.py", "gpu_check_report")
    work = tmp_path / "gpu_check"
    work.mkdir()
    (work / "stages.tsv").write_text("enc\tok\t3\n")
    typo, missing = tmp_path / "gpu_chek", tmp_path / "missing" / "cuda"
    for argv, line in (
        (["--work", str(typo), "--out", str(tmp_path / "cuda")], f"--work {typo}: not a gpu_check.sh work folder"),
        (["--work", str(work), "--out", str(missing)], f"--out {missing}: no folder {missing.parent}"),
    ):
        with pytest.raises(SystemExit) as exit_:
            gpu_report.main(argv)
        assert exit_.value.code == 2 and f"error: {line}" in capsys.readouterr().err
    assert not list(tmp_path.glob("cuda*")) and not missing.parent.exists()
    gpu_report.main(["--work", str(work), "--out", str(tmp_path / "cuda")])  # the folder as it should be
    assert json.loads((tmp_path / "cuda.json").read_text())["stages"][0]["stage"] == "enc"


def test_figures_draw_the_stages_measured_alike(tmp_path):
    """--plot: time and memory against length from the stages measured alike (train64k_ckpt, with
    activation checkpointing, is left out), each arch labelled with the path it ran, in its colour."""
    gpu_report = load_script("benchmarks/gpu_check_report.py", "gpu_check_report")

    def rec(arch, mode, length, seconds, path=None):
        return dict(
            arch=arch,
            mode=mode,
            length=length,
            median_s=seconds,
            activations_mb=length / 512,
            layer_path=path,
            status="ok",
        )

    rows = [dict(arch="linear", color="tab:gray"), dict(arch="lsg_norm", color="tab:blue")]
    stages = {
        "extra4k": [rec("linear", "enc", 4096, 0.002), rec("lsg_norm", "enc", 4096, 0.01, "flex")],
        "enc": [rec("linear", "enc", 16384, 0.005), rec("lsg_norm", "enc", 16384, 0.03, "flex")],
        "train16k": [rec("linear", "train", 16384, 0.04)],
        "train64k_ckpt": [rec("linear", "train", 65536, 0.1)],
    }
    for tag, records in stages.items():
        (tmp_path / f"{tag}.json").write_text(json.dumps({"records": records, "rows": rows, "runs": []}))
    (tmp_path / "stages.tsv").write_text("".join(f"{tag}\tok\t1\n" for tag in stages))  # as gpu_check.sh leaves it
    records, drawn = gpu_report.plot_records(str(tmp_path))
    assert [(r["arch"], r["color"]) for r in drawn] == [("linear", "tab:gray"), ("lsg_norm (flex)", "tab:blue")]
    assert sorted((r["arch"], r["mode"], r["length"]) for r in records) == [
        ("linear", "enc", 4096),
        ("linear", "enc", 16384),
        ("linear", "train", 16384),
        ("lsg_norm (flex)", "enc", 4096),
        ("lsg_norm (flex)", "enc", 16384),
    ]
    gpu_report.main(["--work", str(tmp_path), "--out", str(tmp_path / "cuda"), "--plot"])
    assert (tmp_path / "cuda_time.png").stat().st_size > 0 and (tmp_path / "cuda_memory.png").stat().st_size > 0


def test_gpu_call_dry_run_brings_back_each_calls_files(tmp_path):
    """benchmarks/gpu_call.sh, the GPU session's calls, dry-run on this machine: `check` leaves the
    timed and the untimed reports and their logs in $OUT, `collect` says in one line that there is
    no long_context run, and `more` (the setup kept by `check`) runs further stages."""
    out, work = tmp_path / "out", tmp_path / "work"
    out.mkdir()
    env = dict(os.environ, PATH=f"{BIN}:{os.environ['PATH']}", SETUP="/dev/null", DEV="cpu", OUT=str(out))
    # the cheapest stage of each kind: the calls' orchestration is what this tests
    env.update(GPU_CALL_WORK=str(work), TIMED_STAGES="convprobe", CHECK_STAGES="conformance")

    def call(*args):
        proc = subprocess.run(
            ["bash", "benchmarks/gpu_call.sh", *args], cwd=REPO_ROOT, env=env, capture_output=True, text=True
        )
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
        return proc.stdout

    call("check", "abc1234")
    assert {"cuda.md", "cuda.json", "gpu_check.tgz", "cuda_checks.md", "cuda_checks.json", "gpu_checks.tgz"} <= {
        p.name for p in out.iterdir()
    }
    for name, stage in (("cuda", "convprobe"), ("cuda_checks", "conformance")):
        result = json.loads((out / f"{name}.json").read_text())
        assert result["env"]["commit"] == "abc1234"
        assert [s["stage"] for s in result["stages"] if s["status"] == "ok"] == [stage]
    assert call("collect", "1").startswith("gpu_call.sh: no long_context run to collect")
    call("more", "abc1234", "120", "layerprobe")
    more = json.loads((out / "cuda_more.json").read_text())
    assert [s["stage"] for s in more["stages"] if s["status"] == "ok"] == ["layerprobe"]
