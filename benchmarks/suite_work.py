"""Where ``make test``'s time goes: the suite run once, every Python process it starts logged.

    python benchmarks/suite_work.py --out benchmarks/results/suite_work_<commit>.md   # ~14 min on 2 cores
    python benchmarks/suite_work.py --out /tmp/w.md --workers 4                       # another worker count
    python benchmarks/suite_work.py --out /tmp/w.md --tests tests/test_scripts.py     # some files only

It runs the pytest line of the Makefile's ``test`` recipe (``--workers`` replaces its ``-n``;
``--durations=0`` is added) with a ``sitecustomize.py`` first on ``PYTHONPATH``. That file makes
each Python process append one JSON line when it exits: its pid and parent, its wall and CPU
seconds, its arguments as it started, the test that started it (``PYTEST_CURRENT_TEST``, which a
test's commands inherit) and whether it imported fairseq. The report sorts the run's CPU time
(its children's, from ``getrusage``) into the pytest workers' own (the tests run in-process), the
commands the tests start, and the rest. The rest is what no line records: processes that end
without running ``atexit`` (forked children that ``os._exit``: ``benchmarks/run.py``'s rows,
data-loader workers) and those that are not Python (bash, the C++ compiler under
``torch.compile``). A ``sitecustomize`` of the environment's own is shadowed for the run.

The suite's readings so far: ``benchmarks/results/suite_durations_*.md`` and ``suite_work_*.md``.
"""

import argparse
import collections
import datetime
import json
import os
import re
import resource
import shlex
import subprocess
import sys
import tempfile
import time

from lsg_text.atomic import atomic_write
from lsg_text.provenance import cpu_name, git_stamp

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

LOG_VAR = "SUITE_WORK_LOG"
# Written into a temp folder that goes first on PYTHONPATH; imported by every Python process the
# run starts (site.py imports sitecustomize). It costs a process ~1 ms and writes nothing unless
# SUITE_WORK_LOG names a file.
SITECUSTOMIZE = f"""
import atexit, os, sys, time

_log = os.environ.get({LOG_VAR!r})
if _log:
    _start, _argv = time.time(), list(sys.argv)  # as started: a test may replace sys.argv later

    def _suite_work_record():
        import json, resource
        usage = resource.getrusage(resource.RUSAGE_SELF)
        argv = _argv
        if argv[:1] == ["-m"]:  # python -m: the module's path is known once it runs
            argv = sys.argv[:1]
        record = dict(pid=os.getpid(), ppid=os.getppid(), wall=round(time.time() - _start, 3),
                      cpu=round(usage.ru_utime + usage.ru_stime, 3), argv=argv[:8],
                      test=os.environ.get("PYTEST_CURRENT_TEST", "").rsplit(" (", 1)[0],
                      fairseq="fairseq" in sys.modules)
        with open(_log, "a") as f:  # one short write per line: lines of processes ending together stay whole
            f.write(json.dumps(record) + "\\n")

    atexit.register(_suite_work_record)
"""


def pytest_command(makefile: str, workers: int, tests):
    """The Makefile's ``test`` pytest line as (its environment assignments, its arguments):
    ``$(PY)`` this interpreter, ``-n`` set to ``workers``, ``tests`` for its ``tests`` argument,
    ``--durations=0`` added."""
    recipe = re.search(r"^test:.*\n((?:\t.*\n)+)", makefile, flags=re.M)
    line = next((x for x in recipe.group(1).splitlines() if "pytest" in x), None) if recipe else None
    if line is None:
        raise SystemExit("suite_work.py: error: the Makefile has no test recipe with a pytest line")
    words = shlex.split(line.strip())
    env = {}
    while words and re.fullmatch(r"[A-Z_]+=.*", words[0]):  # VAR=value before the command
        name, value = words.pop(0).split("=", 1)
        env[name] = value
    command = [sys.executable if w == "$(PY)" else w for w in words]
    command[command.index("-n") + 1] = str(workers)
    at = command.index("tests")
    return env, command[:at] + list(tests) + command[at + 1 :] + ["--durations=0"]


def program(argv: list) -> str:
    """A record's command, as a table names it: the script or console script, else ``python -c``."""
    if not argv or argv[0] == "-c":
        return "python -c"
    return os.path.basename(argv[0])


