"""The table of an interleaved A/B (``benchmarks/ab_commits.sh``): each arch's time as a ratio to
``linear`` (same commit, same round), old vs new, and whether the change is within the tolerance
of a structural change, ``max(5%, the spread of old vs old)``: the old commit's own round-to-round
spread of that ratio, (max - min) / mean, is what the machine's noise alone moves it.

    python benchmarks/ab_report.py RESULTS OLD NEW ROUNDS SECONDS LOAD_BEFORE LOAD_AFTER RUN_ARGS CPU

reads ``RESULTS/<commit>/round<r>.json`` (``benchmarks/run.py --out RESULTS/<commit> --tag round<r>``)
and prints Markdown. Pure Python: no torch.
"""

import json
import statistics
import sys

MIN_TOLERANCE = 0.05  # a change of the structure only may move a ratio this much, or the noise's spread


def read_rounds(root: str, commits, rounds: int) -> dict:
    """{(length, mode): {commit: {arch: [median_s per round]}}} of the rows that ran."""
    rows: dict = {}
    for c in commits:
        for r in range(1, rounds + 1):
            with open(f"{root}/{c}/round{r}.json", encoding="utf-8") as f:
                records = json.load(f)["records"]
            for rec in records:
                if rec["status"] == "ok":
                    key = (rec["length"], rec["mode"])
                    rows.setdefault(key, {}).setdefault(c, {}).setdefault(rec["arch"], []).append(rec["median_s"])
    return rows


def spread(values) -> float:
    return (max(values) - min(values)) / statistics.mean(values) if len(values) > 1 else 0.0


def comparisons(rows: dict, old: str, new: str):
    """[(length, mode, arch, old ratios, new ratios, change, tolerance)] for every arch but linear."""
    out = []
    for (length, mode), by_commit in sorted(rows.items()):
        for arch in sorted(by_commit[old]):
            if arch == "linear":
                continue
            ratios = [[t / lin for t, lin in zip(by_commit[c][arch], by_commit[c]["linear"])] for c in (old, new)]
            change = statistics.mean(ratios[1]) / statistics.mean(ratios[0]) - 1
            out.append((length, mode, arch, ratios[0], ratios[1], change, max(MIN_TOLERANCE, spread(ratios[0]))))
    return out


def render(rows: dict, old, new, rounds, secs, load0, load1, run_args, cpu) -> str:
    lines = [
        f"# Interleaved A/B: {old} (before) vs {new} (after)\n",
        f"`bash benchmarks/ab_commits.sh {old} {new} {rounds}` with run.py `{run_args}`; {rounds} rounds, "
        f"{old} and {new} taking turns to run first; {secs} s wall, load average {load0} -> {load1}; {cpu}.\n",
        "Time as a ratio to `linear` (same commit, same round); mean over rounds, each round in brackets. "
        f"Tolerance: max({MIN_TOLERANCE:.0%}, the spread of {old}'s rounds, (max - min) / mean).\n",
        f"| length | mode | arch | {old} | {new} | change | tolerance | within |",
        "|---|---|---|---:|---:|---:|---:|---|",
    ]

    def fmt(rs):
        return f"{statistics.mean(rs):.3f}x ({', '.join(f'{x:.3f}' for x in rs)})"

    for length, mode, arch, r_old, r_new, change, tol in comparisons(rows, old, new):
        within = "yes" if abs(change) <= tol else "NO"
        lines.append(
            f"| {length} | {mode} | {arch} | {fmt(r_old)} | {fmt(r_new)} | {change:+.1%} | {tol:.1%} | {within} |"
        )
    for (length, mode), by_commit in sorted(rows.items()):
        lin = [statistics.mean(by_commit[c]["linear"]) for c in (old, new)]
        lines.append(
            f"| {length} | {mode} | linear (s) | {lin[0]:.2f} | {lin[1]:.2f} | {lin[1] / lin[0] - 1:+.1%} | | |"
        )
    return "\n".join(lines) + "\n"


def main(argv) -> None:
    root, old, new, rounds, secs, load0, load1, run_args, cpu = argv
    rows = read_rounds(root, (old, new), int(rounds))
    sys.stdout.write(render(rows, old, new, rounds, secs, load0, load1, run_args, cpu))


if __name__ == "__main__":
    main(sys.argv[1:])
