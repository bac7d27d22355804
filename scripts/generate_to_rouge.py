#!/usr/bin/env python
"""ROUGE report (rouge-score F1 x100, stemmed, Lsum on sentences) from fairseq-generate output.

Mode 1, from fairseq-generate stdout (or --results-path's generate-test.txt):
    python scripts/generate_to_rouge.py --generate-output gen.out [--ref-file raw/test.target] \\
        --output-dir eval/
  writes eval/hyp.txt and eval/ref.txt (one example per line, sorted by example id; hypotheses
  from D- lines, else H-; references from T- lines or, with --ref-file, line <id> of that file)
  and eval/rouge.json, and prints the JSON.

  With --source-file and --lead-words 50 110, the same examples are also scored for lead-N
  baselines (the first N words of each source: leadN.txt, leadN.json; words, not sentences, so
  lowercased or transcribed text works too), and --table prints model / baselines / reference
  length as a table instead of the JSON.

Mode 2, two existing files (same line count):
    python scripts/generate_to_rouge.py --hyp eval/hyp.txt --ref raw/test.target [--json out.json]

The JSON holds rouge1, rouge2, rougeL, rougeLsum (means over examples, x100) and n.
"""

import argparse
import io
import json
import os
import sys

from lsg_text.argtypes import POSITIVE_INT
from lsg_text.atomic import atomic_outputs
from lsg_text.errors import report
from lsg_text.fileio import DataError, check_output_files, check_output_path, count_lines, read_text, require_file
from lsg_text.generate_output import hypotheses_and_references, parse_generate_output
from lsg_text.rouge import rouge_corpus

PROG = "generate_to_rouge.py"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=PROG, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    g = p.add_argument_group("mode 1: fairseq-generate output")
    g.add_argument("--generate-output", metavar="FILE", help="fairseq-generate stdout ('-' = stdin)")
    g.add_argument("--ref-file", metavar="FILE", help="raw references, line i = example id i (default: the T- lines)")
    g.add_argument("--output-dir", metavar="DIR", help="where hyp.txt, ref.txt and rouge.json are written")
    g.add_argument("--source-file", metavar="FILE", help="raw sources, line i = example id i (for --lead-words)")
    g.add_argument(
        "--lead-words",
        metavar="N",
        type=POSITIVE_INT,
        nargs="+",
        default=[],
        help="also score lead-N baselines: the first N words of each example's source",
    )
    g.add_argument("--name", default="model", help="label of the model's row in --table")
    g.add_argument(
        "--table",
        action="store_true",
        help="print a table (model, lead baselines, words per summary) instead of the JSON",
    )
    g = p.add_argument_group("mode 2: score two files")
    g.add_argument("--hyp", metavar="FILE", help="hypotheses, one per line")
    g.add_argument("--ref", metavar="FILE", help="references, one per line (same count as --hyp)")
    g.add_argument("--json", metavar="FILE", help="also write the JSON report here")
    return p


def _read_lines(path: str, flag: str):
    require_file(path, flag)
    lines = read_text(path, flag).split("\n")  # names the byte offset of a non-UTF-8 byte
    return lines[:-1] if lines and lines[-1] == "" else lines


def score_files(args) -> dict:
    hyp_n, ref_n = count_lines(require_file(args.hyp, "--hyp")), count_lines(require_file(args.ref, "--ref"))
    if hyp_n != ref_n:
        raise DataError(f"line counts differ: --hyp {args.hyp} has {hyp_n} lines, --ref {args.ref} has {ref_n}")
    if hyp_n == 0:
        raise DataError(f"--hyp {args.hyp} and --ref {args.ref} are empty")
    return rouge_corpus(_read_lines(args.hyp, "--hyp"), _read_lines(args.ref, "--ref"))


