#!/usr/bin/env python
"""Score and tabulate examples/long_range/run.sh from its committed raw outputs.

Everything here is re-computable from ``outputs/``: ``<variant>/data.json`` holds the
make_synthetic_data.py flags of the scored documents (regenerated here, byte-identical, so no
data file is committed) and ``<variant>/<row>.seed<s>.txt`` one greedy hypothesis per document.

Per cell: whole-summary exact match (every key, in order, nothing else) and per-slot recall, as
the mean over seeds, with two 95% percentile bootstrap intervals. The first resamples the scored
documents only, pooled over seeds (a resample draws documents; each drawn document brings its
hypotheses of every seed): it says how the number moves with other test documents, the trained
models fixed. The second is hierarchical: it draws the seeds (with replacement, as many as were run),
then the documents, so it also moves with the training seed (with 3 seeds, 10 distinct seed draws: a
coarse interval).
"Far" slots are the ones a model can only fill by reading 1,024+ words away: for ``binding`` the
colour and animal (bound >= 1,024 words before the use sentence); for ``retrieval`` every slot of
the keys past word 1,024; for ``count`` the count of an animal whose mentions span 1,024+ words; for
``order`` every slot (consecutive arrivals are 1,024+ words apart).
A long row "beats the control" when its exact match is >= 20 points above ``local_8``'s and the two
intervals do not overlap, read once with each interval; as a weaker, second reading, its far slots
are "above the control" when the far-slot recall intervals (document bootstrap) do not overlap.

``order`` tables carry one more row, ``position_only``: no model, each arrival ranked by its own word
offset alone (``lsg_text.synthetic.position_rule``, fitted on the training split that run.sh's long
stage trained on, regenerated from the same flags; scored on the scored split). Where a long row scores no higher,
the table cannot tell it from a reader that only knows roughly where each arrival lies.

    python examples/long_range/report.py --outputs examples/long_range/outputs --report-dir examples/long_range \\
        --variants retrieval binding --rows local_8 ... --seeds 1 2 3 --split test --n-docs 50
    python examples/long_range/report.py ... --provenance-from examples/long_range/order3/results.json
                                          # re-score committed outputs, keeping the run's stamp
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
from lsg_text.argtypes import POSITIVE_INT
from lsg_text.atomic import atomic_outputs
from lsg_text.errors import ConfigError, OneLineArgumentParser, UserError
from lsg_text.errors import report as report_error
from lsg_text.fileio import check_output_path, require_file
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
from lsg_text.synthetic.position_rule import fit_position_rule, position_rule_scores

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
PROG = "report.py"
CONTROL = "local_8"
POSITION_ONLY = "position_only"  # the order tables' reference row: no model (fit_position_rule)
N_TRAIN = 1500  # run.sh's N_LONG: the long-stage training documents, on which position_only is fitted
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
    POSITION_ONLY: "position only: each arrival ranked by its own word offset (no model)",
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
    try:
        with open(data_json, encoding="utf-8") as f:
            flags = json.load(f)["flags"]
    except (ValueError, KeyError, TypeError) as e:
        raise ConfigError(f"{data_json}: not the data.json run.sh writes ({type(e).__name__}: {e})") from None
    a = mod.build_parser().parse_args(["--output-dir", "-", *flags])
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
    return {
        "exact": float(exact_match(example["summary"], hypothesis)),
        "slots": [x for h in hits for x in h.values()],
        "far": far,
    }


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
    return {
        "bound_animal_written": written / slots,
        "right_among_bound": right / written if written else None,
        "random_bound_pick": statistics.mean(baseline) if baseline else None,
    }


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
    return {
        "right_animals": named / n,
        "right_order_among_those": right / named if named else None,
        "random_order": statistics.mean(baseline) if baseline else None,
    }


def cell(scores_by_seed, rng: random.Random, seed_rng: random.Random) -> dict:
    """Mean over seeds, a pooled document bootstrap of exact match, per-slot and far-slot recall (``rng``),
    and a hierarchical bootstrap of exact match, seeds then documents (``seed_rng``)."""
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

    k = len(scores_by_seed)
    exact_ci = interval(b[0] for b in boot)
    seed_boot = []
    for _ in range(BOOTSTRAP if k > 1 else 0):  # one seed: nothing more to draw, the same interval
        seeds = [scores_by_seed[seed_rng.randrange(k)] for _ in range(k)]
        docs = [seed_rng.randrange(n) for _ in range(n)]
        seed_boot.append(statistics.mean(s[d]["exact"] for s in seeds for d in docs))
    per_seed = [statistics.mean(d["exact"] for d in s) for s in scores_by_seed]
    return {
        "exact": exact,
        "exact_ci": exact_ci,
        "exact_ci_seeds": interval(seed_boot) if k > 1 else exact_ci,
        "exact_per_seed": per_seed,
        "slot_recall": slots,
        "far_recall": far,
        "far_ci": interval(b[2] for b in boot),
    }


# what the experiment runs: a commit that touches none of these (a README, say) does not change it
CODE_PATHS = (
    "examples/long_range/run.sh",
    "examples/long_range/report.py",
    "examples/long_context/common.sh",
    "scripts",
    *provenance.PACKAGES,
)  # not the generated tables and outputs


def position_only_cell(examples, fit_examples, n_train: int, variant: str) -> dict:
    """The ``order`` tables' reference row: the position-only rule fitted on ``fit_examples``, scored on
    ``examples`` like a row with one seed (its own bootstrap streams: the model rows' intervals are the
    same with or without it). It is handed the animals: "the right animals" is 100% by construction."""
    rule = fit_position_rule(fit_examples)
    c = cell(
        [position_rule_scores(examples, rule)],
        random.Random(f"{variant}/{POSITION_ONLY}"),
        random.Random(f"{variant}/{POSITION_ONLY}/seeds"),
    )
    c["rule"] = {str(n): r for n, r in rule.items()}
    c["rule_fitted_on"] = f"the first {n_train:,} train documents"
    c["order_choice"] = {
        "right_animals": 1.0,
        "right_order_among_those": c["exact"],
        "random_order": statistics.mean(1 / math.factorial(len(ex["keys"])) for ex in examples),
    }
    return c


def _beats(c: dict, ctrl: dict, ci: str) -> bool:
    """The issue's test: exact >= 20 points above the control's, the ``ci`` intervals disjoint."""
    return c["exact"] - ctrl["exact"] >= 0.20 and c[ci][0] > ctrl[ci][1]


def provenance_of(args) -> dict:
    """Where the table's outputs came from: the run's command, commit, machine, wall time and load
    (``--provenance-from`` a committed results.json when re-scoring its outputs), and the scorer's commit."""
    scored_at = provenance.git_stamp(REPO, CODE_PATHS)
    p = {
        "command": args.command,
        "trained_at": args.trained_at,
        "machine": args.machine,
        "wall_s": args.wall,
        "load": args.load,
        "settings": args.settings,
    }
    if args.provenance_from:
        try:
            with open(args.provenance_from, encoding="utf-8") as f:
                old = json.load(f)
        except (OSError, ValueError) as e:
            raise ConfigError(f"--provenance-from {args.provenance_from}: {e}") from e
        given = {k: v for k, v in p.items() if v is not None}
        p = {k: old.get(k) for k in p}
        p["trained_at"] = old.get("trained_at") or old.get("commit")
        p.update(given)
    if p["trained_at"] is None:  # run.sh's own call: trained here, at this code
        p["trained_at"] = scored_at
        p["machine"] = p["machine"] or f"{provenance.cpu_name()}, {os.cpu_count()} cores"
    defaults = {
        "command": "bash examples/long_range/run.sh",
        "machine": "not recorded",
        "wall_s": "?",
        "load": "?",
        "settings": "",
    }
    return {
        **{k: p[k] if p[k] is not None else defaults[k] for k in defaults},
        "trained_at": p["trained_at"],
        "commit": scored_at,
    }


