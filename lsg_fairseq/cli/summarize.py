"""``lsg-fairseq-summarize``: documents in, summaries out, from a trained or converted model folder.

    lsg-fairseq-summarize MODEL_DIR doc1.txt doc2.txt          # one document per file
    cat docs.txt | lsg-fairseq-summarize MODEL_DIR             # stdin: one document per line
    lsg-fairseq-summarize MODEL_DIR --input-lines docs.txt --output summaries.txt

MODEL_DIR holds the checkpoint (``--checkpoint``; by default ``model.pt``, else ``checkpoint_best.pt``,
else ``checkpoint_last.pt``, as lsg-fairseq-convert and -export pick), ``dict.txt`` and the
tokenizer files (``encoder.json`` + ``vocab.bpe`` for GPT-2 BPE, or ``spm.model``). Inputs longer
than the model's ``max_source_positions`` are truncated with a warning, never refused. Inputs must
be UTF-8 (``--errors replace`` turns bad bytes into U+FFFD); ``--output`` is written only when every
summary is done, and never over an input or a file of MODEL_DIR.
"""

import argparse
import os
import sys
import time
import warnings

from lsg_text.argtypes import GENERATION_DEFAULTS, GENERATION_SETTINGS, POSITIVE_INT, int_range, min_len_out_of_reach
from lsg_text.errors import OneLineArgumentParser
from lsg_text.fileio import CHECKPOINT_NAMES, folder_checkpoint

PROG = "lsg-fairseq-summarize"


