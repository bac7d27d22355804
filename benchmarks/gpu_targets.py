"""The GPU issues' targets, judged from what a GPU check left in its work folder: issue 32 (LOCOST)
and issue 33 (LSG and LED), each [GPU] "Done when" item as a row with what was measured, in which
stage, and a verdict.

Pure Python over the stages' JSONs (``benchmarks/run.py``'s records, ``flex_gradcheck.py``'s
result), read by ``gpu_check_report.py``, so that every reading is judged by the same rules and a
reading folder of an earlier commit can be judged again.

The rules:

- **A ratio is one stage's** (one process, rows measured one after the other): never a row of one
  stage over a row of another. Where several stages hold both rows (``enc`` and ``paths`` both time
  the encoders at 16K and 64K), each stage's ratio is shown and the verdict is the first stage's in
  the target's order (the stage the issue names, then the others).
- The row judged is the arch the issue names (``lsg_norm``: the path ``auto`` takes on the card);
  the ``paths`` stage's forced flex rows (``lsg_norm_flex``, ``led_flex``) are shown beside it.
- Only records measured on a CUDA device at batch 1 count (the CPU smoke of ``gpu_check.sh`` judges
  nothing; ``run.py --batch`` rows show the device's pace and are not the targets').
- The stages of ``run.py --compile-layers`` (``compiled16k``, ``compiled4k``) are shown beside a
  target and never judge it: the layers run eagerly unless a user compiles them.
- "GB" is read as GiB, as in the earlier issues' targets (``benchmarks/report.py``).
- A target with a record missing or failed is "not measured", naming which; a row that shows
  something rather than meeting a bound (the HF peers, the S4D split) is "shown" or "not measured".
"""

import dataclasses
import json
import os

MET, MISSED, NOT_MEASURED, SHOWN = "met", "missed", "not measured", "shown"
L4, L16, L64, L600 = 4096, 16384, 65536, 600000
GIB = 1024  # MiB
# the stages holding run.py records, in the order a target without its own order reads them
RECORD_STAGES = (
    "enc",
    "train16k",
    "train16k_b4",
    "paths",
    "extra4k",
    "peers16k",
    "fused16k",
    "locost600k",
    "gen16k",
    "compiled16k",
    "compiled4k",
)
SHOWN_ONLY = ("compiled16k", "compiled4k")  # shown beside the targets, never judging one


@dataclasses.dataclass(frozen=True)
class Ratio:
    """``arch`` over ``ref`` (``key``: time or memory above the weights) at ``length`` <= ``limit``."""

    issue: int
    arch: str
    ref: str
    mode: str
    length: int
    limit: float
    stages: tuple
    key: str = "median_s"

    @property
    def text(self):
        what = {"enc": "encoder", "train": "fwd+bwd"}[self.mode]
        of = "time" if self.key == "median_s" else "memory above the weights"
        return f"`{self.arch}` {what} at {short_length(self.length)}: {of} <= {self.limit:g}x `{self.ref}`'s"


RATIOS = (
    Ratio(32, "locost", "linear", "enc", L16, 3.0, ("enc",)),
    Ratio(32, "locost", "linear", "enc", L64, 3.0, ("enc",)),
    Ratio(32, "locost", "bart", "train", L16, 3.0, ("train16k",)),
    Ratio(33, "lsg_norm", "linear", "enc", L16, 1.3, ("enc", "paths")),
    Ratio(33, "lsg_norm", "linear", "enc", L64, 1.3, ("enc", "paths")),
    Ratio(33, "lsg_norm", "bart", "enc", L4, 1.0, ("extra4k", "compiled4k")),
    Ratio(33, "led", "linear", "enc", L16, 1.5, ("enc", "paths")),
    Ratio(33, "led", "linear", "enc", L64, 1.5, ("enc", "paths")),
    Ratio(33, "lsg_norm", "bart", "train", L16, 0.7, ("train16k", "compiled16k")),
    Ratio(33, "led", "bart", "train", L16, 0.7, ("train16k", "compiled16k")),
    Ratio(33, "lsg_norm", "linear", "train", L16, 1.1, ("train16k", "paths", "compiled16k"), key="activations_mb"),
    Ratio(33, "led", "linear", "train", L16, 1.1, ("train16k", "paths", "compiled16k"), key="activations_mb"),
)
LOCOST_600K_S, LOCOST_600K_GIB = 3.0, 16


