"""Where a benchmark row is measured: a process of its own (``run_one``), or one process for a
stage's rows (``run_rows``, ``run.py --one-process``), and the device described by a child
(``probe_device``), so that the parent never initialises CUDA.

On CPU a child is forked (the imports are paid once); with CUDA it is spawned, since CUDA cannot
be used in a child forked from a process that touched it. What a row's measurement is belongs to
``run.py``; it comes here as :class:`Measures`, three functions a spawned child finds by name.
A row that fails, times out or kills its process becomes a record saying so, and the rows after
it go on (or, in one process, say that they were not run).
"""

import gc
import multiprocessing as mp
import sys
import traceback
from typing import Callable, NamedTuple

import torch


class Measures(NamedTuple):
    """What a child runs for a row (arch, mode, length, args): ``measure(..., readings=)`` its record
    (timed, and profiled after unless ``readings=False``), ``measure_readings`` the profiled readings
    of a row in a model built again, ``wants_readings`` whether a row has any."""

    measure: Callable[..., dict]
    measure_readings: Callable[..., dict]
    wants_readings: Callable[..., bool]


def _start_child(args, target, *target_args):
    """(the parent's end of a pipe, the started child ``target(send_end, *target_args)``), the child
    forked or spawned as :func:`start_method` says."""
    method = start_method(args)
    if method == "fork" and "train" in args.modes:
        # a training row's first backward imports torch._dynamo (torch.utils.checkpoint is wrapped
        # by torch._disable_dynamo), seconds of imports: imported here once, each forked child
        # finds it imported instead of importing it again
        import torch._dynamo  # noqa: F401
    ctx = mp.get_context(method)
    recv, send = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=target, args=(send, *target_args))
    proc.start()
    send.close()
    return recv, proc


def _child(conn, measures, arch, mode, length, args):
    conn.send(_attempt(measures.measure, arch, mode, length, args))  # its own process: profiled after its timing
    conn.close()


def _attempt(fn, *a, **kw) -> dict:
    """``fn``'s record with status ok, or the failure as a status (the next row goes on)."""
    try:
        return dict(fn(*a, **kw), status="ok")
    except Exception as e:  # noqa: BLE001  (reported in the results)
        traceback.print_exc()
        return {"status": f"failed: {type(e).__name__}: {str(e)[:300]}"}
    finally:
        gc.collect()
        if torch.cuda.is_initialized():
            torch.cuda.empty_cache()


def _child_rows(conn, measures, rows, args):
    """``_child`` for several rows, each record sent as soon as it is measured: every row timed
    first, then the profiled readings of those that want them (``measures.measure_readings``), each sent
    again with its readings. A profiler with CUDA activity stays attached to the process after its
    block (CUPTI is not torn down; pytorch/pytorch#144455) and slows every later launch: a row
    timed after another row's profile waited on a slower host (LED's encoder at 16K on an H200:
    16.5 ms after the profiles of the rows before it, 12.7 ms in a run without a profiler)."""
    timed = {}
    for row in rows:
        timed[row] = _attempt(measures.measure, *row, args, readings=False)
        conn.send((*row, timed[row]))
    first = rows[0] if rows else None
    if args.control_row and len(rows) > 1 and timed[first]["status"] == "ok":
        again = _attempt(measures.measure, *first, args, readings=False)
        if again["status"] == "ok":
            timed[first] = dict(timed[first], control=control_of(timed[first], again))
            conn.send((*first, timed[first]))
    for row in rows:
        if timed[row]["status"] == "ok" and measures.wants_readings(*row, args):
            extra = _attempt(measures.measure_readings, *row, args)
            if extra.pop("status") == "ok":
                conn.send((*row, dict(timed[row], **extra)))
    conn.send(None)  # the end: every row sent
    conn.close()


def control_of(first: dict, again: dict) -> dict:
    """The first row timed again at the end of its process (``--control-row``): its times and its
    median over the first timing's. One process's rows are compared with one another; a ratio away
    from 1 says the host or the device ran at another pace between the first row and the last, so
    that the rows' ratios hold less than their spread suggests."""
    return {
        "times_s": again["times_s"],
        "median_s": again["median_s"],
        "host_share": again["host_share"],
        "ratio": again["median_s"] / first["median_s"],
    }


def run_rows(measures, rows, args):
    """The records of ``rows`` [(arch, mode, length)] from one process (``--one-process``), as they
    come: each row once timed, in order, then again with its profiled readings where it has any. A
    row that times out or kills the process ends it, and it and the rows not timed yet say so (a
    reading that does: the rows keep their times, without it)."""
    recv, proc = _start_child(args, _child_rows, measures, rows, args)
    untimed = list(rows)
    status = None
    while True:
        if not recv.poll(args.timeout):
            proc.kill()
            status = f"timeout after {args.timeout:.0f} s"
            break
        try:
            message = recv.recv()
        except EOFError:
            proc.join()
            status = f"died (exit code {proc.exitcode}; out of memory?)"
            break
        if message is None:
            break
        arch, mode, length, rec = message
        if (arch, mode, length) in untimed:
            untimed.remove((arch, mode, length))
        yield dict(row_fields(arch, mode, length, args), **rec)
    for i, (arch, mode, length) in enumerate(untimed):
        yield dict(
            row_fields(arch, mode, length, args), status=status if i == 0 else f"not run: {status} in an earlier row"
        )
    if status is not None and not untimed:
        print(f"run.py: the profiled readings stopped ({status}); every row was timed", file=sys.stderr)
    proc.join()


def row_fields(arch, mode, length, args) -> dict:
    """What names a row in its record, whatever became of it: the row and how the run measured it."""
    return {"arch": arch, "mode": mode, "length": length, "device": args.device, "batch": args.batch}


def run_one(measures, arch, mode, length, args) -> dict:
    base = row_fields(arch, mode, length, args)
    recv, proc = _start_child(args, _child, measures, arch, mode, length, args)
    rec = None
    if recv.poll(args.timeout):
        try:
            rec = recv.recv()
        except EOFError:
            rec = None
    if rec is None:
        if proc.is_alive():
            proc.kill()
            rec = {"status": f"timeout after {args.timeout:.0f} s"}
        else:
            proc.join()
            rec = {"status": f"died (exit code {proc.exitcode}; out of memory?)"}
    proc.join()
    return dict(base, **rec)


def start_method(args) -> str:
    """fork on CPU (imports paid once), spawn with CUDA (a forked child cannot use it)."""
    if args.start_method != "auto":
        return args.start_method
    return "spawn" if args.device == "cuda" else "fork"


def _probe(conn, device):
    import torch  # noqa: F811  (the spawned child's own)

    info = {
        "available": device == "cpu" or torch.cuda.is_available(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
    }
    if device == "cuda" and info["available"]:
        info["name"] = torch.cuda.get_device_name()
    conn.send(info)
    conn.close()


def probe_device(args) -> dict:
    """What the device is, asked of a child process (this one must not initialise CUDA)."""
    if args.device == "cpu":
        return {"available": True, "name": "cpu", "torch": torch.__version__, "cuda": None}
    recv, proc = _start_child(args, _probe, args.device)
    info = recv.recv() if recv.poll(args.timeout) else {"available": False}
    proc.join()
    return info
