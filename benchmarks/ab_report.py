"""The table of an interleaved A/B (``benchmarks/ab_commits.sh``): each arch's time as a ratio to
``linear`` (same commit, same round), old vs new, and whether the change is within the tolerance
of a structural change, ``max(5%, the spread of old vs old)``: the old commit's own round-to-round
spread of that ratio, (max - min) / mean, is what the machine's noise alone moves it.

    python benchmarks/ab_report.py RESULTS OLD NEW ROUNDS SECONDS LOAD_BEFORE LOAD_AFTER RUN_ARGS CPU

reads ``RESULTS/<commit>/round<r>.json`` (``benchmarks/run.py --out RESULTS/<commit> --tag round<r>``)
and prints Markdown. Pure Python: no torch.
"""

import json
import os
import statistics
import sys

MIN_TOLERANCE = 0.05  # a change of the structure only may move a ratio this much, or the noise's spread
USAGE = "usage: ab_report.py RESULTS OLD NEW ROUNDS SECONDS LOAD_BEFORE LOAD_AFTER RUN_ARGS CPU"


def read_rounds(root: str, commits, rounds: int) -> dict:
    """{(length, mode): {commit: {arch: {round: median_s}}}} of the rows that ran."""
    rows: dict = {}
    for c in commits:
        for r in range(1, rounds + 1):
            path = os.path.join(root, c, f"round{r}.json")
            try:
                with open(path, encoding="utf-8") as f:
                    records = json.load(f)["records"]
            except OSError as e:
                raise SystemExit(f"ab_report.py: error: {path}: {e.strerror} (did round {r} of {c} finish?)") from None
            except (ValueError, KeyError, TypeError):
                raise SystemExit(f"ab_report.py: error: {path}: not a run.py results file (no 'records')") from None
            for rec in records:
                if rec["status"] == "ok":
                    key = (rec["length"], rec["mode"])
                    rows.setdefault(key, {}).setdefault(c, {}).setdefault(rec["arch"], {})[r] = rec["median_s"]
    return rows


def spread(values) -> float:
    return (max(values) - min(values)) / statistics.mean(values) if len(values) > 1 else 0.0


def ratios(by_arch: dict, arch: str) -> list:
    """The arch's time over linear's, for each round in which both ran (a round where either failed
    pairs nothing: pairing by position would divide one round's time by another's)."""
    times, linear = by_arch.get(arch, {}), by_arch.get("linear", {})
    return [times[r] / linear[r] for r in sorted(times) if r in linear]


def comparisons(rows: dict, old: str, new: str):
    """[(length, mode, arch, old ratios, new ratios, change, tolerance)] for every arch but linear;
    change and tolerance are None when either commit has no round with the arch and linear."""
    out = []
    for (length, mode), by_commit in sorted(rows.items()):
        archs = sorted({a for c in (old, new) for a in by_commit.get(c, {})} - {"linear"})
        for arch in archs:
            r_old, r_new = (ratios(by_commit.get(c, {}), arch) for c in (old, new))
            if r_old and r_new:
                change = statistics.mean(r_new) / statistics.mean(r_old) - 1
                out.append((length, mode, arch, r_old, r_new, change, max(MIN_TOLERANCE, spread(r_old))))
            else:
                out.append((length, mode, arch, r_old, r_new, None, None))
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
        if not rs:
            return "did not run"
        return f"{statistics.mean(rs):.3f}x ({', '.join(f'{x:.3f}' for x in rs)})"

    for length, mode, arch, r_old, r_new, change, tol in comparisons(rows, old, new):
        if change is None:
            lines.append(f"| {length} | {mode} | {arch} | {fmt(r_old)} | {fmt(r_new)} | n/a | | not compared |")
            continue
        within = "yes" if abs(change) <= tol else "NO"
        lines.append(
            f"| {length} | {mode} | {arch} | {fmt(r_old)} | {fmt(r_new)} | {change:+.1%} | {tol:.1%} | {within} |"
        )
    for (length, mode), by_commit in sorted(rows.items()):
        lin = [list(by_commit.get(c, {}).get("linear", {}).values()) for c in (old, new)]
        if all(lin):
            old_s, new_s = (statistics.mean(x) for x in lin)
            change = new_s / old_s - 1
            lines.append(f"| {length} | {mode} | linear (s) | {old_s:.2f} | {new_s:.2f} | {change:+.1%} | | |")
    return "\n".join(lines) + "\n"


def main(argv) -> None:
    if len(argv) != 9:
        raise SystemExit(f"{USAGE}\nab_report.py: error: expected 9 arguments, got {len(argv)}")
    root, old, new, rounds, secs, load0, load1, run_args, cpu = argv
    if not rounds.isdigit() or int(rounds) < 1:
        raise SystemExit(f"{USAGE}\nab_report.py: error: ROUNDS={rounds}: expected a whole number >= 1")
    rows = read_rounds(root, (old, new), int(rounds))
    sys.stdout.write(render(rows, old, new, rounds, secs, load0, load1, run_args, cpu))


if __name__ == "__main__":
    main(sys.argv[1:])
