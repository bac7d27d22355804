"""Reporting half of the benchmark suite: tables, growth exponents, target checks and plots.

Pure Python over the records of ``benchmarks/run.py`` (no torch; matplotlib only for the plots),
so ``run.py --report-only`` and the tests can redraw a report from a JSON without measuring.

A record is a dict with ``arch``, ``mode``, ``length``, ``status`` ("ok" or why not) and, when ok,
``median_s``, ``peak_mb`` (absolute peak, MiB) and ``activations_mb`` (peak above the resident
weights, MiB); ``gen`` records add ``new_tokens_per_s``, records of rows with an S4D split the
``ssm_*`` split.

What it knows of the rows (archs) comes from run.py, which finds them in the model families'
registry: a JSON's ``rows``, one dict per arch in the order the tables show them, with ``growth``
(the expected growth exponent), ``line`` (solid, dashed or dotted in the plots) and ``color``. An
arch the rows lack (a JSON written before run.py wrote them) is shown after them with
:data:`ROW_DEFAULTS`.
"""

import math

from gpu_targets import on_cuda  # benchmarks/gpu_targets.py: which device a record counts for, one rule

MODES = ("enc", "train", "gen")
ROW_DEFAULTS = {"growth": "1", "line": "solid", "color": None}  # color None: matplotlib's next
TITLES = {
    "enc": "Encoder forward, no grad",
    "train": "Forward + backward, whole model",
    "gen": "Generation (beam search, incl. encoder)",
}
# The references every time and memory cell is divided by (same mode and length), and their short names.
REFERENCES = (("bart", "bart"), ("linear", "lin"))
# LOCOST encoder time over the linear floor at 16K when issue 13 was opened: 20.4 s / 8.93 s = 2.284.
LOCOST_LINEAR_RATIO_BEFORE = 20.4 / 8.93
GIB = 1024  # MiB; "GB" in the targets is read as GiB, as in the earlier 16 GB target


def display_order(records, meta_runs=()):
    """The archs the runs asked for, in that order (each run's ``config.arch``, its ``--arch``: by
    default the registry's order), then any other arch of ``records`` in the order they came."""
    asked = (a for m in meta_runs for a in (m.get("config") or {}).get("arch") or ())
    order = []
    for arch in list(asked) + [r["arch"] for r in records]:
        if arch not in order:
            order.append(arch)
    return order


def row_table(records, rows=None):
    """{arch: display row} of every arch of ``records``, in display order: ``rows`` (run.py's, each
    completed with :data:`ROW_DEFAULTS`), then the records' other archs in the order they came."""
    table = {}
    for row in rows or ():
        table[row["arch"]] = dict(ROW_DEFAULTS, **row)
    for r in records:
        table.setdefault(r["arch"], dict(ROW_DEFAULTS, arch=r["arch"]))
    present = {r["arch"] for r in records}
    return {arch: row for arch, row in table.items() if arch in present}


def ok(records, arch, mode):
    rs = [r for r in records if r["arch"] == arch and r["mode"] == mode and r["status"] == "ok"]
    return sorted(rs, key=lambda r: r["length"])


def lookup(records, arch, mode, length):
    """The record of (arch, mode, length) whatever its status, or None."""
    for r in records:
        if (r["arch"], r["mode"], r["length"]) == (arch, mode, length):
            return r
    return None


def find(records, arch, mode, length):
    """The ok record of (arch, mode, length), or None."""
    r = lookup(records, arch, mode, length)
    return r if r is not None and r["status"] == "ok" else None


def slope(points):
    """Least-squares exponent b of y = a x^b over (x, y) points (None with < 2 usable points)."""
    pts = [(math.log(x), math.log(y)) for x, y in points if y and y > 0]
    if len(pts) < 2:
        return None
    mx = sum(p[0] for p in pts) / len(pts)
    my = sum(p[1] for p in pts) / len(pts)
    sxx = sum((p[0] - mx) ** 2 for p in pts)
    return sum((p[0] - mx) * (p[1] - my) for p in pts) / sxx


