"""The shell scripts' settings (environment knobs and arguments) are checked before any work: a word
where a number goes, 0 updates (fairseq-train reads --max-update 0 as "no limit": it trained without
end), an unknown row, variant or device, a report folder that is a file. Each is one line naming the
knob, exit 2, and nothing written: no OUT made, no results folder that the corrected run would then be
refused for. scripts/lib.sh's whole_numbers, one_of, words_of, known_arch and writable_folder are what they
call."""

import os
import subprocess

import pytest

from conftest import REPO_ROOT

# (script, arguments, environment, what the one line says)
CASES = [
    ("examples/long_context/run.sh", [], {"U_SHORT": "0"}, "U_SHORT=0: expected a whole number >= 1"),
    ("examples/long_context/run.sh", [], {"U_LONG": "abc"}, "U_LONG=abc: expected a whole number >= 1"),
    ("examples/long_context/run.sh", [], {"ARCHS": "lsg_nrom"}, "unknown row 'lsg_nrom'"),
    ("examples/long_context/run.sh", [], {"SMOKE": "yes"}, "SMOKE=yes: expected one of: 0 1"),
    ("examples/long_context/run.sh", [], {"EXTRAPOLATION": "yes"}, "EXTRAPOLATION=yes: expected one of: 0 1"),
    ("examples/long_context/run.sh", [], {"MAX_TOKENS": "-5"}, "MAX_TOKENS=-5: expected a whole number >= 1"),
    ("examples/long_context/run.sh", [], {"THREADS": "two"}, "threads 'two' (THREADS, else OMP_NUM_THREADS)"),
    ("examples/long_context/control.sh", [], {"OMP_NUM_THREADS": "0"}, "threads '0' (THREADS, else OMP_NUM"),
    ("examples/long_context/run.sh", [], {"REPORT_DIR": "{tmp}/a_file"}, "a_file: not a folder"),
    ("examples/long_range/run.sh", [], {"JOBS": "0"}, "JOBS=0: expected a whole number >= 1"),
    ("examples/long_range/run.sh", [], {"VARIANTS": "retreival"}, "VARIANTS: unknown variant 'retreival'"),
    ("examples/long_range/run.sh", [], {"ROWS": "local_8 lsg_nrom"}, "unknown row 'lsg_nrom'"),
    ("examples/long_range/run.sh", [], {"SEEDS": "1 x"}, "SEEDS: 'x' is not a whole number"),
    ("examples/long_range/run.sh", [], {"MIN_KEYS": "3", "MAX_KEYS": "2"}, "MIN_KEYS=3 is above MAX_KEYS=2"),
    ("examples/long_context/control.sh", [], {"U": "abc"}, "U=abc: expected a whole number >= 1"),
    ("scripts/demo.sh", [], {"MAX_UPDATE": "0"}, "MAX_UPDATE=0: expected a whole number >= 1"),
    ("scripts/demo.sh", [], {"DATA": "{tmp}", "BEAM": "four"}, "BEAM=four: expected a whole number >= 1"),
    ("examples/locost/run_small.sh", [], {"PART": "bok"}, "PART=bok: expected one of: all rouge book"),
    ("examples/lsg_summarization/run_small.sh", [], {"N_VALID": "-1"}, "N_VALID=-1: expected a whole number"),
    ("examples/gsg_pretraining/run.sh", [], {"DEVICE": "gpu"}, "DEVICE=gpu: expected auto, cpu or cuda"),
    ("examples/gsg_pretraining/run.sh", [], {"GSG_UPDATES": "0"}, "GSG_UPDATES=0: expected a whole number >= 1"),
    ("examples/gsg_pretraining/run.sh", [], {"ARCH": "lsg_bart_tny"}, "ARCH=lsg_bart_tny: not a model architecture"),
    ("examples/long_context/control.sh", [], {"ROWS": "fan_in_lsg_long bert_lsg"}, "ROWS: unknown 'bert_lsg'"),
    ("examples/long_context/extrapolation_ablation.sh", [], {"ROWS": " "}, "ROWS is empty: expected one or more"),
    ("examples/long_range/regap.sh", ["{tmp}/no_set", "{tmp}/r", "a={tmp}/a_file"], {}, "no_set: no spm/spm.model"),
    ("examples/long_range/regap.sh", ["{tmp}/set", "{tmp}/r", "locost"], {}, "locost: expected ROW=CHECKPOINT"),
    ("examples/long_range/gpu_pilot.sh", [], {}, "usage: gpu_pilot.sh DEST_DIR"),
    ("examples/long_range/gpu_pilot.sh", ["{tmp}/dest"], {"BUDGET_S": "abc"}, "BUDGET_S=abc: expected a whole number"),
    (
        "benchmarks/ab_commits.sh",
        ["HEAD", "HEAD", "abc"],
        {"WORK": "{tmp}/work"},
        "ROUNDS=abc: expected a whole number",
    ),
    ("benchmarks/ab_commits.sh", ["HEAD", "HEAD"], {"WORK": "{tmp}/work", "OUTPUT": "{tmp}/no/ab.md"}, "no folder"),
    (
        "scripts/spm_binarize.sh",
        ["--raw-dir", "{tmp}", "--out-dir", "{tmp}/out", "--vocab-size", "0"],
        {},
        "--vocab-size 0",
    ),
    (
        "scripts/spm_binarize.sh",
        ["--raw-dir", "{tmp}", "--out-dir", "{tmp}/out", "--vocab-size", "8", "--workers", "x"],
        {},
        "--workers x: expected a whole number >= 1",
    ),
    ("scripts/setup_env.sh", [], {"PYTHON": "nope", "VENV": "{tmp}/out"}, "PYTHON=nope: no such command"),
    ("benchmarks/gpu_check.sh", [], {"DEV": "gpu"}, "DEV=gpu: expected cuda or cpu"),
    ("benchmarks/gpu_check.sh", [], {"DEV": "cpu", "BUDGET_S": "10s"}, "BUDGET_S=10s: expected a whole number"),
    ("benchmarks/gpu_check.sh", [], {"DEV": "cpu", "PYTHON": "nope"}, "PYTHON=nope: no such command"),
    ("benchmarks/gpu_call.sh", [], {}, "usage: gpu_call.sh check COMMIT | collect SECONDS | more"),
    ("benchmarks/gpu_call.sh", ["collect", "abc"], {}, "collect SECONDS: 'abc' is not a whole number"),
    ("benchmarks/gpu_call.sh", ["more", "abc1234", "60"], {}, "more: name the stages to run"),
    ("benchmarks/gpu_call.sh", ["check", "abc1234"], {"SETUP": "{tmp}/none.sh"}, "none.sh: no such file"),
    ("benchmarks/gpu_call.sh", ["check", "abc1234"], {"SETUP": "/dev/null", "BUDGET_S": "x"}, "BUDGET_S=x: expected"),
]


