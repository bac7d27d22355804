#!/usr/bin/env python
"""Tables and the recall-vs-position plot of examples/long_context/run.sh (reads its $OUT).

Each row's hypotheses (the H-/D- lines of fairseq-generate) are copied to ``outputs/<row>.out`` next
to the table, so the committed numbers can be re-scored without training: regenerate the test
documents (run.sh's data step, seeded) and run ``scripts/key_recall.py --generate-output outputs/<row>.out``.
"""

import argparse
import json
import os
import shutil
import sys

from lsg_text.provenance import PACKAGES, git_stamp

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# what run.sh runs: a commit that touches none of these does not change the table
CODE_PATHS = (
    "examples/long_context/run.sh",
    "examples/long_context/common.sh",
    "examples/long_context/report.py",
    "examples/long_context/attention_probe.py",
    "scripts",
    *PACKAGES,
)

LABELS = {
    "local_8": "control: +-4-token window, no global (cannot mix)",
    "bart_1024": "BART, truncated to 1,024",
    "full_4096": "BART, full attention at 4,096 (upper bound)",
    "lsg_norm": "LSG-BART (norm) at 4,096",
    "lsg_none": "LSG-BART (none) at 4,096",
    "led": "LED at 4,096",
    "locost": "LOCOST at 4,096",
    "x_a_truncated": "(a) truncated to 1,024",
    "x_b_tiled_full": "(b) position table tiled to 4,096, full attention",
    "x_c_lsg": "(c) converted to LSG, no training",
    "x_d_lsg_global_tuned": "(d) (c) + global-only tuning",
    "x_e_lsg_fine_tuned": "(e) (c) + full fine-tuning",
}
EXTRAPOLATION = ["x_a_truncated", "x_b_tiled_full", "x_c_lsg", "x_d_lsg_global_tuned", "x_e_lsg_fine_tuned"]


def load(path, default=None):
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError):
        return default


def run_cost(out, name):
    """(wall seconds, peak RSS GiB) of a run's stages: $OUT/runs/NAME{.short,}/time = 'seconds KiB'."""
    wall, rss = 0.0, 0.0
    for stage in (f"{name}.short", name):
        t = os.path.join(out, "runs", stage, "time")
        if os.path.exists(t):
            parts = open(t).read().split()
            if len(parts) >= 2:
                wall += float(parts[-2])
                rss = max(rss, float(parts[-1]) / 2**20)
    return wall, rss


def pct(x):
    return "n/a" if x is None else f"{100 * x:.1f}"


def row(out, name, cost: bool):
    ev = os.path.join(out, "eval", name)
    rec = load(os.path.join(ev, "recall.json"), {})
    rouge = load(os.path.join(ev, "rouge.json"), {})
    probe = load(os.path.join(ev, "probe.json"), {})
    near = [b for b in rec.get("bins", []) if b["end"] <= rec.get("beyond", 1024)]
    near_facts = sum(b["facts"] for b in near)
    near_recall = (sum(b["recall"] * b["facts"] for b in near) / near_facts) if near_facts else None
    r = {
        "name": name,
        "recall": rec.get("recall"),
        "recall_before_1024": near_recall,
        "recall_beyond_1024": rec.get("recall_beyond"),
        "keys_beyond_1024": rec.get("keys_beyond"),
        "rouge1": rouge.get("rouge1"),
        "rouge2": rouge.get("rouge2"),
        "rougeL": rouge.get("rougeL"),
        "attention_on_keys": probe.get("mass_on_keys"),
        "bins": rec.get("bins", []),
        "chance": rec.get("chance"),
    }
    if cost:
        r["train_wall_s"], r["peak_rss_gib"] = run_cost(out, name)
    return r


def fmt(x, f="{:.1f}"):
    return "n/a" if x is None else f.format(x)


def table(rows, cost: bool):
    head = (
        "| model | key recall, keys < 1,024 | key recall, keys >= 1,024 | all keys | ROUGE-1/2/L | attention on keys |"
    )
    sep = "|---|---:|---:|---:|---|---:|"
    if cost:
        head += " train wall (s) | peak RSS (GiB) |"
        sep += "---:|---:|"
    lines = [head, sep]
    for r in rows:
        line = (
            f"| {LABELS.get(r['name'], r['name'])} | {pct(r['recall_before_1024'])} | "
            f"{pct(r['recall_beyond_1024'])} | {pct(r['recall'])} | "
            f"{fmt(r['rouge1'])} / {fmt(r['rouge2'])} / {fmt(r['rougeL'])} | {pct(r['attention_on_keys'])} |"
        )
        if cost:
            line += f" {fmt(r.get('train_wall_s'), '{:.0f}')} | {fmt(r.get('peak_rss_gib'), '{:.2f}')} |"
        lines.append(line)
    return "\n".join(lines)


