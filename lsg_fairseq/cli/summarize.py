"""``lsg-fairseq-summarize``: documents in, summaries out, from a trained or converted model folder.

    lsg-fairseq-summarize MODEL_DIR doc1.txt doc2.txt          # one document per file
    cat docs.txt | lsg-fairseq-summarize MODEL_DIR             # stdin: one document per line
    lsg-fairseq-summarize MODEL_DIR --input-lines docs.txt --output summaries.txt

MODEL_DIR holds the checkpoint (``--checkpoint``, default ``model.pt``), ``dict.txt`` and the
tokenizer files (``encoder.json`` + ``vocab.bpe`` for GPT-2 BPE, or ``spm.model``). Inputs longer
than the model's ``max_source_positions`` are truncated with a warning, never refused.
"""
import argparse
import os
import sys
import time


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="lsg-fairseq-summarize", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("model_dir", help="folder with the checkpoint, dict.txt and tokenizer files")
    p.add_argument("files", nargs="*", help="text files, one document each (default: stdin, one document per line)")
    p.add_argument("--input-lines", help="a text file with one document per line (instead of FILES/stdin)")
    p.add_argument("--output", help="write summaries here, one per line (default: stdout)")
    p.add_argument("--checkpoint", default="model.pt", help="checkpoint file name inside MODEL_DIR (default: model.pt)")
    p.add_argument("--beam", type=int, default=4, help="beam size (default: 4; 1 = greedy)")
    p.add_argument("--lenpen", type=float, default=1.0, help="length penalty (default: 1.0)")
    p.add_argument("--max-len-b", type=int, default=256, help="maximum summary length in tokens (default: 256)")
    p.add_argument("--min-len", type=int, default=1, help="minimum summary length in tokens (default: 1)")
    p.add_argument("--no-repeat-ngram-size", type=int, default=3, help="ban repeated n-grams of this size (0 = off; default: 3)")
    p.add_argument("--max-source-positions", type=int, default=None,
                   help="read up to N source tokens (default: the checkpoint's); above a position table "
                   "(BART/LSG/LED) the load is refused, LOCOST has no table and reads any length")
    p.add_argument("--batch-size", type=int, default=1, help="documents per generation batch (default: 1)")
    p.add_argument("--device", default="cpu", help="torch device, e.g. cpu or cuda (default: cpu)")
    p.add_argument("--fp16", action="store_true", help="run the model in half precision (GPU only)")
    p.add_argument("--quiet", action="store_true", help="no progress on stderr")
    return p


def read_documents(args, parser):
    if args.input_lines and args.files:
        parser.error("give either FILES or --input-lines, not both")
    if args.files:
        docs = []
        for path in args.files:
            if not os.path.isfile(path):
                parser.error(f"{path}: no such file")
            with open(path, encoding="utf-8") as f:
                docs.append(" ".join(f.read().split()))
        names = list(args.files)
    else:
        if args.input_lines:
            if not os.path.isfile(args.input_lines):
                parser.error(f"--input-lines: {args.input_lines}: no such file")
            stream = open(args.input_lines, encoding="utf-8")
        else:
            stream = sys.stdin
        docs = [line.strip() for line in stream]
        names = [f"{args.input_lines or '<stdin>'}:{i + 1}" for i in range(len(docs))]
    for name, doc in zip(names, docs):
        if not doc:
            parser.error(f"{name}: empty document")
    return names, docs


def main(argv=None) -> None:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not os.path.isdir(args.model_dir):
        parser.error(f"MODEL_DIR {args.model_dir}: no such folder")
    if not os.path.isfile(os.path.join(args.model_dir, args.checkpoint)):
        parser.error(f"--checkpoint: {os.path.join(args.model_dir, args.checkpoint)} does not exist")
    names, docs = read_documents(args, parser)

    from lsg_fairseq.checkpoint_io import CheckpointError
    from lsg_fairseq.data.fileio import DataError
    from lsg_fairseq.models.hub import from_pretrained

    if args.max_source_positions is not None and args.max_source_positions < 2:
        parser.error(f"--max-source-positions must be >= 2 (got {args.max_source_positions})")
    try:
        hub = from_pretrained(args.model_dir, args.checkpoint)
        if args.max_source_positions is not None:
            hub.set_max_source_positions(args.max_source_positions)
    except ValueError as e:
        parser.error(str(e))
    except (CheckpointError, DataError, FileNotFoundError) as e:  # messages name the file at fault
        print(f"lsg-fairseq-summarize: error: {e}", file=sys.stderr)
        sys.exit(2)
    hub.eval()
    hub.to(args.device)
    if args.fp16:
        hub.half()
    out = open(args.output, "w", encoding="utf-8") if args.output else sys.stdout
    start = time.time()
    for i in range(0, len(docs), args.batch_size):
        chunk = docs[i : i + args.batch_size]
        summaries = hub.sample(
            chunk, beam=args.beam, lenpen=args.lenpen, max_len_a=0, max_len_b=args.max_len_b,
            min_len=args.min_len, no_repeat_ngram_size=args.no_repeat_ngram_size,
        )
        for summary in summaries:
            out.write(summary.replace("\n", " ") + "\n")
        out.flush()
        if not args.quiet:
            done = min(i + args.batch_size, len(docs))
            print(f"[{done}/{len(docs)}] {time.time() - start:.1f}s", file=sys.stderr)
    if args.output:
        out.close()


if __name__ == "__main__":
    main()