def short_length(n):
    """16384 -> "16K", 600000 -> "600K"."""
    return f"{n // 1024}K" if n % 1024 == 0 else f"{n // 1000}K"


def _read(path):
    if not os.path.exists(path):
        return None
    with open(path) as f:
        return json.load(f)


def stage_records(work):
    """{stage: records} of every benchmark stage whose JSON the work folder holds."""
    out = {}
    for stage in RECORD_STAGES:
        part = _read(os.path.join(work, f"{stage}.json"))
        if part is not None:
            out[stage] = part["records"]
    return out


def record(records, arch, mode, length):
    """The record of (arch, mode, length) in a stage's records, whatever its status, or None."""
    return next((r for r in records if (r["arch"], r["mode"], r["length"]) == (arch, mode, length)), None)


def on_cuda(result) -> bool:
    """Whether a record (or flex_grad's result) was measured on a CUDA device (no ``device``: an
    older CPU record); ``benchmarks/report.py`` keeps issue 13's CPU targets to the others."""
    return str(result.get("device", "")).startswith("cuda")


def measured(r):
    """Whether a record holds a measurement on a CUDA device (what a prediction is judged by)."""
    return r is not None and r["status"] == "ok" and on_cuda(r)


def usable(r):
    """Whether a record counts for a target: measured on a CUDA device, at batch 1 (the issues')."""
    return measured(r) and r.get("batch", 1) == 1


def why_not(records, keys):
    """Why the records of ``keys`` (arch, mode, length) do not count: missing, failed or not on CUDA."""
    why = []
    for arch, mode, n in keys:
        r = record(records, arch, mode, n)
        if r is None:
            why.append(f"no {arch} {mode} {short_length(n)} record")
        elif r["status"] != "ok":
            why.append(f"{arch} {mode} {short_length(n)}: {r['status'][:60]}")
        elif not on_cuda(r):
            why.append(f"{arch} {mode} {short_length(n)} ran on {r.get('device')}")
        elif not usable(r):
            why.append(f"{arch} {mode} {short_length(n)} ran at batch {r['batch']}")
    return "; ".join(why)


def _value(r, key):
    if key != "median_s":
        return f"{r[key]:,.0f} MiB"
    return f"{1e3 * r[key]:.3g} ms" if r[key] < 1 else f"{r[key]:.3g} s"


def check_ratio(t, by_stage):
    """One :class:`Ratio` as a row: each stage's reading, the verdict from the first that has both."""
    readings, verdict, missing = [], None, []
    for stage in t.stages:
        records = by_stage.get(stage)
        if records is None:
            if stage not in SHOWN_ONLY:  # an optional stage not run is not worth a word
                missing.append(f"{stage}: not run")
            continue
        a, ref = record(records, t.arch, t.mode, t.length), record(records, t.ref, t.mode, t.length)
        if not (usable(a) and usable(ref)):
            missing.append(f"{stage}: " + why_not(records, [(t.arch, t.mode, t.length), (t.ref, t.mode, t.length)]))
            continue
        ratio = a[t.key] / ref[t.key]
        how = [a["layer_path"]] if a.get("layer_path") else []
        how += ["compiled"] if a.get("compiled_layers") else []
        path = f" ({', '.join(how)})" if how else ""
        text = f"{stage}{path}: {_value(a, t.key)} / {_value(ref, t.key)} = **{ratio:.2f}x**"
        flex = record(records, f"{t.arch}_flex", t.mode, t.length)
        if usable(flex):
            text += f" (`{flex['arch']}` {flex[t.key] / ref[t.key]:.2f}x)"
        readings.append(text)
        if verdict is None and stage not in SHOWN_ONLY:
            verdict = MET if ratio <= t.limit else MISSED
    if verdict is None:
        return (t.issue, t.text, "; ".join(readings + missing), NOT_MEASURED)
    return (t.issue, t.text, "; ".join(readings), verdict)