def plot(rows, path, chance):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    for r in rows:
        bins = [b for b in r["bins"] if b["facts"]]
        if not bins:
            continue
        x = [(b["start"] + b["end"]) / 2 for b in bins]
        y = [100 * b["recall"] for b in bins]
        ax.plot(x, y, marker="o", label=LABELS.get(r["name"], r["name"]))
    if chance:
        ax.axhline(100 * chance, color="grey", linestyle=":", label="chance (uniform guess)")
    ax.axvline(1024, color="black", linestyle="--", linewidth=0.8)
    ax.text(1040, 50, "1,024 tokens", rotation=90, va="center", fontsize=8)
    ax.set_xlabel("position of the key sentence in the source (tokens; bins of 512)")
    ax.set_ylabel("key facts recalled (%)")
    ax.set_ylim(-2, 102)
    ax.set_title("Recall of key facts vs their position, 4K-token test documents")
    ax.legend(fontsize=7, loc="lower left")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--out", required=True)
    p.add_argument("--report-dir", required=True)
    p.add_argument("--archs", nargs="+", required=True)
    p.add_argument("--command", default="")
    p.add_argument("--settings", default="")
    p.add_argument("--wall", type=int, default=0)
    p.add_argument("--load", default="n/a", help="load average at the start -> at the end")
    args = p.parse_args(argv)
    # a mistyped --out: refused before --report-dir (by default the committed results) is rewritten n/a
    evaluated = [a for a in args.archs if os.path.isdir(os.path.join(args.out, "eval", a))]
    if not evaluated:
        p.error(f"--out {args.out}: no evaluation of run.sh there ({args.out}/eval/ARCH for none of --archs)")
    os.makedirs(args.report_dir, exist_ok=True)
    main_rows = [row(args.out, a, cost=True) for a in args.archs]
    x_rows = [row(args.out, x, cost=False) for x in EXTRAPOLATION if os.path.isdir(os.path.join(args.out, "eval", x))]
    chance = next((r["chance"] for r in main_rows + x_rows if r["chance"]), None)
    commit = git_stamp(REPO, CODE_PATHS)
    outputs = os.path.join(args.report_dir, "outputs")
    os.makedirs(outputs, exist_ok=True)
    for r in main_rows + x_rows:
        hyps = os.path.join(args.out, "eval", r["name"], "hypotheses.out")
        if os.path.exists(hyps):
            shutil.copyfile(hyps, os.path.join(outputs, r["name"] + ".out"))
    md = [
        "# Long-context results (generated by report.py; do not edit by hand)",
        "",
        f"Command: `{args.command}` ({args.settings}), code at commit {commit}; wall time {args.wall} s; "
        f"load average {args.load}. Chance recall (uniform guess per fact): {pct(chance)}%. "
        "Hypotheses of every row: `outputs/`.",
        "",
        "## Every architecture, same budget",
        "",
        table(main_rows, cost=True),
        "",
        "Recall counts the four facts of each key (colour, animal, city, weekday), compared slot by slot",
        "with the generated summary's key sentence of the same rank; greedy decoding. 'attention on keys':",
        "share of the last decoder layer's cross-attention on the key sentences' pieces when the decoder",
        "writes a fact (teacher-forced, 16 test documents; uniform attention would put ~0.2% there).",
        "Train wall / peak RSS: both stages (short + long documents), fairseq-train's own process.",
    ]
    if x_rows:
        md += [
            "",
            "## Extrapolation (LSG paper sections 4-5, small scale)",
            "",
            "BART trained at 1,024 tokens on short then mid-length documents only (keys within 1,024), then",
            "evaluated on the same 4K-token test documents:",
            "",
            table(x_rows, cost=False),
        ]
    with open(os.path.join(args.report_dir, "results.md"), "w", encoding="utf-8") as f:
        f.write("\n".join(md) + "\n")
    with open(os.path.join(args.report_dir, "results.json"), "w", encoding="utf-8") as f:
        json.dump(
            {
                "settings": args.settings,
                "commit": commit,
                "load": args.load,
                "wall_s": args.wall,
                "rows": main_rows,
                "extrapolation": x_rows,
            },
            f,
            indent=1,
        )
    plot(main_rows, os.path.join(args.report_dir, "recall_vs_position.png"), chance)
    if x_rows:
        plot(x_rows, os.path.join(args.report_dir, "extrapolation_recall_vs_position.png"), chance)
    print("\n".join(md))
    return 0


if __name__ == "__main__":
    sys.exit(main())
