"""Is ``lsg-fairseq-summarize --quantize int8`` worth offering? fp32 vs dynamic int8 on this CPU.

One seeded command, three measurements, written to ``<out>/int8.md`` and ``<out>/int8.json``:

(a) speed: encoder forward (no grad, batch 1, random weights, seed 0) of ``lsg_bart_base``
    (norm, block 128, sparse block 128, factor 4, 1 global token, as benchmarks/run.py) and
    ``led_base`` (window 1,024, first token global) at each ``--lengths``. fp32 and int8 copies of
    the same model live in one process and are called alternately (``--repeat`` rounds of fp32,
    int8; no untimed warm-up); median per precision and the ratio fp32 / int8. The encoder outputs'
    difference is reported too.
(b) logits on the converted conformance fixtures (tests/data/fixtures/lsg, led, locost; tiny random
    models, d 64): fp32 vs int8 teacher-forced logits, max |diff|, that over the largest |logit|,
    ||diff|| / ||logits|| and the share of positions whose argmax token is unchanged.
(c) a trained model: the LSG-BART (norm) row of examples/long_context/run.sh (its ``$OUT`` folder,
    ``--long-context``). Its test documents (3.6K-4K pieces) go through the real command,
    ``python -m lsg_fairseq.cli.summarize`` with and without ``--quantize int8`` (greedy, 60 tokens,
    as run.sh evaluates), then scripts/key_recall.py and scripts/generate_to_rouge.py.

    python benchmarks/int8.py --long-context work_dirs/long_context   # (a), (b), (c): ~20 min on 2 cores
    python benchmarks/int8.py --parts c --long-context DIR --append    # (c) only, merged into int8.json
    python benchmarks/int8.py --lengths 512 --arch-size tiny --parts a b --out /tmp/x   # seconds (a check)

A ``<tag>.json`` that is not this script's, or that holds the other kind of figures (tiny beside
base), is refused before anything runs (as benchmarks/run.py refuses its own).
"""

import argparse
import copy
import datetime
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

import numpy as np  # noqa: E402
import torch  # noqa: E402

import lsg_fairseq  # noqa: E402,F401  (registers lsg_bart, led, locost)
from fairseq import checkpoint_utils, options  # noqa: E402
from fairseq.data import Dictionary  # noqa: E402
from fairseq.models import ARCH_MODEL_REGISTRY  # noqa: E402

from lsg_fairseq.convert.registry import BenchSettings  # noqa: E402
from lsg_fairseq.quantize import quantize_int8  # noqa: E402
from lsg_text.atomic import atomic_outputs  # noqa: E402
from lsg_text.errors import UserError, report  # noqa: E402
from run import ROWS, cpu_name, load_average  # noqa: E402  (benchmarks/run.py)
from tables import read_table, refuse_mixed_figures  # noqa: E402  (benchmarks/tables.py)

FIXTURES = os.path.join(REPO, "tests", "data", "fixtures")
ARCHS = ("lsg_norm", "led")  # rows of benchmarks/run.py, built as it builds them


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--lengths", type=int, nargs="+", default=[4096, 16384])
    p.add_argument("--archs", nargs="+", choices=ARCHS, default=list(ARCHS))
    p.add_argument("--arch-size", choices=("base", "tiny"), default="base", help="tiny: a quick check of the script")
    p.add_argument("--repeat", type=int, default=3, help="timed calls per precision (alternating)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument(
        "--parts",
        nargs="+",
        choices=("a", "b", "c"),
        default=["a", "b", "c"],
        help="which measurements; c needs --long-context (default: all, c only if given)",
    )
    p.add_argument("--append", action="store_true", help="keep the other parts of an existing <out>/<tag>.json")
    p.add_argument("--report-only", action="store_true", help="rewrite <out>/<tag>.md from <out>/<tag>.json")
    p.add_argument("--long-context", help="$OUT of examples/long_context/run.sh with an lsg_norm row, for (c)")
    p.add_argument("--n-test", type=int, default=None, help="(c): only the first N test documents")
    p.add_argument("--out", default=os.path.join(REPO, "benchmarks", "results"))
    p.add_argument("--tag", default="int8")
    return p.parse_args(argv)