def growth_rows(records, rows=None):
    """Per mode and arch with >= 2 ok lengths: the log-log slopes of time and memory (all lengths and
    the last pair), beside the arch's expected exponent (its display row's ``growth``)."""
    table = row_table(records, rows)
    out = []
    for mode in MODES:
        for arch in table:
            rs = ok(records, arch, mode)
            if len(rs) < 2:
                continue
            t = [(r["length"], r["median_s"]) for r in rs]
            m = [(r["length"], r["activations_mb"]) for r in rs]
            last = lambda pts: slope(pts[-2:])  # noqa: E731
            out.append(
                {
                    "arch": arch,
                    "mode": mode,
                    "lengths": [r["length"] for r in rs],
                    "time_all": slope(t),
                    "time_last": last(t),
                    "mem_all": slope(m),
                    "mem_last": last(m),
                    "expected": table[arch]["growth"],
                }
            )
    return out


def fmt(x, spec=".2f"):
    return "-" if x is None else format(x, spec)


def growth_markdown(rows):
    out = [
        "| arch | mode | lengths | time exponent (all) | time exponent (last pair) | "
        "memory exponent (all) | memory exponent (last pair) | expected |",
        "|---|---|---|---:|---:|---:|---:|---|",
    ]
    for g in rows:
        lens = ", ".join(f"{n // 1024}K" for n in g["lengths"])
        out.append(
            f"| {g['arch']} | {g['mode']} | {lens} | {fmt(g['time_all'])} | {fmt(g['time_last'])} | "
            f"{fmt(g['mem_all'])} | {fmt(g['mem_last'])} | {g['expected']} |"
        )
    return "\n".join(out)


# ---------------------------------------------------------------------------------- tables
def ratios(records, r, key) -> str:
    """`` (0.74x bart, 1.49x lin)``: ``r[key]`` over each reference's at the same mode and length;
    a reference that was not measured (or is ``r`` itself) is left out, and so are the brackets
    when none is left."""
    parts = []
    for ref, short in REFERENCES:
        if r["arch"] == ref:
            continue
        x = find(records, ref, r["mode"], r["length"])
        if x is not None and x.get(key) and x[key] > 0:
            parts.append(f"{r[key] / x[key]:.2f}x {short}")
    return f" ({', '.join(parts)})" if parts else ""


def time_cell(records, r) -> str:
    """Median seconds, its ratios to ``bart`` and ``linear``, tokens/s for gen."""
    cell = f"{r['median_s']:.3g}" + ratios(records, r, "median_s")
    if r["mode"] == "gen":
        cell += f", {r['new_tokens_per_s']:.1f} tok/s"
    return cell


def memory_cell(records, r) -> str:
    """MiB above the weights, its ratios to ``bart`` and ``linear``, then `` / `` the absolute peak."""
    return f"{r['activations_mb']:,.0f}" + ratios(records, r, "activations_mb") + f" / {r['peak_mb']:,.0f}"


def _arch_rows(records, archs, lengths, mode, cell):
    """One table row per arch measured in ``mode``: ``cell(record)`` for ok records, the status word
    otherwise, blank where nothing was measured."""
    rows = []
    for arch in archs:
        cells, seen = [], False
        for n in lengths:
            r = lookup(records, arch, mode, n)
            if r is None:
                cells.append("")
                continue
            seen = True
            cells.append(cell(r) if r["status"] == "ok" else r["status"].split(":")[0])
        if seen:
            rows.append(f"| {arch} | " + " | ".join(cells) + " |")
    return rows