def hypotheses_path(args, variant: str, row: str, seed: int) -> str:
    return os.path.join(args.outputs, variant, f"{row}.seed{seed}.txt")


def check_inputs(args) -> None:
    """Every file the table reads, and the report folder, checked before anything is scored: a
    missing seed of the last row is named at once, not after the others' scoring."""
    for v in args.variants:
        require_file(os.path.join(args.outputs, v, "data.json"), f"--outputs (variant {v!r})")
        for row in args.rows:
            for seed in args.seeds:
                require_file(hypotheses_path(args, v, row, seed), f"--outputs (row {row!r}, seed {seed})")
    if args.fit_data:
        require_file(args.fit_data, "--fit-data")
    check_output_path(args.report_dir, "--report-dir", folder=True)


def report(args) -> int:
    check_inputs(args)
    rng = random.Random(0)
    results = {"split": args.split, "n_docs": args.n_docs, "seeds": args.seeds, **provenance_of(args), "variants": {}}
    for v in args.variants:
        data_json = os.path.join(args.outputs, v, "data.json")
        examples = scored_documents(data_json, args.split, args.n_docs)
        rows = {}
        for row in args.rows:
            by_seed, hyps_by_seed = [], []
            for seed in args.seeds:
                with open(hypotheses_path(args, v, row, seed), encoding="utf-8") as f:
                    hyps = f.read().split("\n")[: len(examples)]
                if len(hyps) != len(examples):
                    raise ConfigError(f"{f.name}: {len(hyps)} hypotheses for {len(examples)} documents")
                by_seed.append([score_document(ex, h, v) for ex, h in zip(examples, hyps)])
                hyps_by_seed.append(hyps)
            rows[row] = cell(by_seed, rng, random.Random(f"{v}/{row}/seeds"))
            if v == "binding":
                rows[row]["binding_choice"] = binding_choice(examples, hyps_by_seed)
            if v == "order":
                rows[row]["order_choice"] = order_choice(examples, hyps_by_seed)
        if v == "order":  # the reference row, right after the control (first where there is none)
            fit = scored_documents(args.fit_data or data_json, "train", args.n_train)
            ref = position_only_cell(examples, fit, args.n_train, v)
            ref["rule_fitted_on"] += f" of {os.path.relpath(args.fit_data or data_json, REPO)}'s flags"
            at = list(rows).index(CONTROL) + 1 if CONTROL in rows else 0
            items = list(rows.items())
            rows = dict(items[:at] + [(POSITION_ONLY, ref)] + items[at:])
        ctrl = rows.get(CONTROL)
        for row, c in rows.items():
            c["beats_control"] = None if ctrl is None or row == CONTROL else _beats(c, ctrl, "exact_ci")
            c["beats_control_seeds"] = None if ctrl is None or row == CONTROL else _beats(c, ctrl, "exact_ci_seeds")
            # a weaker, second reading: far-slot recall above the control's, intervals disjoint
            c["far_above_control"] = (
                None if ctrl is None or row == CONTROL or not c["far_ci"] else (c["far_ci"][0] > ctrl["far_ci"][1])
            )
        results["variants"][v] = rows
    md = markdown(results)
    names = [os.path.join(args.report_dir, name) for name in ("results.json", "results.md")]
    with atomic_outputs(names) as (js, f):  # both or neither: the md is the json's table
        json.dump(results, js, indent=1)
        f.write(md)
    plot(results, os.path.join(args.report_dir, "exact_match.png"))
    print(md)
    return 0