# ---------------------------------------------------------------------------------- helpers
def diff_stats(a: torch.Tensor, b: torch.Tensor) -> dict:
    """fp32 ``a`` vs int8 ``b``: max |a-b|, that over max |a|, ||a-b|| / ||a||."""
    d = (a - b).abs()
    return {
        "max_abs": float(d.max()),
        "max_abs_over_max": float(d.max() / a.abs().max()),
        "rel_l2": float((a - b).norm() / a.norm()),
    }


def logit_stats(a: torch.Tensor, b: torch.Tensor) -> dict:
    return dict(
        diff_stats(a, b),
        argmax_agree=float((a.argmax(-1) == b.argmax(-1)).float().mean()),
        positions=int(a.shape[0] * a.shape[1]),
    )


# ---------------------------------------------------------------------------------- (a) speed
def build(arch: str, length: int, size: str):
    """run.py's row ``arch`` at ``length``: its base shape, or with ``size="tiny"`` its tiny arch."""
    row = ROWS[arch]
    fairseq_arch, *flags = row.argv(length, BenchSettings(smoke=size == "tiny"))
    dictionary = Dictionary()
    for i in range((100 if size == "tiny" else row.vocab) - len(dictionary)):
        dictionary.add_symbol(f"w{i}")
    task = argparse.Namespace(source_dictionary=dictionary, target_dictionary=dictionary)
    argv = ["/nonexistent", "--task", "translation", "--arch", fairseq_arch, "--max-target-positions", "1024", *flags]
    ns = options.parse_args_and_arch(options.get_training_parser(), argv)
    torch.manual_seed(0)
    return ARCH_MODEL_REGISTRY[fairseq_arch].build_model(ns, task).eval(), dictionary


def speed(arch: str, length: int, args) -> dict:
    model, dictionary = build(arch, length, args.arch_size)
    int8 = quantize_int8(copy.deepcopy(model))
    g = torch.Generator().manual_seed(0)
    src = torch.randint(dictionary.nspecial, len(dictionary), (1, length), generator=g)
    src[0, 0], src[0, -1] = dictionary.bos(), dictionary.eos()
    lengths = torch.tensor([length])

    def call(m):
        start = time.perf_counter()
        with torch.no_grad():
            out = m.encoder(src, src_lengths=lengths)["encoder_out"][0]
        return time.perf_counter() - start, out

    times, outs = {"fp32": [], "int8": []}, {}
    for _ in range(args.repeat):  # no untimed warm-up: at these lengths one call is seconds
        for name, m in (("fp32", model), ("int8", int8)):
            t, outs[name] = call(m)
            times[name].append(t)
    ref, out = outs["fp32"], outs["int8"]
    fp32, q = statistics.median(times["fp32"]), statistics.median(times["int8"])
    rec = {
        "arch": arch,
        "length": length,
        "fp32_s": fp32,
        "int8_s": q,
        "speedup": fp32 / q,
        "times_s": times,
        "encoder_out": diff_stats(ref, out),
    }
    print(
        f"{arch:<9} {length:>6}  fp32 {fp32:7.2f} s  int8 {q:7.2f} s  x{fp32 / q:.2f}  "
        f"enc max|d| {rec['encoder_out']['max_abs']:.3g}",
        flush=True,
    )
    return rec


# ---------------------------------------------------------------------------------- (b) fixtures
def fixture_cases():
    """(name, HF folder, [(set, src, lengths, prev)]) for every conformance fixture."""
    lsg_inputs = np.load(os.path.join(FIXTURES, "lsg", "inputs.npz"))
    led_inputs = np.load(os.path.join(FIXTURES, "led", "inputs.npz"))

    def sets(data, names):
        return [
            (S, *(torch.from_numpy(data[f"{S}_{k}"]) for k in ("input_ids", "lengths", "decoder_input_ids")))
            for S in names
        ]

    for name in ("bart_plain", "lsg_none", "lsg_norm", "lsg_pooling"):
        yield (
            name,
            os.path.join(FIXTURES, "lsg", name, "hf"),
            sets(lsg_inputs, ["mid", "short"] if name == "bart_plain" else ["long", "mid", "short"]),
        )
    yield "led_w32", os.path.join(FIXTURES, "led", "led_w32", "hf"), sets(led_inputs, ["long", "mid", "short"])
    yield "locost", os.path.join(FIXTURES, "locost", "model"), None  # inputs need the converted token map


