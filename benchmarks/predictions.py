"""The predictions written before a GPU reading (``benchmarks/predictions.json``), judged against it.

Pure Python over the stages' records (``benchmarks/run.py`` JSONs in a GPU check's work folder), read
by ``gpu_check_report.py``: each row of the JSON names one record (stage, arch, mode, length) and a
range of its median in milliseconds; the verdict is "held" inside the range, "wrong" outside it with
the measured value over the range's nearer end, "not measured" where the record is missing, failed
or not measured on a CUDA device.
"""

import json
import os

import gpu_targets  # benchmarks/gpu_targets.py: which records count, and why one does not

HELD, WRONG, NOT_MEASURED = "held", "wrong", "not measured"
DEFAULT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "predictions.json")


def load(path=DEFAULT):
    with open(path) as f:
        return json.load(f)


def _ms(ms):
    return f"{ms:,.0f} ms" if ms >= 100 else f"{ms:.3g} ms"


def judge(work, predictions):
    """``[(row, measured text, verdict)]`` for every row of ``predictions`` (a loaded JSON)."""
    out, by_stage = [], gpu_targets.stage_records(work)
    for p in predictions["rows"]:
        records = by_stage.get(p["stage"])
        key = (p["arch"], p["mode"], p["length"])
        r = None if records is None else gpu_targets.record(records, *key)
        if not gpu_targets.measured(r):
            why = "not run" if records is None else gpu_targets.why_not(records, [key])
            out.append((p, f"{p['stage']}: {why}", NOT_MEASURED))
            continue
        ms, (low, high) = 1e3 * r["median_s"], p["ms"]
        if low <= ms <= high:
            out.append((p, _ms(ms), HELD))
        else:
            nearer = low if ms < low else high
            out.append((p, f"{_ms(ms)} ({ms / nearer:.2f}x the range's {'low' if ms < low else 'high'} end)", WRONG))
    return out


def markdown(judged, predictions):
    out = [
        f"Written after the reading of `{predictions['made_after']}` (`benchmarks/predictions.json`): "
        f"{sum(v == HELD for _, _, v in judged)} held, {sum(v == WRONG for _, _, v in judged)} wrong, "
        f"{sum(v == NOT_MEASURED for _, _, v in judged)} not measured.\n",
        "| stage: row | before | predicted | measured | verdict | from |",
        "|---|---|---|---|---|---|",
    ]
    for p, measured, verdict in judged:
        length = gpu_targets.short_length(p["length"])
        out.append(
            f"| {p['stage']}: {p['arch']} {p['mode']} {length} | {p.get('before', '')} | {p['said']} "
            f"({p['ms'][0]:g}-{p['ms'][1]:g} ms) "
            f"| {measured} | {verdict} | {p['from']} |"
        )
    return "\n".join(out) + "\n"
