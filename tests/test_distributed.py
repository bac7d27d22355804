"""fairseq's torch.distributed training path with the plugin, on CPU (fairseq_notes §5).

Two processes (gloo, ``--distributed-no-spawn``, ``--ddp-backend legacy_ddp``, batch B each) must
follow the same trajectory as one process with ``--update-freq 2`` (batch B): fairseq gives rank r
the batches r, r+2, ... and the single process accumulates batches 2i, 2i+1 into update i, and
both normalise the summed gradient by the summed sample size. Checked for ``lsg_bart`` and
``locost``: logged losses per update and the final weights.

Each rank is a real fairseq-train process running ``fairseq_cli.train.cli_main`` with the same
argv a launcher would give; they are forked from one driver that has imported fairseq once, so
that the six processes (2 archs x (2 ranks + 1 reference)) do not each pay the ~5 s import on a
2-core CI box.
"""

import json
import os
import signal
import socket
import subprocess
import sys

import torch

import lsg_fairseq
from conftest import REPO_ROOT, TINY_LOCOST, TINY_LSG_BART

DRIVER = r"""
import json, os, sys, traceback
sys.path.insert(0, {repo!r})
import torch
torch.set_num_threads(1)
import fairseq_cli.train as train_cli
import lsg_fairseq  # noqa: F401  (what --user-dir imports; a memo makes the CLI's import a no-op)

pids = []
for run in json.loads(sys.argv[1]):
    pid = os.fork()
    if pid == 0:
        fd = os.open(run["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        sys.argv = ["fairseq-train"] + run["argv"]
        code = 0
        try:
            train_cli.cli_main()
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else 1
        except BaseException:
            traceback.print_exc()
            code = 1
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    pids.append(pid)
failed = 0
running = set(pids)
while running:
    pid, status = os.wait()
    running.discard(pid)
    if os.waitstatus_to_exitcode(status) != 0:
        failed += 1
        for other in running:  # its peers would wait for it in gloo forever
            os.kill(other, 9)
sys.exit(1 if failed else 0)
"""

UPDATES = 4
ARCHS = {"lsg_bart": [*TINY_LSG_BART, "--attention-dropout", "0"], "locost": TINY_LOCOST}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def common(data, arch, save_dir):
    return [
        str(data),
        "--user-dir",
        lsg_fairseq.user_dir(),
        "--task",
        "long_document_summarization",
        *ARCHS[arch],
        "--max-source-positions",
        "128",
        "--max-target-positions",
        "64",
        "--truncate-target",
        "--dropout",
        "0",
        "--criterion",
        "cross_entropy",
        "--optimizer",
        "adam",
        "--lr",
        "1e-3",
        "--batch-size",
        "2",
        "--max-update",
        str(UPDATES),
        "--disable-validation",
        "--no-epoch-checkpoints",
        "--save-dir",
        str(save_dir),
        "--cpu",
        "--num-workers",
        "0",
        "--log-format",
        "json",
        "--log-interval",
        "1",
        "--seed",
        "1",
    ]