def score_generate_output(args) -> dict:
    path = args.generate_output
    if path == "-":
        examples = parse_generate_output(sys.stdin, "<stdin>")
    else:
        require_file(path, "--generate-output")
        examples = parse_generate_output(io.StringIO(read_text(path, "--generate-output")), path)
    refs = _read_lines(args.ref_file, "--ref-file") if args.ref_file else None
    ids, hyps, refs_by_id = hypotheses_and_references(examples, refs, path)
    report = rouge_corpus(hyps, refs_by_id)
    if refs is not None and len(ids) < len(refs):
        # fairseq drops over-long examples under --skip-invalid-size-inputs-valid-test.
        report["skipped"] = len(refs) - len(ids)
        print(
            f"warning: only {len(ids)} of the {len(refs)} references in {args.ref_file} have a hypothesis",
            file=sys.stderr,
        )
    report["words_per_summary"] = _mean_words(hyps)
    report["reference_words_per_summary"] = _mean_words(refs_by_id)
    leads = {}
    if args.lead_words:
        sources = _read_lines(args.source_file, "--source-file")
        missing = [i for i in ids if i >= len(sources)]
        if missing:
            raise DataError(
                f"--source-file {args.source_file} has {len(sources)} lines; example id {missing[0]} has none"
            )
        for n in args.lead_words:
            if n < 1:
                raise DataError(f"--lead-words must be >= 1 (got {n})")
            lead = [" ".join(sources[i].split()[:n]) for i in ids]
            leads[n] = (lead, dict(rouge_corpus(lead, refs_by_id), words_per_summary=_mean_words(lead)))
        report["lead_baselines"] = {f"lead-{n} words": r for n, (_, r) in leads.items()}
    with atomic_outputs(output_paths(args)) as files:
        fh, fr, fj = files[:3]
        for h, r in zip(hyps, refs_by_id):
            # One example per line, whatever the text holds.
            fh.write(" ".join(h.split()) + "\n")
            fr.write(" ".join(r.split()) + "\n")
        fj.write(json.dumps(report, indent=2) + "\n")
        for k, (lead, scores) in enumerate(leads.values()):
            files[3 + 2 * k].write("".join(line + "\n" for line in lead))
            files[4 + 2 * k].write(json.dumps(scores, indent=2) + "\n")
    return report


def output_paths(args) -> list:
    """What mode 1 writes into --output-dir: hyp.txt, ref.txt, rouge.json, then leadN.txt and
    leadN.json for each --lead-words N."""
    names = ["hyp.txt", "ref.txt", "rouge.json"]
    for n in dict.fromkeys(args.lead_words):
        names += [f"lead{n}.txt", f"lead{n}.json"]
    return [os.path.join(args.output_dir, name) for name in names]


def check_outputs(args) -> None:
    """Refuse, before any scoring, outputs of the wrong kind and outputs that are inputs
    (``--json ref.txt`` would replace the references by the report)."""
    inputs = [args.generate_output, args.ref_file, args.source_file, args.hyp, args.ref]
    if args.output_dir:
        check_output_path(args.output_dir, "--output-dir", folder=True)
        check_output_files(output_paths(args), "--output-dir", inputs)
        # --json naming one of --output-dir's files (o/hyp.txt): one of the two writes would be lost
        check_output_files(output_paths(args) + [args.json], "--json", inputs)
    check_output_files([args.json], "--json", inputs)


def _mean_words(texts) -> float:
    return sum(len(t.split()) for t in texts) / max(1, len(texts))


def table(report, name: str) -> str:
    """Model row, lead-N rows and the reference length, one line each."""
    rows = [(name, report)] + list(report.get("lead_baselines", {}).items())
    keys = ("rouge1", "rouge2", "rougeL", "rougeLsum")
    out = [
        f"{row:16s} n={r['n']} "
        + " ".join(f"{k}={r[k]:.2f}" for k in keys)
        + f"  ({r['words_per_summary']:.0f} words/summary)"
        for row, r in rows
    ]
    out.append(f"{'reference':16s} ({report['reference_words_per_summary']:.0f} words/summary)")
    return "\n".join(out)


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    mode1 = args.generate_output is not None
    mode2 = args.hyp is not None or args.ref is not None
    try:
        if mode1 == mode2:
            raise DataError("give either --generate-output (with --output-dir) or --hyp and --ref")
        if mode1:
            if not args.output_dir:
                raise DataError("--generate-output needs --output-dir")
            if args.lead_words and not args.source_file:
                raise DataError("--lead-words needs --source-file")
            check_outputs(args)
            scores = score_generate_output(args)
        else:
            if args.lead_words or args.table:
                raise DataError("--lead-words and --table go with --generate-output")
            if not (args.hyp and args.ref):
                raise DataError("--hyp and --ref go together")
            check_outputs(args)
            scores = score_files(args)
        if args.json:
            with atomic_outputs([args.json]) as (f,):
                f.write(json.dumps(scores, indent=2) + "\n")
    except DataError as e:
        return report(str(e), PROG)
    except UnicodeDecodeError as e:  # stdin
        return report(f"--generate-output <stdin>: not UTF-8 text ({e.reason})", PROG)
    print(table(scores, args.name) if args.table else json.dumps(scores, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
