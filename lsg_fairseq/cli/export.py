"""``lsg-fairseq-export``: a fairseq checkpoint or model folder -> an HF model folder.

    lsg-fairseq-export CKPT_OR_MODEL_DIR HF_DIR [--force]

The inverse of ``lsg-fairseq-convert`` (``lsg_fairseq.convert.export``): the checkpoint's arch
names its model family (``lsg_fairseq.convert.families()``), which writes that family's HF folder:
bart -> BartForConditionalGeneration, led -> LEDForConditionalGeneration, lsg_bart -> the LSG-BART
format of the LSG authors, locost -> the reference LOCOST format. Refusals exit with status 2 and
leave HF_DIR untouched.
"""

import argparse
import sys

from lsg_fairseq._fairseq_logs import command_logging


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="lsg-fairseq-export",
        description="Export an lsg-fairseq model (model.pt from lsg-fairseq-convert, or a training run's "
        "checkpoint_best.pt) to a HuggingFace folder. Optimizer state is dropped.",
    )
    p.add_argument(
        "src",
        metavar="CKPT_OR_MODEL_DIR",
        help="fairseq checkpoint, or a folder holding model.pt (else checkpoint_best.pt, else checkpoint_last.pt)",
    )
    p.add_argument("out", metavar="HF_DIR", help="output folder (created; must be empty unless --force)")
    p.add_argument("--force", action="store_true", help="replace HF_DIR if it exists and is not empty")
    return p


def main(argv=None) -> None:
    args = build_parser().parse_args(argv)
    with command_logging():
        from lsg_fairseq.convert import export
        from lsg_text.atomic import as_the_user_named_it
        from lsg_text.errors import UserError, report

        try:
            path = export(args.src, args.out, force=args.force)
        except UserError as e:  # ConversionError, DataError: the message names the file or flag
            sys.exit(report(e, "lsg-fairseq-export"))
        except OSError as e:  # a full disk, a folder that refuses a rename: HF_DIR is left as it was
            where = as_the_user_named_it(e.filename, args.out)
            sys.exit(report(f"{where}: {e.strerror or e} (HF_DIR left unchanged)", "lsg-fairseq-export"))
        print(path)


if __name__ == "__main__":
    main()