def locost_inputs(folder):
    """The fixture's two rows (3,000 and 1,234 tokens) mapped to fairseq indices (tests/test_convert_locost.py)."""
    io = np.load(os.path.join(FIXTURES, "locost", "reference_io.npz"))
    with open(os.path.join(folder, "token_map.json")) as f:
        token_map = json.load(f)
    inv = {}
    for idx, hf in enumerate(token_map[1:], start=1):  # index 0 is the decoder start row
        inv.setdefault(hf, idx)
    mask = io["attention_mask"].astype(bool)
    src = torch.tensor(np.vectorize(inv.get)(io["input_ids"]))
    prev = torch.tensor(np.vectorize(inv.get)(io["decoder_input_ids"]))
    prev[:, 0] = 2  # fairseq feeds </s> first
    return [("3000/1234", src, torch.tensor(mask.sum(1)), prev)]


def fixtures(args) -> list:
    from lsg_fairseq.convert import convert

    records = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, hf, cases in fixture_cases():
            folder = os.path.join(tmp, name)
            convert(hf, folder)
            models, _, _ = checkpoint_utils.load_model_ensemble_and_task([os.path.join(folder, "model.pt")])
            model = models[0].eval()
            int8 = quantize_int8(copy.deepcopy(model))
            for S, src, lengths, prev in cases or locost_inputs(folder):
                with torch.no_grad():
                    a, _ = model(src, lengths, prev)
                    b, _ = int8(src, lengths, prev)
                rec = dict(
                    fixture=name,
                    inputs=S,
                    source_lengths=lengths.tolist(),
                    max_logit=float(a.abs().max()),
                    **logit_stats(a, b),
                )
                records.append(rec)
                print(
                    f"{name:<11} {S:<9} max|d| {rec['max_abs']:.3f} ({rec['max_abs_over_max']:.1%} of max) "
                    f"rel {rec['rel_l2']:.2%}  argmax agree {rec['argmax_agree']:.1%}",
                    flush=True,
                )
    return records


