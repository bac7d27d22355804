"""``lsg-fairseq-convert``: HF folders / fairseq checkpoints -> fairseq model folders.

    lsg-fairseq-convert SRC_DIR OUT_DIR [--to bart|lsg_bart|led|...] [--max-source-positions N]
                        [--num-global-tokens G] [LSG flags] [LED flags] [--force]

Writes ``OUT_DIR/model.pt``, ``dict.txt``, offline tokenizer files and, only when fairseq
indices differ from HF ids, ``token_map.json``, and ``tokenizer.txt`` naming the tokenizer. Only the
options given on the command line are passed to the converter family (each family has its own
defaults). OUT_DIR appears complete or not at all (built in a temp folder beside it); a non-empty
OUT_DIR is refused unless ``--force``, which replaces it as a whole.
"""
import argparse
import logging
import sys

from lsg_text.argtypes import NON_NEGATIVE_INT, POSITIVE_INT


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="lsg-fairseq-convert",
        argument_default=argparse.SUPPRESS,
        description="Convert an HF model folder (BART, LSG-BART, LOCOST, LED) or an lsg-fairseq "
        "checkpoint into a fairseq model folder (model.pt + dict.txt + tokenizer files).",
    )
    p.add_argument("src", metavar="SRC_DIR", help="HF model folder, or a fairseq model.pt / its folder")
    p.add_argument("out", metavar="OUT_DIR", help="output folder (created; must be absent or empty "
                   "unless --force)")
    p.add_argument("--force", action="store_true",
                   help="replace a non-empty OUT_DIR as a whole (only once the new one is complete)")
    p.add_argument("--to", help="target model: bart, lsg_bart or led for BART sources (default: "
                   "lsg_bart for LSG sources or when LSG options are given, else the source's kind)")
    # Model flags come from the models themselves (one home per hyper-parameter). The parser's
    # SUPPRESS default leaves out what was not given, so each family applies its own defaults
    # (the source's settings, else the architecture's).
    from lsg_fairseq.models import led, lsg_bart

    p.add_argument("--max-source-positions", type=POSITIVE_INT, metavar="N",
                   help="encoder max length; position tables are tiled (default: the source's, or the "
                   f"target architecture's for a BART -> LSG/LED conversion: {lsg_bart.MAX_SOURCE_POSITIONS} / "
                   f"{led.MAX_SOURCE_POSITIONS})")
    p.add_argument("--max-target-positions", type=POSITIVE_INT, metavar="N",
                   help="decoder max length; its position table is tiled or cut (default: the "
                   "source's decoder length; BART -> LSG: the new encoder length, as the reference)")
    lsg_bart.LSGBARTModel.add_lsg_args(p.add_argument_group("LSG options (default: the source's settings, else the reference's)"))
    conversion = p.add_argument_group("BART -> LSG initialisation (spec lsg.md section 6)")
    conversion.add_argument("--global-positional-stride", type=POSITIVE_INT, metavar="N",
                            help="position stride of the global-token init (default 64)")
    conversion.add_argument("--seed", type=NON_NEGATIVE_INT, help="seed of the random parts of the init (default 123)")
    led.LEDModel.add_led_args(p.add_argument_group(
        "LED options (HF LED sources, or BART sources with --to led; default: the source's, "
        "window 1024 for BART -> LED)"))
    return p


def main(argv=None) -> None:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s: %(message)s")
    options = {k: v for k, v in vars(args).items() if k not in ("src", "out")}
    from lsg_fairseq.convert import convert
    from lsg_text.errors import UserError, report

    try:
        path = convert(args.src, args.out, **options)
    except UserError as e:  # ConversionError, DataError, CheckpointError: the message names the file
        sys.exit(report(e, "lsg-fairseq-convert"))
    except OSError as e:  # an unwritable parent folder, a full disk: OUT is left as it was
        sys.exit(report(f"{e.filename or args.out}: {e.strerror or e} (OUT_DIR left unchanged)", "lsg-fairseq-convert"))
    print(path)


if __name__ == "__main__":
    main()