def tables_markdown(records, rows=None):
    lengths = sorted({r["length"] for r in records})
    archs = list(row_table(records, rows))
    head = "| arch | " + " | ".join(f"{n:,}" for n in lengths) + " |"
    rule = "|---|" + "---:|" * len(lengths)
    out = []
    for mode in MODES:
        if not any(r["mode"] == mode for r in records):
            continue
        out += [
            f"### {TITLES[mode]}",
            "",
            "Time, seconds (ratio to full-attention `bart` and to the `linear` floor, same length and mode):",
            "",
            head,
            rule,
        ]
        out += _arch_rows(records, archs, lengths, mode, lambda r: time_cell(records, r))
        out += [
            "",
            "Peak memory, MiB: above the resident weights (ratio to `bart` and to `linear`, above the "
            "weights too) / absolute peak:",
            "",
            head,
            rule,
        ]
        out += _arch_rows(records, archs, lengths, mode, lambda r: memory_cell(records, r))
        out.append("")
    ssm = [r for a in archs for r in ok(records, a, "enc") if "ssm_share" in r]
    if ssm:
        out += [
            "### LOCOST encoder: SSM kernel generation + FFT convolution",
            "",
            "| arch | length | encoder s (this call) | kernel generation s | FFT convolution etc. s | share |",
            "|---|---:|---:|---:|---:|---:|",
        ]
        for r in ssm:
            out.append(
                f"| {r['arch']} | {r['length']:,} | {r['ssm_total_s']:.3g} | {r['ssm_kernel_s']:.3g} | "
                f"{r['ssm_conv_s']:.3g} | {100 * r['ssm_share']:.1f}% |"
            )
        out.append(f"\n(FFT convolution etc. = {ssm[-1]['ssm_conv_is']})\n")
    return "\n".join(out)


# ---------------------------------------------------------------------------------- targets
MET, MISSED, NOT_MEASURED = "MET", "MISSED", "not measured"


def _absent(records, *keys) -> str:
    """Why a target could not be checked: which of the (arch, mode, length) records is missing or failed."""
    why = []
    for arch, mode, n in keys:
        r = lookup(records, arch, mode, n)
        if r is None:
            why.append(f"no {arch} {mode} {n // 1024}K record")
        elif r["status"] != "ok":
            why.append(f"{arch} {mode} {n // 1024}K: {r['status'][:80]}")
    return "; ".join(why)


CUDA_TARGETS = (
    "Issue 13's targets (and the earlier issues' kept here) are a CPU's, and these records are a GPU's: "
    "issues 32 and 33's targets are judged in the report of `benchmarks/gpu_check.sh` (`benchmarks/gpu_targets.py`)."
)


