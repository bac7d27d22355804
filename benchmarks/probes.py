"""What the probes (``flex_probe.py``, ``conv_probe.py``, ``layer_probe.py``) share: timing one device call (CUDA events
on a GPU: the device's time, not the host's; the wall clock on a CPU), the loop over a probe's
variants (the first, ``model``, is the reference of the others), and writing the results after
every row, so that a probe cut off by its stage's time limit keeps the rows it measured."""

import json
import os
import statistics
import time

import torch


def time_calls(fn, device: str, warmup: int, repeat: int):
    """(first call seconds: the compile, if any; median milliseconds of ``repeat`` calls after
    ``warmup``; the output of the last call)."""
    cuda = device == "cuda"
    t0 = time.perf_counter()
    out = fn()
    if cuda:
        torch.cuda.synchronize()
    first = time.perf_counter() - t0
    for _ in range(warmup):
        out = fn()
    times = []
    for _ in range(repeat):
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            out = fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        else:
            t = time.perf_counter()
            out = fn()
            times.append(1e3 * (time.perf_counter() - t))
    return first, statistics.median(times), out


def write(result: dict, out: str, markdown) -> None:
    """``out`` (JSON) and its table beside it (``.md``, ``markdown(result)``), each replaced whole."""
    for path, text in ((out, json.dumps(result, indent=1)), (os.path.splitext(out)[0] + ".md", markdown(result))):
        with open(path + ".tmp", "w") as f:
            f.write(text)
        os.replace(path + ".tmp", path)


DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}


def add_common_args(p) -> None:
    """The flags every probe takes: the device, the activations' dtype, the calls and the output."""
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    p.add_argument("--dtype", default="bf16", choices=sorted(DTYPES))
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--repeat", type=int, default=20)
    p.add_argument("--out", required=True, help="JSON; the table beside it as .md")


def start_result(p, args, fields) -> tuple:
    """(the activations' dtype, the result's header: ``fields`` of ``args``, torch's version and, on a
    GPU, the card); ``--device cuda`` without a GPU is refused through ``p``."""
    if args.device == "cuda" and not torch.cuda.is_available():
        p.error("--device cuda: torch sees no CUDA GPU here")
    result = {k: getattr(args, k) for k in fields}
    result["torch"] = torch.__version__
    if args.device == "cuda":
        result["card"] = torch.cuda.get_device_name()
    return DTYPES[args.dtype], result


def largest_difference(out, ref):
    """The largest |difference| of two outputs."""
    return (out - ref).abs().max()


def relative_difference(out, ref):
    """The largest |difference| of two outputs relative to the reference's largest entry."""
    return (out - ref).abs().max() / ref.abs().max()


def time_variants(names, prepare, device: str, warmup: int, repeat: int, same_math, diff, part: dict, on_row=None):
    """Times each variant in ``names``, appends its row to ``part["rows"]``, then calls
    ``on_row(part)`` (where given: the caller completes the row, writes the results).

    ``prepare(name) -> (call, fields)``: the call to time and fields for its row. The variant named
    ``model`` is the reference: each later row has ``x_model`` (its time over model's) and, where
    ``name in same_math``, ``diff`` = ``diff(output, model's output)`` (both float32). A variant that
    raises (one this torch or card refuses) gets ``status: error`` and the loop goes on.
    """
    reference = model_ms = None
    for name in names:
        row = {"variant": name}
        try:
            call, fields = prepare(name)
            with torch.no_grad():
                first, ms, out = time_calls(call, device, warmup, repeat)
            row.update(status="ok", first_call_s=round(first, 3), ms=ms, **fields)
            if name == "model":
                reference, model_ms = out.float(), ms
            elif name in same_math and reference is not None:
                row["diff"] = float(diff(out.float(), reference))
            if model_ms:
                row["x_model"] = ms / model_ms
        except Exception as e:  # noqa: BLE001 - recorded, the other variants go on
            row.update(status="error", error=f"{type(e).__name__}: {str(e).splitlines()[0][:200]}")
        part["rows"].append(row)
        print(json.dumps(row), flush=True)
        if on_row is not None:
            on_row(part)


def row_cells(row: dict, tolerance: float, extra=()) -> str:
    """A row's table cells after its labels: ``first call s | ms | x model | *extra | diff |``
    (a diff over ``tolerance`` in bold), or its error spanning them."""
    if row["status"] != "ok":
        return f" {row['error']} |" + " |" * (3 + len(extra))
    diff = f"{row['diff']:.1e}" if "diff" in row else ""
    if row.get("diff", 0) > tolerance:
        diff += f" (**over {tolerance:g}**)"
    cells = [f"{row['first_call_s']:.1f}", f"{row['ms']:.3f}", f"{row.get('x_model', 0):.2f}", *extra, diff]
    return "".join(f" {c} |" for c in cells)