def build_parser() -> argparse.ArgumentParser:
    p = OneLineArgumentParser(prog=PROG, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model_dir", help="folder with the checkpoint, dict.txt and tokenizer files")
    p.add_argument(  # a default, or argparse names FILES among the missing arguments when MODEL_DIR is
        "files", nargs="*", default=[], help="text files, one document each (default: stdin, one document per line)"
    )
    p.add_argument("--input-lines", help="a text file with one document per line (instead of FILES/stdin)")
    p.add_argument("--output", help="write summaries here, one per line (default: stdout)")
    p.add_argument(
        "--errors",
        choices=("strict", "replace"),
        default="strict",
        help="non-UTF-8 bytes in the inputs: strict = refuse, naming the file and byte offset "
        "(default); replace = read them as U+FFFD",
    )
    p.add_argument(
        "--checkpoint",
        help=f"checkpoint file name inside MODEL_DIR (default: the first there of {', '.join(CHECKPOINT_NAMES)})",
    )
    g, d = GENERATION_SETTINGS, GENERATION_DEFAULTS  # the ranges and defaults of --eval-rouge-args too
    p.add_argument("--beam", type=g["beam"], default=d["beam"], help="beam size (default: %(default)s; 1 = greedy)")
    p.add_argument(
        "--lenpen",
        type=g["lenpen"],
        default=d["lenpen"],
        help=f"length penalty, {g['lenpen'].expected} (default: %(default)s)",
    )
    p.add_argument(
        "--max-len-b",
        type=g["max_len_b"],
        default=d["max_len_b"],
        help="maximum summary length in tokens (default: %(default)s)",
    )
    p.add_argument(
        "--min-len",
        type=g["min_len"],
        default=d["min_len"],
        help="minimum summary length in tokens (default: %(default)s)",
    )
    p.add_argument(
        "--no-repeat-ngram-size",
        type=g["no_repeat_ngram_size"],
        default=d["no_repeat_ngram_size"],
        help="ban repeated n-grams of this size (0 = off; default: %(default)s)",
    )
    p.add_argument(
        "--max-source-positions",
        type=int_range(2),
        default=None,
        help="read up to N >= 2 source tokens (default: the checkpoint's); above a position table "
        "(BART/LSG/LED) the load is refused, LOCOST has no table and reads any length",
    )
    p.add_argument("--batch-size", type=POSITIVE_INT, default=1, help="documents per generation batch (default: 1)")
    p.add_argument("--device", default="cpu", help="torch device, e.g. cpu or cuda (default: cpu)")
    p.add_argument("--fp16", action="store_true", help="run the model in half precision (GPU only)")
    p.add_argument(
        "--bf16",
        action="store_true",
        help="run the model in bfloat16 (any device; a CPU without bfloat16 units runs it slower than float32)",
    )
    p.add_argument(
        "--quantize",
        choices=("none", "int8"),
        default="none",
        help="int8 = dynamic int8 linear layers (CPU only; PyTorch's own quantization): a faster "
        "encoder, logits change by a few percent (measured: benchmarks/results/int8.md); "
        "none = fp32 as trained (default)",
    )
    p.add_argument("--quiet", action="store_true", help="no progress on stderr")
    return p


def _decode(data: bytes, name: str, errors: str) -> str:
    from lsg_text.fileio import DataError

    try:
        text = data.decode("utf-8", errors=errors)
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        raise DataError(
            f"{name}: not UTF-8 text (byte offset {e.start}, line {line}: {e.reason}); convert "
            "it to UTF-8, or pass --errors replace"
        ) from None  # same words as read_text
    return text[1:] if text.startswith("\ufeff") else text  # a BOM is not content


def read_documents(args):
    """``(names, documents)`` from FILES, ``--input-lines`` or stdin; raises DataError naming the file."""
    from lsg_text.fileio import DataError, read_text

    fix = "convert it to UTF-8, or pass --errors replace"
    if args.files:
        docs = [" ".join(read_text(path, errors=args.errors, fix=fix).split()) for path in args.files]
        names = list(args.files)
    else:
        if args.input_lines:
            text = read_text(args.input_lines, "--input-lines", errors=args.errors, fix=fix)
        else:
            stdin = getattr(sys.stdin, "buffer", None)  # a replaced sys.stdin (tests, notebooks) may be text
            data = stdin.read() if stdin is not None else sys.stdin.read().encode("utf-8", "surrogateescape")
            text = _decode(data, "<stdin>", args.errors)
        lines = text.split("\n")  # not splitlines(): a form feed inside a document is no new document
        if lines and lines[-1] == "":
            lines.pop()
        docs = [line.strip() for line in lines]
        names = [f"{args.input_lines or '<stdin>'}:{i + 1}" for i in range(len(docs))]
    if not docs:
        raise DataError(f"{args.input_lines or '<stdin>'}: no documents (one document per line expected)")
    for name, doc in zip(names, docs):
        if not doc:
            raise DataError(f"{name}: empty document")
    return names, docs


def check_arguments(args, parser) -> None:
    """Everything that needs no model: paths, clobbering, cross-flag ranges, the device."""
    from lsg_text.fileio import check_output_files

    if args.input_lines and args.files:
        parser.error("give either FILES or --input-lines, not both")
    if not os.path.isdir(args.model_dir):
        parser.error(f"MODEL_DIR {args.model_dir}: no such folder")
    given = args.checkpoint is not None
    if not given:
        args.checkpoint = folder_checkpoint(args.model_dir) or CHECKPOINT_NAMES[0]
    checkpoint = os.path.join(args.model_dir, args.checkpoint)
    if not os.path.isfile(checkpoint):
        if os.path.isfile(os.path.join(args.model_dir, "config.json")):
            parser.error(
                f"MODEL_DIR {args.model_dir}: an HF model folder (config.json), not a fairseq one; convert it "
                f"first (lsg-fairseq-convert {args.model_dir} OUT_DIR) and summarize with OUT_DIR"
            )
        if given:
            parser.error(f"--checkpoint: {checkpoint} does not exist")
        parser.error(
            f"MODEL_DIR {args.model_dir}: no checkpoint (none of {', '.join(CHECKPOINT_NAMES)}); name its file "
            "with --checkpoint"
        )
    for path in args.files + ([args.input_lines] if args.input_lines else []):
        where = "--input-lines: " if path == args.input_lines else ""
        if os.path.isdir(path):
            parser.error(f"{where}{path}: a folder, not a text file (name the files in it)")
        if not os.path.exists(path):
            parser.error(f"{where}{path}: no such file")
        if not os.path.isfile(path):  # a pipe (<(cmd)), a device: read twice here, so a regular file
            parser.error(f"{where}{path}: not a regular file (write it to a file first)")
    if min_len_out_of_reach(args.min_len, 0, args.max_len_b):  # max_len_a is 0 here
        parser.error(f"--min-len {args.min_len} is above --max-len-b {args.max_len_b}")
    model_files = [os.path.join(args.model_dir, n) for n in os.listdir(args.model_dir)]
    try:  # a folder, a path below a file, or one of the inputs: else found only after generating
        check_output_files([args.output], "--output", args.files + [args.input_lines] + model_files + [args.model_dir])
    except ValueError as e:
        parser.error(str(e))
    import torch

    try:
        device = torch.device(args.device)
    except RuntimeError:
        parser.error(f"--device {args.device}: not a torch device (e.g. cpu, cuda, cuda:1)")
    if device.type not in ("cpu", "cuda"):  # torch names more (mps, xpu, meta, ...): the models run on these two
        parser.error(f"--device {args.device}: this command runs on cpu or cuda (e.g. cuda:1)")
    if args.quantize == "int8" and device.type != "cpu":
        parser.error(f"--quantize int8 runs on the CPU only; drop it or use --device cpu (got --device {args.device})")
    if device.type == "cuda" and not torch.cuda.is_available():
        parser.error(f"--device {args.device}: no CUDA device available; use --device cpu")
    if args.fp16 and args.bf16:
        parser.error("--fp16 and --bf16: give one")
    if args.fp16 and device.type != "cuda":
        parser.error("--fp16 needs a GPU (--device cuda)")
    if args.quantize == "int8" and args.bf16:
        parser.error("--quantize int8 quantizes the float32 model; drop --bf16")
    # the task would say so after loading, naming a --data flag this command does not have
    if not any(n.startswith("dict.") and n.endswith(".txt") for n in os.listdir(args.model_dir)):  # dict[.LANG].txt
        parser.error(
            f"MODEL_DIR {args.model_dir}: no dict.txt; copy there, as dict.txt, the dictionary the model was "
            "trained with (dict.txt or dict.source.txt of its data-bin folder)"
        )


def main(argv=None) -> None:
    parser = build_parser()
    # intermixed: FILES may follow an option (MODEL_DIR --checkpoint X doc.txt), where parse_args
    # matches FILES, empty, before the option and refuses doc.txt as an unrecognized argument
    args = parser.parse_intermixed_args(argv)
    check_arguments(args, parser)

    from lsg_fairseq._fairseq_logs import command_logging

    # fairseq's INFO lines (loading, batching) are none of the user's business, as in the converter;
    # fairseq's DataLoader asks torch to pin memory even on a CPU, and torch's warning about it too
    with command_logging(), warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r".*'pin_memory' argument is set as true", category=UserWarning)
        run(args, parser)


