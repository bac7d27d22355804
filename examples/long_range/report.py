#!/usr/bin/env python
"""Score and tabulate examples/long_range/run.sh from its committed raw outputs.

Everything here is re-computable from ``outputs/``: ``<variant>/data.json`` holds the
make_synthetic_data.py flags of the scored documents (regenerated here, byte-identical, so no
data file is committed) and ``<variant>/<row>.seed<s>.txt`` one greedy hypothesis per document.

Per cell: whole-summary exact match (every key, in order, nothing else) and per-slot recall, as
the mean over seeds, with a 95% percentile bootstrap interval over the scored documents, pooled over
seeds (a resample draws documents; each drawn document brings its hypotheses of every seed).
"Far" slots are the ones a model can only fill by reading 1,024+ words away: for ``binding`` the
colour and animal (bound >= 1,024 words before the use sentence); for ``retrieval`` every slot of
the keys past word 1,024; for ``count`` the count of an animal whose mentions span 1,024+ words; for
``order`` every slot (consecutive arrivals are 1,024+ words apart).
A long row "beats the control" when its exact match is >= 20 points above ``local_8``'s and the two
intervals do not overlap; as a weaker, second reading, its far slots are "above the control" when
the far-slot recall intervals (same bootstrap) do not overlap.

    python examples/long_range/report.py --outputs examples/long_range/outputs --report-dir examples/long_range \\
        --variants retrieval binding --rows local_8 ... --seeds 1 2 3 --split test --n-docs 60
    python examples/long_range/report.py extract GENERATE_OUT N HYPOTHESES   # run.sh's per-run step
"""
import argparse
import importlib.util
import json
import math
import os
import random
import re
import statistics
import sys

from lsg_text import provenance
from lsg_text.synthetic import (
    FIELDS,
    count_hits,
    exact_match,
    key_hits,
    make_split,
    order_hits,
    parse_key_sentences,
    parse_order,
)

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
CONTROL = "local_8"
FAR_WORDS = 1024
BOOTSTRAP = 2000
LABELS = {
    "local_8": "control: +-4-token window, no global (cannot mix)",
    "bart_1024": "BART truncated to 1,024",
    "full_4096": "BART, full attention at 4,096",
    "lsg_norm": "LSG-BART (norm) at 4,096",
    "lsg_wide": "LSG-BART (norm), sparse keys reaching all 4,096",
    "led": "LED at 4,096",
    "locost": "LOCOST at 4,096",
}


def extract(generate_out: str, n: int, path: str) -> None:
    """One best hypothesis per document id 0..n-1 (empty line where fairseq-generate wrote none)."""
    from lsg_text.generate_output import parse_generate_output

    with open(generate_out, encoding="utf-8") as f:
        generated = parse_generate_output(f, generate_out)
    with open(path, "w", encoding="utf-8") as f:
        for i in range(n):
            hyp = generated[i].best_hypothesis if i in generated else None
            f.write(" ".join((hyp or "").split()) + "\n")