def target_checks(records, main_lsg="lsg_norm"):
    """The targets, each ``{"issue", "target", "measured", "verdict"}`` with verdict MET, MISSED or
    "not measured" (a record it needs is absent or failed; ``measured`` then says which).

    They are a CPU's and read CPU records only: a GPU run gets none (:data:`CUDA_TARGETS` says where
    its targets are judged), where it once got issue 13's CPU targets judged on the card's figures.

    Issue 13's "Done when" targets come first. Kept from the earlier issues: LSG memory growth (3),
    the LOCOST SSM share, 256K within 16 GB and memory growth (4), LED memory growth (6). Dropped:
    LSG encoder time <= 0.30x / 0.65x `bart` (3) and LED encoder <= 14 s at 16K (6), both superseded
    by the ratios to the `linear` floor below (and `bart` ratios are now in every table cell).
    """
    records = [r for r in records if not on_cuda(r)]
    if not records:
        return []
    rows = []

    def add(issue, target, measured, verdict):
        rows.append({"issue": issue, "target": target, "measured": measured, "verdict": verdict})

    def check(issue, target, keys, measure):
        """``measure(*records)`` -> (measured text, bool met), called when every key's record is ok."""
        recs = [find(records, *k) for k in keys]
        if any(r is None for r in recs):
            add(issue, target, _absent(records, *keys), NOT_MEASURED)
        else:
            text, met = measure(*recs)
            add(issue, target, text, MET if met else MISSED)

    # ---- issue 13
    for arch in (main_lsg, "led"):
        for n in (4096, 16384):
            check(
                13,
                f"`{arch}` encoder forward at {n // 1024}K <= 1.25x `linear`",
                [(arch, "enc", n), ("linear", "enc", n)],
                lambda a, lin: (
                    f"{a['median_s']:.2f} s / {lin['median_s']:.2f} s = {a['median_s'] / lin['median_s']:.2f}x",
                    a["median_s"] / lin["median_s"] <= 1.25,
                ),
            )
    for arch in (main_lsg, "led"):
        check(
            13,
            f"`{arch}` forward+backward peak memory above the weights at 16K <= 0.6x `bart`'s",
            [(arch, "train", 16384), ("bart", "train", 16384)],
            lambda a, b: (
                f"{a['activations_mb']:,.0f} MiB / {b['activations_mb']:,.0f} MiB = "
                f"{a['activations_mb'] / b['activations_mb']:.2f}x",
                a["activations_mb"] / b["activations_mb"] <= 0.6,
            ),
        )
    check(
        13,
        "`locost` encoder forward at 16K: peak RSS <= 2.0 GB",
        [("locost", "enc", 16384)],
        lambda r: (
            f"{r['peak_mb'] / GIB:.2f} GiB ({r['peak_mb']:,.0f} MiB; {r['activations_mb']:,.0f} MiB above the weights)",
            r["peak_mb"] <= 2.0 * GIB,
        ),
    )
    check(
        13,
        "`locost` encoder forward at 16K <= 2.284x `linear` (the ratio before: 20.4 s / 8.93 s)",
        [("locost", "enc", 16384), ("linear", "enc", 16384)],
        lambda r, lin: (
            f"{r['median_s']:.2f} s / {lin['median_s']:.2f} s = {r['median_s'] / lin['median_s']:.3f}x",
            r["median_s"] / lin["median_s"] <= LOCOST_LINEAR_RATIO_BEFORE,
        ),
    )
    target = "`locost` forward+backward at 16K without activation checkpointing completes within 16 GB peak"
    r = lookup(records, "locost", "train", 16384)
    if r is None:
        add(13, target, _absent(records, ("locost", "train", 16384)), NOT_MEASURED)
    elif r["status"] != "ok":  # died (out of memory) or timed out: the target is "completes"
        add(13, target, r["status"][:120], MISSED)
    else:
        add(
            13,
            target,
            f"{r['peak_mb'] / GIB:.2f} GiB peak, {r['median_s']:.1f} s",
            MET if r["peak_mb"] <= 16 * GIB else MISSED,
        )

    # ---- kept from issues 3, 4, 6
    check(
        3,
        f"`{main_lsg}` peak memory above weights, 4K -> 16K growth <= 4.5x",
        [(main_lsg, "enc", 4096), (main_lsg, "enc", 16384)],
        lambda a, b: (
            f"{a['activations_mb']:,.0f} -> {b['activations_mb']:,.0f} MiB = "
            f"{b['activations_mb'] / a['activations_mb']:.2f}x",
            b["activations_mb"] / a["activations_mb"] <= 4.5,
        ),
    )
    for arch, what in (
        ("locost", "kernels cached per FFT size, as inference runs"),
        ("locost_cold", "cache off: kernels generated in the call"),
    ):
        r = find(records, arch, "enc", 16384)
        target = f"LOCOST 16K ({what}): SSM kernel generation + FFT convolution <= 15% of encoder forward"
        if r is None or "ssm_share" not in r:
            add(4, target, _absent(records, (arch, "enc", 16384)) or "no SSM split in the record", NOT_MEASURED)
        else:
            add(
                4,
                target,
                f"({r['ssm_kernel_s']:.2f} + {r['ssm_conv_s']:.2f}) s / {r['ssm_total_s']:.2f} s = "
                f"{100 * r['ssm_share']:.1f}%",
                MET if r["ssm_share"] <= 0.15 else MISSED,
            )
    check(
        4,
        "LOCOST 262,144 tokens encoder forward within 16 GB peak RSS",
        [("locost", "enc", 262144)],
        lambda r: (f"{r['peak_mb'] / GIB:.2f} GiB peak, {r['median_s']:.1f} s", r["peak_mb"] <= 16 * GIB),
    )
    rs = ok(records, "locost", "enc")
    e = slope([(x["length"], x["activations_mb"]) for x in rs])
    if e is None:
        add(4, "LOCOST encoder memory growth ~linear (exponent <= 1.15)", "fewer than 2 ok lengths", NOT_MEASURED)
    else:
        add(
            4,
            "LOCOST encoder memory growth ~linear (exponent <= 1.15)",
            f"exponent {e:.2f} over " + ", ".join(f"{x['length'] // 1024}K" for x in rs),
            MET if e <= 1.15 else MISSED,
        )
    rs = ok(records, "led", "enc")
    e = slope([(x["length"], x["activations_mb"]) for x in rs][-2:])
    if e is None:
        add(
            6,
            "LED encoder memory linear in L (exponent of the last pair <= 1.15)",
            "fewer than 2 ok lengths",
            NOT_MEASURED,
        )
    else:
        add(
            6,
            "LED encoder memory linear in L (exponent of the last pair <= 1.15)",
            f"{e:.2f} ({rs[-2]['length'] // 1024}K -> {rs[-1]['length'] // 1024}K)",
            MET if e <= 1.15 else MISSED,
        )
    return rows