def markdown(r: dict) -> str:
    pct = lambda x: "n/a" if x is None else f"{100 * x:.1f}%"  # noqa: E731
    ci = lambda lo_hi: f"[{pct(lo_hi[0])}, {pct(lo_hi[1])}]"  # noqa: E731
    where = (
        f"trained and decoded at commit {r['trained_at']} on {r['machine']}"
        if r["trained_at"] != r["commit"]
        else f"code at commit {r['commit']} on {r['machine']}"
    )
    scored = "" if r["trained_at"] == r["commit"] else f" Scored by report.py at commit {r['commit']}."
    out = [
        "# Long range: results (generated by report.py; do not edit by hand)",
        "",
        f"Command: `{r['command']}`, {where}; {r['wall_s']} s wall, load average {r['load']};",
        f"{r['settings']}.{scored}",
        "",
        f"Each cell: the mean over seeds {', '.join(map(str, r['seeds']))} on the same {r['n_docs']} "
        f"{r['split']} documents, with two 95% percentile bootstrap intervals ({BOOTSTRAP} resamples each). "
        '"documents": resamples the documents, each drawn document bringing its hypotheses of every seed '
        '(the trained models fixed: how the number moves with other test documents). "seeds, documents": '
        "draws the seeds (with replacement, as many as were run), then the documents: it also moves with the "
        "training seed (with 3 seeds, 10 distinct seed draws: a coarse interval). "
        "Exact = the whole summary right (every key, in order, no decoy); far slots: "
        "binding's colour + animal (bound >= 1,024 words before the use), retrieval's slots of keys past "
        "word 1,024, count's counts of animals whose mentions span 1,024+ words, every order slot. "
        "Beats control: exact >= 20 points above local_8's and the two intervals disjoint (the issue's test), "
        "read with each interval; far slots above control: the far-slot recall intervals (documents) "
        "disjoint, a weaker reading.",
        "",
    ]
    for v, rows in r["variants"].items():
        out += [
            f"## {v}",
            "",
            "| row | exact match [95% CI: documents] | per seed | beats control "
            "| [95% CI: seeds, documents] | beats control (seeds resampled too) | slot recall "
            "| far-slot recall [95% CI] | far slots above control |",
            "|---|---:|---|:-:|---:|:-:|---:|---:|:-:|",
        ]
        yes_no = {None: "", True: "yes", False: "no"}
        for row, c in rows.items():
            far = pct(c["far_recall"]) + (f" {ci(c['far_ci'])}" if c["far_ci"] else "")
            out.append(
                f"| {LABELS.get(row, row)} | {pct(c['exact'])} {ci(c['exact_ci'])} | "
                f"{' / '.join(pct(x) for x in c['exact_per_seed'])} | {yes_no[c['beats_control']]} | "
                f"{ci(c['exact_ci_seeds'])} | {yes_no[c['beats_control_seeds']]} | "
                f"{pct(c['slot_recall'])} | {far} | {yes_no[c['far_above_control']]} |"
            )
        if POSITION_ONLY in rows:
            ref = rows[POSITION_ONLY]
            bands = "; ".join(
                f"{n} arrivals: thresholds at word {', '.join(f'{t:,}' for t in rule['thresholds'])} "
                f"({pct(rule['train_exact'])} of {rule['n_docs']:,} training documents right)"
                for n, rule in ref["rule"].items()
            )
            out += [
                "",
                f"Position only (no model, no seeds): each arrival is ranked by its own word offset alone, "
                f"never against another arrival; an arrival before the first threshold is called first, one "
                f"at or past the last threshold last. Fitted on {ref['rule_fitted_on']} (exact search for the "
                f"thresholds that put the most documents entirely right): {bands}. It is handed the animals "
                '("the right animals" is 100% by construction), and two arrivals in one band count as wrong '
                "(no coin flip). Where a long row scores no higher, this table cannot tell it from a reader that "
                "only knows roughly where each arrival lies.",
            ]
        if any("binding_choice" in c for c in rows.values()):
            out += [
                "",
                "Binding or copying? When a row writes one of the document's bound animals, is it the right "
                "one more often than a random pick among them?",
                "",
                "| row | a bound animal written | right among those | random pick among bound |",
                "|---|---:|---:|---:|",
            ]
            for row, c in rows.items():
                b = c["binding_choice"]
                out.append(
                    f"| {LABELS.get(row, row)} | {pct(b['bound_animal_written'])} | "
                    f"{pct(b['right_among_bound'])} | {pct(b['random_bound_pick'])} |"
                )
        if any("order_choice" in c for c in rows.values()):
            out += [
                "",
                "Order, or copying? Of the summaries naming exactly the document's arriving animals, how many "
                "put them in the right order, against a random order?",
                "",
                "| row | the right animals | right order among those | random order |",
                "|---|---:|---:|---:|",
            ]
            for row, c in rows.items():
                o = c["order_choice"]
                out.append(
                    f"| {LABELS.get(row, row)} | {pct(o['right_animals'])} | "
                    f"{pct(o['right_order_among_those'])} | {pct(o['random_order'])} |"
                )
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
        err = [
            [y - 100 * rows[n]["exact_ci"][0] for n, y in zip(names, ys)],
            [100 * rows[n]["exact_ci"][1] - y for n, y in zip(names, ys)],
        ]
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
            return report_error("usage: report.py extract GENERATE_OUT N HYPOTHESES", PROG)
        try:
            extract(argv[1], POSITIVE_INT(argv[2]), argv[3])
        except argparse.ArgumentTypeError as e:
            return report_error(f"extract N: {e}", PROG)
        except UserError as e:  # a malformed generate.out: one line through the printer, not a traceback
            return report_error(e, PROG)
        return 0
    p = OneLineArgumentParser(prog=PROG, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--outputs", required=True)
    p.add_argument("--report-dir", required=True)
    p.add_argument("--split", default="test", choices=["test", "valid"])
    p.add_argument("--n-docs", type=POSITIVE_INT, required=True)
    p.add_argument("--variants", nargs="+", required=True)
    p.add_argument("--rows", nargs="+", required=True)
    p.add_argument("--seeds", nargs="+", type=int, required=True)
    p.add_argument(
        "--n-train",
        type=POSITIVE_INT,
        default=N_TRAIN,
        help=f"order: training documents the position-only rule is fitted on (run.sh's N_LONG; default {N_TRAIN})",
    )
    p.add_argument(
        "--fit-data",
        help="order: a data.json whose train split fits the position-only rule "
        "(default: the scored variant's own; regap.sh: the set its checkpoints trained on)",
    )
    p.add_argument("--command", help="the command that made the outputs (default: bash examples/long_range/run.sh)")
    p.add_argument(
        "--trained-at", help="the commit the outputs were made at (default: the scorer's, as in run.sh's own call)"
    )
    p.add_argument(
        "--machine",
        help="where the outputs were made (default, when --trained-at is not given: this CPU and its cores)",
    )
    p.add_argument("--wall")
    p.add_argument("--load")
    p.add_argument("--settings")
    p.add_argument(
        "--provenance-from",
        help="a committed results.json whose command, commit, machine, wall "
        "time, load and settings the new table keeps (re-scoring its outputs); flags given win",
    )
    args = p.parse_args(argv)
    try:
        return report(args)
    except UserError as e:
        return report_error(e, PROG)


if __name__ == "__main__":
    sys.exit(main())
