"""``lsg-fairseq-convert``: HF folders / fairseq checkpoints -> fairseq model folders.

    lsg-fairseq-convert SRC_DIR OUT_DIR [--to bart|lsg_bart|led|...] [--max-source-positions N]
                        [--num-global-tokens G] [LSG flags] [LED flags]

Writes ``OUT_DIR/model.pt``, ``dict.txt``, offline tokenizer files and, only when fairseq
indices differ from HF ids, ``token_map.json``. Only the options given on the command line are
passed to the converter family (each family has its own defaults).
"""
import argparse
import logging
import sys


def _bool(value: str) -> bool:
    if value.lower() in ("1", "true", "yes", "on"):
        return True
    if value.lower() in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true/false, got {value!r}")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="lsg-fairseq-convert",
        description="Convert an HF model folder (BART, LSG-BART, LOCOST, LED) or an lsg-fairseq "
        "checkpoint into a fairseq model folder (model.pt + dict.txt + tokenizer files).",
    )
    p.add_argument("src", metavar="SRC_DIR", help="HF model folder, or a fairseq model.pt / its folder")
    p.add_argument("out", metavar="OUT_DIR", help="output folder (created)")
    p.add_argument("--to", help="target model: bart, lsg_bart or led for BART sources (default: "
                   "lsg_bart for LSG sources or when LSG options are given, else the source's kind)")
    p.add_argument("--max-source-positions", type=int, metavar="N",
                   help="encoder max length; position tables are tiled (default: the source's, "
                   "4096 for a BART -> LSG conversion)")
    p.add_argument("--max-target-positions", type=int, metavar="N",
                   help="decoder max length; its position table is tiled or cut (default: the "
                   "source's decoder length; BART -> LSG: the new encoder length, as the reference)")
    lsg = p.add_argument_group("LSG options (default: the source's settings, else the reference's)")
    lsg.add_argument("--num-global-tokens", type=int, metavar="G", help="global tokens (1..512)")
    lsg.add_argument("--block-size", type=int, metavar="N", help="local block size")
    lsg.add_argument("--sparse-block-size", type=int, metavar="N",
                     help="sparse keys on each side of the local window (0: none)")
    lsg.add_argument("--sparsity-factor", type=int, metavar="N", help="sparse sequence = length / N")
    lsg.add_argument("--sparsity-type", metavar="TYPE",
                     help="none, norm, pooling, stride, block_stride, lsh or bos_pooling")
    lsg.add_argument("--mask-first-token", type=_bool, metavar="BOOL",
                     help="hide the first token from attention (true/false)")
    lsg.add_argument("--pass-global-tokens-to-decoder", type=_bool, metavar="BOOL",
                     help="decoder cross-attends to the global tokens (true/false)")
    lsg.add_argument("--pool-with-global", type=_bool, metavar="BOOL",
                     help="global 0 replaces token 0 when globals are not passed (true/false)")
    lsg.add_argument("--lsh-num-pre-rounds", type=int, metavar="N", help="lsh merging rounds")
    lsg.add_argument("--global-positional-stride", type=int, metavar="N",
                     help="BART -> LSG: position stride of the global-token init (default 64)")
    lsg.add_argument("--seed", type=int, help="BART -> LSG: seed of the random parts of the init (default 123)")
    led = p.add_argument_group("LED options (HF LED sources, or BART sources with --to led)")
    led.add_argument("--attention-window", metavar="W",
                     help="full Longformer window per encoder layer (even): one int or a comma "
                     "list, one per layer (default: the LED source's, 1024 for BART -> LED)")
    led.add_argument("--global-attention", choices=("first", "none"),
                     help="encoder global tokens: the first real token of every source (default) or none")
    led.add_argument("--global-token-ids", metavar="IDS",
                     help="comma-separated token ids that also get global attention")
    return p


def main(argv=None) -> None:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s: %(message)s")
    options = {k: v for k, v in vars(args).items() if k not in ("src", "out") and v is not None}
    from lsg_fairseq.convert import ConversionError, convert

    try:
        path = convert(args.src, args.out, **options)
    except ConversionError as e:
        print(f"lsg-fairseq-convert: error: {e}", file=sys.stderr)
        sys.exit(2)
    print(path)


if __name__ == "__main__":
    main()
