"""The predictions written before a GPU reading (``benchmarks/predictions.json``), judged against it.

Pure Python over the stages' records (``benchmarks/run.py`` JSONs in a GPU check's work folder), read
by ``gpu_check_report.py``: each row of the JSON names one record (stage, arch, mode, length) and a
range of its median in milliseconds; the verdict is "held" inside the range, "wrong" outside it with
the measured value over the range's nearer end, "not measured" where the record is missing, failed
or not measured on a CUDA device.
"""

import json
import os

HELD, WRONG, NOT_MEASURED = "held", "wrong", "not measured"
DEFAULT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "predictions.json")


def load(path=DEFAULT):
    with open(path) as f:
        return json.load(f)


def _record(work, stage, arch, mode, length, cache):
    if stage not in cache:
        path = os.path.join(work, f"{stage}.json")
        cache[stage] = None
        if os.path.exists(path):
            with open(path) as f:
                cache[stage] = json.load(f)["records"]
    records = cache[stage]
    if records is None:
        return None, f"{stage}: not run"
    for r in records:
        if (r["arch"], r["mode"], r["length"]) == (arch, mode, length):
            if r["status"] != "ok":
                return None, f"{stage}: {r['status'][:60]}"
            if not str(r.get("device", "")).startswith("cuda"):
                return None, f"{stage}: ran on {r.get('device')}"
            return r, ""
    return None, f"{stage}: no record"


def _ms(ms):
    return f"{ms:,.0f} ms" if ms >= 100 else f"{ms:.3g} ms"


def judge(work, predictions):
    """``[(row, measured text, verdict)]`` for every row of ``predictions`` (a loaded JSON)."""
    out, cache = [], {}
    for p in predictions["rows"]:
        r, why = _record(work, p["stage"], p["arch"], p["mode"], p["length"], cache)
        if r is None:
            out.append((p, why, NOT_MEASURED))
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
        n = p["length"]
        length = f"{n // 1024}K" if n % 1024 == 0 else f"{n:,}"
        out.append(
            f"| {p['stage']}: {p['arch']} {p['mode']} {length} | {p.get('before', '')} | {p['said']} "
            f"({p['ms'][0]:g}-{p['ms'][1]:g} ms) "
            f"| {measured} | {verdict} | {p['from']} |"
        )
    return "\n".join(out) + "\n"