def summarize(records: list, main_pid: int, children_cpu: float) -> dict:
    """The run's CPU seconds sorted by who spent them, from the processes' ``records``."""
    workers = [r for r in records if r["ppid"] == main_pid]
    main = [r for r in records if r["pid"] == main_pid]
    commands = [r for r in records if r["ppid"] != main_pid and r["pid"] != main_pid]
    by_program = collections.defaultdict(lambda: {"count": 0, "cpu": 0.0, "fairseq": 0})
    by_test = collections.defaultdict(lambda: {"count": 0, "cpu": 0.0})
    by_file = collections.defaultdict(lambda: {"count": 0, "cpu": 0.0})
    for r in commands:
        p = by_program[program(r["argv"])]
        p["count"] += 1
        p["cpu"] += r["cpu"]
        p["fairseq"] += bool(r["fairseq"])
        test = r["test"] or "(no test: a fixture of the session, or the run itself)"
        for table, key in ((by_test, test), (by_file, test.split("::")[0])):
            table[key]["count"] += 1
            table[key]["cpu"] += r["cpu"]
    logged = sum(r["cpu"] for r in records)
    fairseq = [r for r in commands if r["fairseq"]]
    return {
        "children_cpu": round(children_cpu, 1),
        "main_cpu": round(sum(r["cpu"] for r in main), 1),
        "workers": len(workers),
        "workers_cpu": round(sum(r["cpu"] for r in workers), 1),
        "commands": len(commands),
        "commands_cpu": round(sum(r["cpu"] for r in commands), 1),
        "fairseq_commands": len(fairseq),
        "fairseq_commands_cpu": round(sum(r["cpu"] for r in fairseq), 1),
        "unlogged_cpu": round(children_cpu - logged, 1),
        "by_program": dict(by_program),
        "by_test": dict(by_test),
        "by_file": dict(by_file),
    }


def slowest(pytest_output: str, count: int) -> list:
    """The ``count`` longest phases of ``--durations=0``'s table: [(seconds, phase, test)]."""
    rows = re.findall(r"^([0-9.]+)s (call|setup|teardown) +(.+?) *$", pytest_output, flags=re.M)
    return sorted(((float(s), phase, test) for s, phase, test in rows), reverse=True)[:count]


def _top(table: dict, count: int):
    return sorted(table.items(), key=lambda item: -item[1]["cpu"])[:count]