def check_600k(by_stage):
    text = f"`locost` encoder at 600K tokens: <= {LOCOST_600K_S:g} s within {LOCOST_600K_GIB} GB peak"
    records = by_stage.get("locost600k")
    r = None if records is None else record(records, "locost", "enc", L600)
    if not usable(r):
        why = "locost600k: not run" if records is None else why_not(records, [("locost", "enc", L600)])
        return (32, text, why, NOT_MEASURED)
    met = r["median_s"] <= LOCOST_600K_S and r["peak_mb"] <= LOCOST_600K_GIB * GIB
    measured = f"locost600k: **{r['median_s']:.3g} s**, peak **{r['peak_mb'] / GIB:.1f} GiB**"
    return (32, text, measured, MET if met else MISSED)


def check_s4d_split(by_stage):
    """Shown when records with the S4D split exist for cached (``locost``) and uncached
    (``locost_cold``) kernels."""
    text = "LOCOST's S4D split (kernel / convolution / projections), cached and not, beside its rows"
    seen = {"locost": [], "locost_cold": []}
    for stage, records in by_stage.items():
        for r in records:
            if r["arch"] in seen and usable(r) and "ssm_share" in r:
                seen[r["arch"]].append(f"{stage} {short_length(r['length'])}")
    measured = "; ".join(f"`{arch}`: {', '.join(where) or 'none'}" for arch, where in seen.items())
    return (32, text, measured, SHOWN if all(seen.values()) else NOT_MEASURED)


def check_flex_grad(flex):
    text = "flex fwd+bwd gradient check against the whole-tensor reference, on the GPU"
    if flex is None:
        return (33, text, "flex_grad: not run", NOT_MEASURED)
    if not on_cuda(flex) or not flex.get("backward"):
        return (33, text, f"flex_grad ran on {flex.get('device')}, forward only", NOT_MEASURED)
    worst = max((r["gradients"] for r in flex["rows"] if r.get("gradients") is not None), default=None)
    if worst is None:
        return (33, text, "flex_grad: no gradient compared", NOT_MEASURED)
    measured = f"flex_grad: {len(flex['rows'])} cases, worst gradient {worst:.1e} (tolerance {flex['tolerance']:g})"
    return (33, text, measured, MET if flex.get("all_ok") else MISSED)


def check_hf_rows(by_stage):
    text = "HF BART (SDPA) and HF LED rows beside ours"
    seen = {"hf_bart": [], "hf_led": []}
    for stage, records in by_stage.items():
        for r in records:
            if r["arch"] in seen and usable(r):
                seen[r["arch"]].append(f"{stage} {r['mode']} {short_length(r['length'])}")
    measured = "; ".join(f"`{arch}`: {', '.join(where) or 'none'}" for arch, where in seen.items())
    return (33, text, measured, SHOWN if all(seen.values()) else NOT_MEASURED)


def checks(work):
    """Every target's row ``(issue, target, measured, verdict)``, issue 32's first."""
    by_stage = stage_records(work)
    rows = [check_ratio(t, by_stage) for t in RATIOS if t.issue == 32]
    rows += [check_600k(by_stage), check_s4d_split(by_stage)]
    rows += [check_ratio(t, by_stage) for t in RATIOS if t.issue == 33]
    rows += [check_flex_grad(_read(os.path.join(work, "flex_grad.json"))), check_hf_rows(by_stage)]
    return rows


def markdown(rows):
    out = ["| issue | target | measured (stage: ours / reference) | verdict |", "|---:|---|---|---|"]
    out += [f"| {issue} | {target} | {measured} | {verdict} |" for issue, target, measured, verdict in rows]
    return "\n".join(out) + "\n"