def scored_documents(data_json: str, split: str, n: int):
    """The scored split, regenerated from the flags run.sh gave make_synthetic_data.py."""
    spec = importlib.util.spec_from_file_location("mksyn", os.path.join(REPO, "scripts", "make_synthetic_data.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    with open(data_json, encoding="utf-8") as f:
        a = mod.build_parser().parse_args(["--output-dir", "-", *json.load(f)["flags"]])
    return list(make_split(split, n, a.seed, mod.config_from_args(a)))


def score_document(example: dict, hypothesis: str, variant: str) -> dict:
    """exact (0/1), slot hits and far-slot hits of one hypothesis."""
    hits = {"count": count_hits, "order": order_hits}.get(variant, key_hits)(example["keys"], hypothesis)
    far = []
    for key, h in zip(example["keys"], hits):
        if variant == "binding":
            far += [h["colour"], h["animal"]]
        elif variant == "order":
            far += [h["animal"]]
        elif variant == "count":
            far += [h["count"]] if key["mentions"][-1] - key["mentions"][0] >= FAR_WORDS else []
        elif key["token_offset"] >= FAR_WORDS:
            far += [h[f] for f in FIELDS]
    return {"exact": float(exact_match(example["summary"], hypothesis)),
            "slots": [x for h in hits for x in h.values()], "far": far}


_BOUND_RE = re.compile(r"The \S+ (\S+) is called \S+\.")


def binding_choice(examples, hyps_by_seed) -> dict:
    """Does a model bind, or copy any bound animal? Over every key slot of every seed: how often the
    written animal is one of the document's bound animals, how often it is the right one among those,
    and what picking one of them at random would give (the mean of 1 / bound animals)."""
    written = right = slots = 0
    baseline = []
    for hyps in hyps_by_seed:
        for ex, hyp in zip(examples, hyps):
            bound = _BOUND_RE.findall(ex["document"])
            generated = parse_key_sentences(hyp)
            for i, key in enumerate(ex["keys"]):
                slots += 1
                if i < len(generated) and generated[i]["animal"] in bound:
                    written += 1
                    right += generated[i]["animal"] == key["animal"]
                    baseline.append(1 / len(bound))
    return {"bound_animal_written": written / slots, "right_among_bound": right / written if written else None,
            "random_bound_pick": statistics.mean(baseline) if baseline else None}


def order_choice(examples, hyps_by_seed) -> dict:
    """Order, or copying? Over every hypothesis of every seed: how often it names exactly the document's
    arriving animals, and how often those are in the right order, against 1 / n! for a random order."""
    named = right = 0
    baseline = []
    for hyps in hyps_by_seed:
        for ex, hyp in zip(examples, hyps):
            truth = [k["animal"] for k in ex["keys"]]
            order = parse_order(hyp)
            if sorted(order) == sorted(truth):
                named += 1
                right += order == truth
                baseline.append(1 / math.factorial(len(truth)))
    n = sum(len(h) for h in hyps_by_seed)
    return {"right_animals": named / n, "right_order_among_those": right / named if named else None,
            "random_order": statistics.mean(baseline) if baseline else None}


def cell(scores_by_seed, rng: random.Random) -> dict:
    """Mean over seeds and a pooled document bootstrap of exact match, per-slot and far-slot recall."""
    n = len(scores_by_seed[0])

    def stats(docs):
        exact = statistics.mean(s[d]["exact"] for s in scores_by_seed for d in docs)
        slots = [x for s in scores_by_seed for d in docs for x in s[d]["slots"]]
        far = [x for s in scores_by_seed for d in docs for x in s[d]["far"]]
        return exact, sum(slots) / len(slots), (sum(far) / len(far) if far else None)

    exact, slots, far = stats(range(n))
    boot = [stats([rng.randrange(n) for _ in range(n)]) for _ in range(BOOTSTRAP)]

    def interval(values):
        values = sorted(v for v in values if v is not None)
        return [values[int(0.025 * len(values))], values[int(0.975 * len(values)) - 1]] if values else None

    per_seed = [statistics.mean(d["exact"] for d in s) for s in scores_by_seed]
    return {"exact": exact, "exact_ci": interval(b[0] for b in boot), "exact_per_seed": per_seed,
            "slot_recall": slots, "far_recall": far, "far_ci": interval(b[2] for b in boot)}


# what the experiment runs: a commit that touches none of these (a README, say) does not change it
CODE_PATHS = ("examples/long_range/run.sh", "examples/long_range/report.py", "examples/long_context/common.sh",
              "lsg_text", "lsg_fairseq", "scripts")  # not the generated tables and outputs


def report(args) -> int:
    rng = random.Random(0)
    results = {"split": args.split, "n_docs": args.n_docs, "seeds": args.seeds,
               "commit": provenance.git_stamp(REPO, CODE_PATHS),
               "wall_s": args.wall, "load": args.load, "settings": args.settings, "variants": {}}
    for v in args.variants:
        examples = scored_documents(os.path.join(args.outputs, v, "data.json"), args.split, args.n_docs)
        rows = {}
        for row in args.rows:
            by_seed, hyps_by_seed = [], []
            for seed in args.seeds:
                with open(os.path.join(args.outputs, v, f"{row}.seed{seed}.txt"), encoding="utf-8") as f:
                    hyps = f.read().split("\n")[: len(examples)]
                if len(hyps) != len(examples):
                    print(f"report.py: error: {f.name}: {len(hyps)} hypotheses for {len(examples)} documents",
                          file=sys.stderr)
                    return 2
                by_seed.append([score_document(ex, h, v) for ex, h in zip(examples, hyps)])
                hyps_by_seed.append(hyps)
            rows[row] = cell(by_seed, rng)
            if v == "binding":
                rows[row]["binding_choice"] = binding_choice(examples, hyps_by_seed)
            if v == "order":
                rows[row]["order_choice"] = order_choice(examples, hyps_by_seed)
        ctrl = rows.get(CONTROL)
        for row, c in rows.items():
            c["beats_control"] = None if ctrl is None or row == CONTROL else (
                c["exact"] - ctrl["exact"] >= 0.20 and c["exact_ci"][0] > ctrl["exact_ci"][1])
            # a weaker, second reading: far-slot recall above the control's, intervals disjoint
            c["far_above_control"] = None if ctrl is None or row == CONTROL or not c["far_ci"] else (
                c["far_ci"][0] > ctrl["far_ci"][1])
        results["variants"][v] = rows
    os.makedirs(args.report_dir, exist_ok=True)
    with open(os.path.join(args.report_dir, "results.json"), "w", encoding="utf-8") as f:
        json.dump(results, f, indent=1)
    md = markdown(results, args.command)
    with open(os.path.join(args.report_dir, "results.md"), "w", encoding="utf-8") as f:
        f.write(md)
    plot(results, os.path.join(args.report_dir, "exact_match.png"))
    print(md)
    return 0


def markdown(r: dict, command: str) -> str:
    pct = lambda x: "n/a" if x is None else f"{100 * x:.1f}%"  # noqa: E731
    out = ["# Long range: results (generated by report.py; do not edit by hand)", "",
           f"Command: `{command}`, code at commit {r['commit']}; {r['wall_s']} s wall, load average {r['load']};",
           f"{r['settings']}.", "",
           f"Each cell: the mean over seeds {', '.join(map(str, r['seeds']))} on the same {r['n_docs']} "
           f"{r['split']} documents, with a 95% bootstrap interval over documents ({BOOTSTRAP} resamples, "
           "pooled over seeds). Exact = the whole summary right (every key, in order, no decoy); far slots: "
           "binding's colour + animal (bound >= 1,024 words before the use), retrieval's slots of keys past "
           "word 1,024, count's counts of animals whose mentions span 1,024+ words, every order slot. "
           "Beats control: exact "
           ">= 20 points above local_8's, intervals disjoint (the issue's test); far slots above control: the "
           "far-slot recall intervals disjoint, a weaker reading.", ""]
    for v, rows in r["variants"].items():
        out += [f"## {v}", "",
                "| row | exact match [95% CI] | per seed | beats control | slot recall "
                "| far-slot recall [95% CI] | far slots above control |",
                "|---|---:|---|:-:|---:|---:|:-:|"]
        yes_no = {None: "", True: "yes", False: "no"}
        for row, c in rows.items():
            lo, hi = c["exact_ci"]
            far = pct(c["far_recall"]) + (f" [{pct(c['far_ci'][0])}, {pct(c['far_ci'][1])}]" if c["far_ci"] else "")
            out.append(f"| {LABELS.get(row, row)} | {pct(c['exact'])} [{pct(lo)}, {pct(hi)}] | "
                       f"{' / '.join(pct(x) for x in c['exact_per_seed'])} | {yes_no[c['beats_control']]} | "
                       f"{pct(c['slot_recall'])} | {far} | {yes_no[c['far_above_control']]} |")
        if any("binding_choice" in c for c in rows.values()):
            out += ["", "Binding or copying? When a row writes one of the document's bound animals, is it the right "
                    "one more often than a random pick among them?", "",
                    "| row | a bound animal written | right among those | random pick among bound |",
                    "|---|---:|---:|---:|"]
            for row, c in rows.items():
                b = c["binding_choice"]
                out.append(f"| {LABELS.get(row, row)} | {pct(b['bound_animal_written'])} | "
                           f"{pct(b['right_among_bound'])} | {pct(b['random_bound_pick'])} |")
        if any("order_choice" in c for c in rows.values()):
            out += ["", "Order, or copying? Of the summaries naming exactly the document's arriving animals, how many "
                    "put them in the right order, against a random order?", "",
                    "| row | the right animals | right order among those | random order |", "|---|---:|---:|---:|"]
            for row, c in rows.items():
                o = c["order_choice"]
                out.append(f"| {LABELS.get(row, row)} | {pct(o['right_animals'])} | "
                           f"{pct(o['right_order_among_those'])} | {pct(o['random_order'])} |")
        out.append("")
    return "\n".join(out)


def plot(r: dict, path: str) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    variants = list(r["variants"])
    fig, axes = plt.subplots(1, len(variants), figsize=(5.5 * len(variants), 3.8), squeeze=False)
    for ax, v in zip(axes[0], variants):
        rows = r["variants"][v]
        names = list(rows)
        ys = [100 * rows[n]["exact"] for n in names]
        err = [[y - 100 * rows[n]["exact_ci"][0] for n, y in zip(names, ys)],
               [100 * rows[n]["exact_ci"][1] - y for n, y in zip(names, ys)]]
        ax.bar(names, ys, yerr=err, capsize=4, color=["grey" if n == CONTROL else "tab:blue" for n in names])
        ax.set_title(f"{v}: exact match, 95% CI ({r['split']})")
        ax.set_ylim(0, 100)
        ax.tick_params(axis="x", rotation=30)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["extract"]:
        if len(argv) != 4:
            print("report.py: error: usage: report.py extract GENERATE_OUT N HYPOTHESES", file=sys.stderr)
            return 2
        extract(argv[1], int(argv[2]), argv[3])
        return 0
    p = argparse.ArgumentParser(prog="report.py", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--outputs", required=True)
    p.add_argument("--report-dir", required=True)
    p.add_argument("--split", default="test", choices=["test", "valid"])
    p.add_argument("--n-docs", type=int, required=True)
    p.add_argument("--variants", nargs="+", required=True)
    p.add_argument("--rows", nargs="+", required=True)
    p.add_argument("--seeds", nargs="+", type=int, required=True)
    p.add_argument("--command", default="bash examples/long_range/run.sh")
    p.add_argument("--wall", default="?")
    p.add_argument("--load", default="?")
    p.add_argument("--settings", default="")
    return report(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