@pytest.mark.parametrize("script, args, knobs, message", CASES, ids=[f"{c[0]}-{c[3][:20]}" for c in CASES])
def test_a_bad_setting_is_one_line_before_any_work(tmp_path, script, args, knobs, message):
    (tmp_path / "a_file").write_text("not a folder\n")
    (tmp_path / "device_out").mkdir()
    (tmp_path / "set" / "spm").mkdir(parents=True)  # what regap.sh reads of a set: its model and dictionary
    for name in ("spm.model", "dict.txt"):
        (tmp_path / "set" / "spm" / name).write_text("")
    out, results = tmp_path / "out", tmp_path / "results"
    env = dict(os.environ, DEVICE="cpu", OUT=str(out), RESULTS=str(results), GPU_CALL_WORK=str(tmp_path / "work"))
    env.update({k: v.format(tmp=tmp_path) for k, v in knobs.items()})
    if script.endswith("gpu_call.sh"):
        env["OUT"] = str(tmp_path / "device_out")  # the folder that comes back from a device call
    args = [a.format(tmp=tmp_path) for a in args]
    r = subprocess.run(["bash", script, *args], cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=60)
    name = os.path.basename(script)
    assert r.returncode == 2, r.stdout[-2000:] + r.stderr[-2000:]
    assert r.stderr.startswith(f"{name}: error: ") and message in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and r.stdout == "", r.stdout + r.stderr
    assert not out.exists() and not results.exists() and not (tmp_path / "work").exists()
    assert list((tmp_path / "device_out").iterdir()) == []