# ---------------------------------------------------------------------------------- (c) trained model
def long_context(args) -> dict:
    out = args.long_context
    ckpt = os.path.join(out, "runs", "lsg_norm", "checkpoint_last.pt")
    spm = os.path.join(out, "long", "spm", "spm.model")
    for path in (ckpt, spm):
        if not os.path.isfile(path):
            sys.exit(
                report(
                    f"--long-context {out}: no {path}; run `ARCHS=lsg_norm EXTRAPOLATION=0 "
                    f"OUT={out} bash examples/long_context/run.sh` first",
                    "int8.py",
                )
            )
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads), PYTHONPATH=REPO)
    result = {"checkpoint": ckpt, "rows": {}}
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = os.path.join(tmp, "model")  # what summarize reads: checkpoint, dict.txt, spm.model
        os.makedirs(model_dir)
        for src, name in (
            (ckpt, "model.pt"),
            (spm, "spm.model"),
            (os.path.join(out, "long", "spm", "dict.txt"), "dict.txt"),
        ):
            os.symlink(os.path.abspath(src), os.path.join(model_dir, name))
        sources = os.path.join(out, "long", "raw", "test.source")
        refs = os.path.join(out, "long", "raw", "test.target")
        jsonl = os.path.join(out, "long", "jsonl", "test.jsonl")
        if args.n_test:
            for path in (sources, refs, jsonl):
                with open(path) as f:
                    head = [line for _, line in zip(range(args.n_test), f)]
                with open(os.path.join(tmp, os.path.basename(path)), "w") as f:
                    f.writelines(head)
            sources, refs, jsonl = (os.path.join(tmp, os.path.basename(p)) for p in (sources, refs, jsonl))
        summaries = {}
        for precision in ("fp32", "int8"):
            hyp = os.path.join(tmp, f"{precision}.txt")
            cmd = [
                sys.executable,
                "-m",
                "lsg_fairseq.cli.summarize",
                model_dir,
                "--input-lines",
                sources,
                "--output",
                hyp,
                "--beam",
                "1",
                "--max-len-b",
                "60",
                "--no-repeat-ngram-size",
                "0",
                "--batch-size",
                "8",
                "--quiet",
                "--quantize",
                precision if precision == "int8" else "none",
            ]
            start = time.perf_counter()
            subprocess.run(cmd, env=env, check=True, capture_output=True)
            wall = time.perf_counter() - start
            with open(hyp) as f:
                summaries[precision] = f.read().splitlines()
            gen = os.path.join(tmp, f"{precision}.generate")  # fairseq-generate's D- lines, for the scorers
            with open(gen, "w") as f:
                f.writelines(f"D-{i}\t0.0\t{s}\n" for i, s in enumerate(summaries[precision]))
            scripts = os.path.join(REPO, "scripts")
            subprocess.run(
                [
                    sys.executable,
                    os.path.join(scripts, "key_recall.py"),
                    "--jsonl",
                    jsonl,
                    "--generate-output",
                    gen,
                    "--spm-model",
                    spm,
                    "--name",
                    precision,
                    "--json",
                    os.path.join(tmp, f"{precision}.recall.json"),
                ],
                env=env,
                check=True,
                capture_output=True,
            )
            subprocess.run(
                [
                    sys.executable,
                    os.path.join(scripts, "generate_to_rouge.py"),
                    "--generate-output",
                    gen,
                    "--ref-file",
                    refs,
                    "--output-dir",
                    os.path.join(tmp, precision),
                ],
                env=env,
                check=True,
                capture_output=True,
            )
            with open(os.path.join(tmp, f"{precision}.recall.json")) as f:
                recall = json.load(f)
            with open(os.path.join(tmp, precision, "rouge.json")) as f:
                rouge = json.load(f)
            result["rows"][precision] = {"wall_s": wall, "recall": recall, "rouge": rouge}
            print(
                f"long_context {precision}: {wall:.0f} s, recall {recall['recall']:.1%}, ROUGE-2 {rouge['rouge2']:.2f}",
                flush=True,
            )
        result["documents"] = len(summaries["fp32"])
        result["identical_summaries"] = sum(a == b for a, b in zip(summaries["fp32"], summaries["int8"]))
    return result


