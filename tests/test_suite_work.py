"""benchmarks/suite_work.py: make test's line as the Makefile has it, every Python process logged
once with the test that started it, and the run's CPU sorted by who spent it."""

import json
import os
import subprocess
import sys

import pytest

from conftest import REPO_ROOT, load_script

suite_work = load_script("benchmarks/suite_work.py", "suite_work")


def test_the_pytest_line_is_the_makefiles():
    with open(os.path.join(REPO_ROOT, "Makefile")) as f:
        env, command = suite_work.pytest_command(f.read(), 4, ["suite/test_a.py", "suite/test_b.py"])
    assert env == {"PYTHONDONTWRITEBYTECODE": ""}  # make test writes bytecode: so does the reading
    assert command[:3] == [sys.executable, "-m", "pytest"] and command[-1] == "--durations=0"
    assert command[3:5] == ["suite/test_a.py", "suite/test_b.py"] and "tests" not in command
    assert command[command.index("-n") + 1] == "4" and "--no-loadscope-reorder" in command


def _logged(tmp_path, *command, **env):
    (tmp_path / "sitecustomize.py").write_text(suite_work.SITECUSTOMIZE)
    log = tmp_path / "log.jsonl"
    log.unlink(missing_ok=True)
    full = dict(os.environ, PYTHONPATH=str(tmp_path), SUITE_WORK_LOG=str(log), **env)
    subprocess.run([sys.executable, *command], env=full, check=True, cwd=tmp_path)
    return [json.loads(line) for line in log.read_text().splitlines()]


def test_each_process_is_one_line_named_as_it_started(tmp_path):
    """A test may replace sys.argv (monkeypatch): the record keeps the command as it started, and
    the test that started it without pytest's phase."""
    (tmp_path / "script.py").write_text("import sys\nsys.argv[:] = ['lsg-fairseq-generate']\n")
    (record,) = _logged(tmp_path, "script.py", "--flag", PYTEST_CURRENT_TEST="suite/test_x.py::test_y[a b] (call)")
    assert record["argv"] == ["script.py", "--flag"] and record["test"] == "suite/test_x.py::test_y[a b]"
    assert record["pid"] > 0 and record["cpu"] >= 0 and record["fairseq"] is False
    (record,) = _logged(tmp_path, "-c", "import sys; sys.argv[:] = ['x']", PYTEST_CURRENT_TEST="")
    assert suite_work.program(record["argv"]) == "python -c" and record["test"] == ""
    assert suite_work.program(["/venv/bin/fairseq-train", "data"]) == "fairseq-train"


def test_the_cpu_is_sorted_by_who_spent_it():
    def rec(pid, ppid, cpu, argv, test="", fairseq=False):
        return dict(pid=pid, ppid=ppid, wall=cpu, cpu=cpu, argv=argv, test=test, fairseq=fairseq)

    records = [
        rec(10, 1, 0.5, ["-m"]),  # the pytest main process
        rec(11, 10, 30.0, ["-c"]),  # two workers
        rec(12, 10, 20.0, ["-c"]),
        rec(20, 11, 4.0, ["/venv/bin/fairseq-train"], "suite/test_a.py::test_one", fairseq=True),
        rec(21, 20, 1.0, ["scripts/key_recall.py"], "suite/test_a.py::test_two"),
        rec(22, 12, 3.5, ["/venv/bin/fairseq-train"], "suite/test_b.py::test_three", fairseq=True),
    ]
    s = suite_work.summarize(records, main_pid=10, children_cpu=70.0)
    assert (s["workers"], s["workers_cpu"], s["main_cpu"]) == (2, 50.0, 0.5)
    assert (s["commands"], s["commands_cpu"], s["fairseq_commands"], s["fairseq_commands_cpu"]) == (3, 8.5, 2, 7.5)
    assert s["unlogged_cpu"] == 70.0 - 59.0
    assert s["by_program"]["fairseq-train"] == {"count": 2, "cpu": 7.5, "fairseq": 2}
    assert s["by_file"]["suite/test_a.py"] == {"count": 2, "cpu": 5.0}
    assert s["by_test"]["suite/test_b.py::test_three"] == {"count": 1, "cpu": 3.5}


def test_a_run_reports_its_worker_and_the_command_a_test_started(tmp_path):
    """The whole tool on a one-test file: pytest with one worker, the test's command logged under its
    test, and the report written beside its records."""
    tests = tmp_path / "tests_here"
    tests.mkdir()
    (tests / "test_here.py").write_text(
        "import subprocess, sys\n\n\ndef test_starts_a_command():\n"
        "    subprocess.run([sys.executable, '-c', 'pass'], check=True)\n"
    )
    out = tmp_path / "work.md"
    assert suite_work.main(["--out", str(out), "--workers", "1", "--tests", str(tests)]) == 0
    result = json.loads(out.with_suffix(".json").read_text())
    s = result["summary"]
    assert result["run"]["outcome"].startswith("1 passed") and s["workers"] == 1
    ((test, work),) = s["by_test"].items()  # the test's node id, from pytest's root (here its folder)
    file, name = test.split("::")
    assert file.endswith("test_here.py") and name == "test_starts_a_command" and work["count"] == 1 == s["commands"]
    assert s["by_program"]["python -c"]["count"] == 1 and s["children_cpu"] > 0
    md = out.read_text()
    assert "| the pytest workers (tests run in-process) | 1 |" in md and "-n 1 --dist loadfile" in md


def test_an_out_that_is_there_is_kept_unless_forced(tmp_path, capsys):
    out = tmp_path / "work.md"
    out.write_text("an earlier reading\n")
    for argv, message in (
        (["--out", str(out)], f"--out {out}: {out} is there (--force replaces it)"),
        (["--out", str(tmp_path / "work.txt")], f"--out {tmp_path / 'work.txt'}: expected a .md file"),
        (["--out", str(out), "--workers", "0", "--force"], "--workers 0: expected 1 or more"),
    ):
        with pytest.raises(SystemExit) as e:
            suite_work.main(argv)
        assert e.value.code == 2 and message in capsys.readouterr().err
    assert out.read_text() == "an earlier reading\n"