def test_the_checks_pass_what_is_right(tmp_path):
    """The helpers themselves: right values pass (a bound of 0, a folder to be made under a writable
    one), and each wrong one is refused naming the knob, a leading zero too (bash's arithmetic, where
    the scripts use their knobs, reads 08 as a bad octal number)."""
    lib = os.path.join(REPO_ROOT, "scripts", "lib.sh")
    ok = (
        f"source {lib}; prog=t; A=3 B=10 Z=0 V=b W=$' b \\ta ' F={tmp_path}/new/sub; whole_numbers A B; "
        'whole_numbers --min 0 Z; one_of V a b; words_of W a b; writable_folder F; echo "fine [$W]"'
    )
    r = subprocess.run(["bash", "-c", ok], capture_output=True, text=True)
    assert r.stdout == "fine [b a]\n" and r.stderr == "", r.stdout + r.stderr  # words_of: single spaces
    for check, line in [
        ("Z=0; whole_numbers Z", "t: error: Z=0: expected a whole number >= 1"),
        ("N=1.5; whole_numbers N", "t: error: N=1.5: expected a whole number >= 1"),
        ("N=08; whole_numbers N", "t: error: N=08: expected a whole number >= 1"),  # bash: octal, refused
        ("whole_numbers UNSET", "t: error: UNSET=: expected a whole number >= 1"),
        ("V=c; one_of V a b", "t: error: V=c: expected one of: a b"),
        ("W='a c b'; words_of W a b", "t: error: W: unknown 'c' (expected one or more of: a b)"),
        ("W=' '; words_of W a b", "t: error: W is empty: expected one or more of: a b"),
        ("W='a *'; words_of W a b", "t: error: W: unknown '*' (expected one or more of: a b)"),
        ("words_of UNSET a b", "t: error: UNSET is empty: expected one or more of: a b"),
        (f"F={tmp_path}/a; touch $F; writable_folder F", f"t: error: F={tmp_path}/a: not a folder"),
    ]:
        r = subprocess.run(
            ["bash", "-c", f"source {lib}; prog=t; {check}; echo went on"], capture_output=True, text=True
        )
        assert (r.returncode, r.stdout, r.stderr.strip()) == (2, "", line), (check, r.stderr)


def test_gpu_pilot_trains_in_work_not_in_the_devices_out(tmp_path):
    """On the device OUT is the folder that comes back; gpu_pilot.sh read it as run.sh's OUT, so the
    carried data (work_dirs/lr_gpu) went unused and was made again, in the returned folder. Its work
    folder is WORK. (U_SHORT=x: run.sh refuses it before any training, the pilot packs and ends.)"""
    import sys

    (tmp_path / "device_out").mkdir()
    env = dict(os.environ, OUT=str(tmp_path / "device_out"), WORK=str(tmp_path / "work"), U_SHORT="x", U_LONG="1")
    env.update(DEVICE="cpu", VENV=os.path.dirname(os.path.dirname(sys.executable)))
    script = os.path.join(REPO_ROOT, "examples", "long_range", "gpu_pilot.sh")
    r = subprocess.run(["bash", script, str(tmp_path / "device_out")], env=env, capture_output=True, text=True)
    assert r.returncode == 0 and "U_SHORT=x: expected a whole number" in r.stderr, r.stderr[-2000:]
    assert (tmp_path / "work" / "device.txt").exists()
    assert [p.name for p in (tmp_path / "device_out").iterdir()] == ["pilot.tar.gz"]


@pytest.mark.parametrize(
    "call,says",
    [
        ('DATA={tmp}/d; need_data DATA "$DATA"/{{train,valid}}.jsonl', "set DATA to the folder that holds train.jsonl"),
        ('BOOK={tmp}/b.txt; need_data BOOK "$BOOK"', "set BOOK=/path/to/it"),
    ],
    ids=["folder_knob", "file_knob"],
)
def test_missing_data_names_what_the_knob_points_at(tmp_path, call, says):
    """A folder knob read 'set DATA=/path/to/it', "it" being the missing file: DATA=/x/train.jsonl
    then looked for /x/train.jsonl/train.jsonl."""
    lib = os.path.join(REPO_ROOT, "scripts", "need_data.sh")
    r = subprocess.run(
        ["bash", "-c", f"prog=t; source {lib}; " + call.format(tmp=tmp_path)], capture_output=True, text=True
    )
    assert r.returncode == 2 and r.stderr.startswith("t: error: ") and r.stderr.strip().endswith(says), r.stderr