def checks_markdown(checks):
    out = ["| issue | target | measured | verdict |", "|---:|---|---|---|"]
    out += [f"| {c['issue']} | {c['target']} | {c['measured']} | {c['verdict']} |" for c in checks]
    return "\n".join(out)


# ---------------------------------------------------------------------------------- the report
def targets_markdown(checks) -> str:
    """The targets' section: the checks, or where a GPU run's targets are judged."""
    if not checks:
        return CUDA_TARGETS
    return (
        "Issue 13's targets first, then the earlier issues' that still apply (GB read as GiB).\n\n"
        + checks_markdown(checks)
    )


def report_markdown(records, meta_runs, growth, checks, rows=None):
    """The whole markdown; ``rows`` None: every arch with the defaults, in :func:`display_order`."""
    if rows is None:
        rows = [{"arch": a} for a in display_order(records, meta_runs)]
    last = meta_runs[-1] if meta_runs else {}
    loads = "; ".join(f"{m['started']}: {m['load_average_start']} -> {m.get('load_average_end')}" for m in meta_runs)
    md = [
        f"# Benchmark results ({last.get('device')}, {last.get('cpu')}, {last.get('threads')} threads, "
        f"torch {last.get('torch')}, {last.get('dtype')}, batch 1)",
        "",
        f"Load average (1/5/15 min) at start -> end of each run: {loads}",
        "",
        tables_markdown(records, rows),
        "### Growth exponents (log-log slope)",
        "",
        growth_markdown(growth),
        "",
    ]
    md += ["### Targets", "", targets_markdown(checks), ""] if records else []
    return "\n".join(md)


# colours for the rows that record none, taken in this order by the first that lack one
SPARE_COLORS = ("tab:purple", "tab:brown", "tab:pink", "tab:olive", "tab:cyan", "gold", "navy", "darkgreen")


def colors(table) -> dict:
    """{arch: colour} of a :func:`row_table`: each row's own, and for a row without one a spare colour
    that no other row has (matplotlib's next would repeat one of the rows' named colours)."""
    taken = {row["color"] for row in table.values() if row["color"]}
    spare = iter(c for c in SPARE_COLORS if c not in taken)
    return {arch: row["color"] or next(spare, None) for arch, row in table.items()}


def plot(records, path_stem, rows=None):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    modes = [m for m in MODES if any(r["mode"] == m and r["status"] == "ok" for r in records)]
    table = row_table(records, rows)
    color = colors(table)
    paths = []
    for what, key, ylabel in (("time", "median_s", "seconds"), ("memory", "activations_mb", "peak MiB above weights")):
        fig, axes = plt.subplots(1, len(modes), figsize=(5.2 * len(modes), 4.4), squeeze=False)
        for ax, mode in zip(axes[0], modes):
            for arch, row in table.items():
                rs = ok(records, arch, mode)
                if not rs:
                    continue
                ax.plot(
                    [r["length"] for r in rs],
                    [max(r[key], 1e-3) for r in rs],
                    linestyle=row["line"],
                    marker="o",
                    label=arch,
                    color=color[arch],  # the same in every panel and plot
                )
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_title({"enc": "encoder forward (no grad)", "train": "forward + backward", "gen": "generation"}[mode])
            ax.set_xlabel("input tokens")
            ax.set_ylabel(ylabel)
            ax.grid(True, which="both", alpha=0.3)
        for ax in axes[0]:
            ax.legend(fontsize=7)
        fig.tight_layout()
        path = f"{path_stem}_{what}.png"
        fig.savefig(path, dpi=80)
        plt.close(fig)
        paths.append(path)
    return paths