def run(args, parser) -> None:
    """Load the model, summarize, write (``args`` checked by :func:`check_arguments`)."""
    from lsg_text.errors import UserError, report
    from lsg_fairseq.models.hub import from_pretrained

    try:
        _, docs = read_documents(args)
        hub = from_pretrained(args.model_dir, args.checkpoint)
        if args.max_source_positions is not None:
            hub.set_max_source_positions(args.max_source_positions)
    except UserError as e:  # DataError, CheckpointError, MissingFileError: the message names the file
        sys.exit(report(e, PROG))
    except ValueError as e:  # fairseq's own (e.g. a malformed dict.txt), or a too long --max-source-positions
        parser.error(str(e))
    hub.eval()
    hub.to(args.device)
    if args.fp16:
        hub.half()
    if args.bf16:
        import torch

        hub.to(torch.bfloat16)  # S4D's parameters stay float32 (S4DKernel._apply)
    if args.quantize == "int8":
        from lsg_fairseq.quantize import quantize_int8

        quantize_int8(hub.model)  # in place: hub.models holds the same module
    from lsg_fairseq.device_policy import DeviceMemoryError, explain_out_of_memory

    start = time.time()
    try:
        # this command's flags, not fairseq-generate's (--max-tokens): the task names the batch
        with explain_out_of_memory(None, "generation", "lower --batch-size or --beam"):
            write_summaries(hub, docs, args, start)
    except DeviceMemoryError as e:  # nothing written: --output appears only when complete
        sys.exit(report(e, PROG))
    except OSError as e:  # an unwritable --output folder, a full disk: nothing half-written is left
        # the user's path, not the hidden temp file it was being written to
        sys.exit(report(f"--output {args.output or '<stdout>'}: {e.strerror or e}", PROG))


def write_summaries(hub, docs, args, start) -> None:
    from lsg_text.atomic import atomic_outputs

    # all or nothing: --output appears only once every summary is written
    with atomic_outputs([args.output or "-"]) as (out,):
        for i in range(0, len(docs), args.batch_size):
            chunk = docs[i : i + args.batch_size]
            summaries = hub.sample(
                chunk,
                beam=args.beam,
                lenpen=args.lenpen,
                max_len_a=0,
                max_len_b=args.max_len_b,
                min_len=args.min_len,
                no_repeat_ngram_size=args.no_repeat_ngram_size,
            )
            for summary in summaries:
                out.write(summary.replace("\n", " ") + "\n")
            out.flush()
            if not args.quiet:
                done = min(i + args.batch_size, len(docs))
                print(f"[{done}/{len(docs)}] {time.time() - start:.1f}s", file=sys.stderr)


if __name__ == "__main__":
    main()