def markdown(result: dict) -> str:
    s, run = result["summary"], result["run"]
    cpu = s["children_cpu"]

    def share(x):
        return f"{x:,.0f} s ({100 * x / cpu:.0f}%)" if cpu else f"{x:,.0f} s"

    lines = [
        f"# Where the suite's time goes (`{result['commit']}`, {run['workers']} workers)",
        "",
        f"Command: `{result['command']}` (generated; {run['started']}).  ",
        f"Machine: {result['cpu']}, {result['cores']} cores; load average at the start {result['load_start']}.  ",
        f"Ran: `{' '.join(run['pytest'])}`  ",
        f"Result: {run['outcome']}. Wall {run['wall']:,.1f} s; CPU of the run's processes {cpu:,.1f} s "
        f"(user + sys), {cpu / run['wall']:.2f} cores busy on average.",
        "",
        "| spent by | processes | CPU |",
        "|---|---:|---:|",
        f"| the pytest workers (tests run in-process) | {s['workers']} | {share(s['workers_cpu'])} |",
        f"| Python commands the tests start | {s['commands']} | {share(s['commands_cpu'])} |",
        f"| of which importing fairseq | {s['fairseq_commands']} | {share(s['fairseq_commands_cpu'])} |",
        f"| the pytest main process | 1 | {share(s['main_cpu'])} |",
        f"| not logged: forked children that `os._exit`, bash, the C++ compiler | - | {share(s['unlogged_cpu'])} |",
        "",
        "## Commands by program (the 15 that took most CPU)",
        "",
        "| command | runs | importing fairseq | CPU | per run |",
        "|---|---:|---:|---:|---:|",
    ]
    for name, p in _top(s["by_program"], 15):
        lines.append(f"| `{name}` | {p['count']} | {p['fairseq']} | {p['cpu']:.1f} s | {p['cpu'] / p['count']:.2f} s |")
    lines += [
        "",
        "## Commands by test file (the 15 that took most CPU)",
        "",
        "| file | commands | CPU |",
        "|---|---:|---:|",
    ]
    for name, p in _top(s["by_file"], 15):
        lines.append(f"| `{name}` | {p['count']} | {p['cpu']:.1f} s |")
    lines += ["", "## The longest test phases (wall, beside the other workers)", "", "| seconds | phase | test |"]
    lines.append("|---:|---|---|")
    for seconds, phase, test in result["slowest"]:
        lines.append(f"| {seconds:.1f} | {phase} | `{test}` |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="the report, .md (its records beside it, .json)")
    p.add_argument("--workers", type=int, default=3, help="pytest-xdist workers (make test's -n; default 3)")
    p.add_argument("--tests", nargs="+", default=["tests"], help="what pytest collects (default: tests)")
    p.add_argument("--force", action="store_true", help="replace an --out that is there")
    args = p.parse_args(argv)
    if not args.out.endswith(".md"):
        p.error(f"--out {args.out}: expected a .md file")
    if args.workers < 1:
        p.error(f"--workers {args.workers}: expected 1 or more")
    folder = os.path.dirname(os.path.abspath(args.out))
    if not os.path.isdir(folder):
        p.error(f"--out {args.out}: no folder {folder}")
    json_out = args.out[: -len(".md")] + ".json"
    held = next((f for f in (args.out, json_out) if os.path.exists(f)), None)
    if held and not args.force:
        p.error(f"--out {args.out}: {held} is there (--force replaces it)")
    with open(os.path.join(REPO, "Makefile")) as f:
        make_env, command = pytest_command(f.read(), args.workers, args.tests)

    with tempfile.TemporaryDirectory(prefix="suite_work.") as tmp:
        with open(os.path.join(tmp, "sitecustomize.py"), "w") as f:
            f.write(SITECUSTOMIZE)
        log = os.path.join(tmp, "processes.jsonl")
        env = dict(os.environ, **make_env, **{LOG_VAR: log})
        env["PYTHONPATH"] = os.pathsep.join([tmp] + [x for x in [os.environ.get("PYTHONPATH")] if x])
        load_start = [round(x, 2) for x in os.getloadavg()]
        started = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.time()
        print(f"suite_work.py: {' '.join(command)}", file=sys.stderr)
        proc = subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.PIPE, text=True)
        lines = []
        for line in proc.stdout:  # pytest's progress, as it comes
            sys.stderr.write(line)
            lines.append(line)
        proc.wait()
        output = "".join(lines)
        wall = time.time() - t0
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        records = []
        if os.path.exists(log):
            with open(log) as f:
                records = [json.loads(line) for line in f if line.strip()]
    children = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    outcome = (output.strip().splitlines() or ["no output"])[-1].strip("= ")
    if proc.returncode not in (0, 1):  # 1: tests failed, still a reading of where the time went
        sys.stdout.write(output[-3000:])
        raise SystemExit(f"suite_work.py: error: pytest exited with {proc.returncode}; no report written")
    result = {
        "commit": git_stamp(REPO, ["."]),  # the suite runs the whole repository
        "command": "python benchmarks/suite_work.py " + " ".join(shlex.quote(a) for a in (argv or sys.argv[1:])),
        "cpu": cpu_name(),
        "cores": len(os.sched_getaffinity(0)),
        "load_start": load_start,
        "run": {
            "pytest": [os.path.basename(command[0])] + command[1:],
            "workers": args.workers,
            "started": started,
            "wall": round(wall, 1),
            "outcome": outcome,
            "returncode": proc.returncode,
        },
        "summary": summarize(records, proc.pid, children),
        "slowest": slowest(output, 15),
    }
    with atomic_write(json_out) as f:
        f.write(json.dumps(result, indent=1).encode())
    report = markdown(result)
    with atomic_write(args.out) as f:
        f.write(report.encode())
    print(report)
    return 0 if proc.returncode == 0 else 1  # a failed suite: reported, and said by the exit status


if __name__ == "__main__":
    sys.exit(main())