# ---------------------------------------------------------------------------------- report
def markdown(results) -> str:
    speeds, fixture_rows, lc = results["speed"], results["fixtures"], results["long_context"]
    meta = results["runs"][0]
    lines = [
        f"# fp32 vs dynamic int8 (`--quantize int8`), {meta['cpu']}, {meta['threads']} threads, "
        f"torch {meta['torch']} (quantized engine {meta['quantized_engine']})",
        "",
        "Generated by benchmarks/int8.py (seeded; what is measured and how: its docstring). Runs:",
        "",
    ]
    for run in results["runs"]:
        lines.append(
            f"- `{run['command']}`: started {run['started']}, wall {run['wall_s']:.0f} s, load average "
            f"(1/5/15 min) {run['load_average_start']} -> {run['load_average_end']}"
        )
    lines.append("")
    if speeds:
        lines += [
            "## (a) Encoder forward, batch 1, no grad (median of "
            f"{meta['repeat']}, fp32 and int8 alternating in one process, random weights)",
            "",
            "| arch | tokens | fp32 s | int8 s | speed-up | encoder out: max abs diff | rel. L2 diff |",
            "|---|---:|---:|---:|---:|---:|---:|",
        ]
        for r in speeds:
            e = r["encoder_out"]
            lines.append(
                f"| {r['arch']} | {r['length']:,} | {r['fp32_s']:.2f} | {r['int8_s']:.2f} | "
                f"**{r['speedup']:.2f}x** | {e['max_abs']:.3g} | {e['rel_l2']:.2%} |"
            )
        lines.append("")
    if fixture_rows:
        lines += [
            "## (b) Logits on the converted conformance fixtures (tiny random models, d 64, vocab 500)",
            "",
            "| fixture | inputs | max abs logit | max abs diff | diff / max | rel. L2 diff | argmax agrees |",
            "|---|---|---:|---:|---:|---:|---:|",
        ]
        for r in fixture_rows:
            lines.append(
                f"| {r['fixture']} | {r['inputs']} {r['source_lengths']} | {r['max_logit']:.1f} | "
                f"{r['max_abs']:.3f} | {r['max_abs_over_max']:.1%} | {r['rel_l2']:.2%} | "
                f"{r['argmax_agree']:.1%} of {r['positions']} |"
            )
        lines.append("")
    if lc:
        lines += [
            f"## (c) Trained LSG-BART (norm) of examples/long_context, {lc['documents']} test documents "
            "of 3.6K-4K pieces",
            "",
            "`python -m lsg_fairseq.cli.summarize MODEL --beam 1 --max-len-b 60 --no-repeat-ngram-size 0 "
            "--batch-size 8 [--quantize int8]`, scored by scripts/key_recall.py and "
            "scripts/generate_to_rouge.py. The model: `ARCHS=lsg_norm EXTRAPOLATION=0 OUT=DIR bash "
            "examples/long_context/run.sh` (its full recipe, 500 + 800 updates), DIR = `--long-context`. "
            "Wall: the whole command (start, load, 120 summaries), one run each, fp32 first.",
            "",
            "| precision | key recall | recall, keys >= 1,024 | ROUGE-1 | ROUGE-2 | ROUGE-L | wall s (one run) |",
            "|---|---:|---:|---:|---:|---:|---:|",
        ]
        for name, row in lc["rows"].items():
            rec, rg = row["recall"], row["rouge"]
            beyond = rec["recall_beyond"]
            lines.append(
                f"| {name} | {rec['recall']:.1%} | {'n/a' if beyond is None else f'{beyond:.1%}'} | "
                f"{rg['rouge1']:.2f} | {rg['rouge2']:.2f} | {rg['rougeL']:.2f} | {row['wall_s']:.0f} |"
            )
        lines += ["", f"Identical summaries fp32 vs int8: {lc['identical_summaries']} of {lc['documents']}.", ""]
    return "\n".join(lines)


def main(argv=None):
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    meta = {
        "started": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": "python benchmarks/int8.py " + " ".join(sys.argv[1:] if argv is None else argv),
        "load_average_start": load_average(),
        "cpu": cpu_name(),
        "threads": args.threads,
        "torch": torch.__version__,
        "quantized_engine": torch.backends.quantized.engine,
        "repeat": args.repeat,
        "arch_size": args.arch_size,
    }
    stem = os.path.join(args.out, args.tag)
    try:  # nothing measured before the table there is known to be this script's, of the same kind
        old = read_table(stem + ".json", "int8.py", ("runs", "speed", "fixtures"), args.report_only)
        if old is not None and not args.report_only:
            held = {run.get("arch_size", "base") == "tiny" for run in old["runs"]}
            refuse_mixed_figures(stem + ".json", held, args.arch_size == "tiny", args.append, "--arch-size tiny")
    except UserError as e:
        sys.exit(report(e, "int8.py"))
    if args.report_only:
        with atomic_outputs([stem + ".md"]) as (md,):
            md.write(markdown(old))
        return
    results = (
        old if args.append and old is not None else {"runs": [], "speed": [], "fixtures": [], "long_context": None}
    )
    start = time.time()
    if "a" in args.parts:
        results["speed"] = [speed(arch, n, args) for n in args.lengths for arch in args.archs]
    if "b" in args.parts:
        results["fixtures"] = fixtures(args)
    if "c" in args.parts and args.long_context:
        results["long_context"] = long_context(args)
    meta["wall_s"] = time.time() - start
    meta["load_average_end"] = load_average()
    results["runs"].append(meta)
    with atomic_outputs([stem + ".json", stem + ".md"]) as (js, md):
        json.dump(results, js, indent=1)
        md.write(markdown(results))
    print(f"wrote {stem}.md, {stem}.json in {meta['wall_s']:.0f} s")


if __name__ == "__main__":
    main()