def run_driver(command, env, timeout):
    """``command`` (a driver of fairseq-train processes) to its end: (process, stdout, stderr). In a
    session of its own, so that a hung rank (gloo waits forever for a dead peer) dies with it."""
    proc = subprocess.Popen(
        command,
        env={**env, "OMP_NUM_THREADS": "1"},
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise
    return proc, out, err


def losses(log_path):
    out = {}
    for line in open(log_path):
        if "| train_inner |" in line:
            rec = json.loads(line.split("| train_inner |", 1)[1])
            out[int(rec["num_updates"])] = (float(rec["loss"]), int(rec["bsz"]))
    return out


def weights(path):
    return torch.load(path, map_location="cpu", weights_only=False)["model"]


def test_two_gloo_processes_equal_one_process_with_update_freq_2(word_data, tmp_path):
    runs = []
    for arch in ARCHS:
        port = free_port()
        runs.append(
            {
                "argv": common(word_data, arch, tmp_path / arch / "single") + ["--update-freq", "2"],
                "log": str(tmp_path / f"{arch}.single.log"),
            }
        )
        for rank in (0, 1):
            runs.append(
                {
                    "argv": common(word_data, arch, tmp_path / arch / "ddp")
                    + [
                        "--distributed-world-size",
                        "2",
                        "--distributed-rank",
                        str(rank),
                        "--distributed-init-method",
                        f"tcp://127.0.0.1:{port}",
                        "--distributed-no-spawn",
                        "--distributed-backend",
                        "gloo",
                        "--ddp-backend",
                        "legacy_ddp",
                    ],
                    "log": str(tmp_path / f"{arch}.rank{rank}.log"),
                }
            )
    driver = tmp_path / "driver.py"
    driver.write_text(DRIVER.format(repo=REPO_ROOT))
    env = {k: v for k, v in os.environ.items() if k != "TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD"}
    proc, _, driver_err = run_driver([sys.executable, str(driver), json.dumps(runs)], env, timeout=600)
    logs = {r["log"]: open(r["log"]).read() if os.path.exists(r["log"]) else "" for r in runs}
    assert proc.returncode == 0, driver_err[-2000:] + "\n".join(t[-3000:] for t in logs.values())

    report = {}
    for arch in ARCHS:
        rank0 = logs[str(tmp_path / f"{arch}.rank0.log")]
        assert (
            "distributed init (rank 0)" in rank0
            and "distributed init (rank 1)" in logs[str(tmp_path / f"{arch}.rank1.log")]
        )
        assert "training on 2 devices" in rank0
        single, ddp = losses(tmp_path / f"{arch}.single.log"), losses(tmp_path / f"{arch}.rank0.log")
        assert sorted(single) == sorted(ddp) == list(range(1, UPDATES + 1))
        for n in single:
            # bsz is the examples per update summed over ranks (2 x 2) or over the two micro-batches
            assert single[n][1] == ddp[n][1] == 4
            assert abs(single[n][0] - ddp[n][0]) <= 1e-3, (arch, n, single[n], ddp[n])  # logs keep 3 decimals
        a, b = (
            weights(tmp_path / arch / "single/checkpoint_last.pt"),
            weights(tmp_path / arch / "ddp/checkpoint_last.pt"),
        )
        assert a.keys() == b.keys()
        diff = max((a[k].float() - b[k].float()).abs().max().item() for k in a)
        moved = max(
            (a[k].float() - w.float()).abs().max().item() for k, w in weights_at_init(arch, word_data, tmp_path).items()
        )
        report[arch] = (diff, moved)
        assert diff < 1e-5, (arch, diff)  # float summation order only
        assert moved > 1e-3, (arch, moved)  # and training did change the weights
    print("max |single - ddp| weight diff, max weight change:", report)


def weights_at_init(arch, data, tmp_path):
    """The seed-1 initial weights, built in-process the way fairseq-train builds them."""
    from fairseq import options, tasks, utils
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf

    args = options.parse_args_and_arch(options.get_training_parser(), common(data, arch, tmp_path / "init"))
    cfg = convert_namespace_to_omegaconf(args)
    utils.set_torch_seed(cfg.common.seed)
    task = tasks.setup_task(cfg.task)
    return task.build_model(cfg.model).state_dict()


SPAWN_DRIVER = r"""
import sys
sys.path.insert(0, {repo!r})
import torch
torch.set_num_threads(1)
torch.cuda.device_count = lambda: 2  # fairseq-train spawns a process per GPU it counts (each --cpu here)
if __name__ == "__main__":  # each spawned process imports this file again
    import fairseq_cli.train as train_cli
    sys.argv = ["fairseq-train", *sys.argv[1:]]
    train_cli.cli_main()
"""


def test_the_processes_fairseq_spawns_refuse_in_one_line(word_data, tmp_path):
    """Plain fairseq-train on a machine with several GPUs spawns one process per GPU and runs main
    there, where the plugin's call_main wrappers did not run: a refusal raised during the run came
    back as the launcher's traceback around the worker's, and the task's vet_run (what it records
    for the run, --update-freq here) had not run in the worker. The spawn path is fairseq's own on
    CPU too (gloo), once the GPUs are counted; 6 batches of 2, 3 a process, 2 after
    --skip-remainder-batch: no update of 3."""
    save_dir = tmp_path / "runs" / "ck"
    argv = common(word_data, "lsg_bart", save_dir) + ["--skip-remainder-batch", "--update-freq", "3"]
    argv += ["--distributed-world-size", "2", "--distributed-init-method", f"tcp://127.0.0.1:{free_port()}"]
    argv += ["--distributed-backend", "gloo", "--ddp-backend", "legacy_ddp"]
    driver = tmp_path / "spawn_driver.py"
    driver.write_text(SPAWN_DRIVER.format(repo=REPO_ROOT))
    proc, out, err = run_driver([sys.executable, str(driver), *argv], dict(os.environ), timeout=300)
    lines = [line for line in err.splitlines() if "error:" in line]
    assert proc.returncode == 2 and "Traceback" not in err + out, err[-3000:]
    assert lines == [  # once, not once a process
        f"fairseq-train: error: --skip-remainder-batch: {word_data}/train makes 3 batches an epoch (per process), "
        "and fairseq-train drops the last and, with --update-freq 3, the batches that fill no whole update, so no "
        "update would run; drop --skip-remainder-batch, or make smaller batches (--max-tokens, --batch-size) or a "
        "lower --update-freq"
    ], err[-3000:]
    assert not (tmp_path / "runs").exists()
