"""``lsg-fairseq-convert``: HF folders / fairseq checkpoints -> fairseq model folders.

    lsg-fairseq-convert SRC_DIR OUT_DIR [--to FAMILY] [--max-source-positions N] [family flags] [--force]

Writes ``OUT_DIR/model.pt``, ``dict.txt``, offline tokenizer files and, only when fairseq
indices differ from HF ids, ``token_map.json``, and ``tokenizer.txt`` naming the tokenizer. The
families (``lsg_fairseq.convert.families()``) give ``--to``'s choices and their own flags; only the
options given on the command line are passed on, so each family applies its own defaults (the
source's settings, else the architecture's). OUT_DIR appears complete or not at all (built in a
temp folder beside it); a non-empty OUT_DIR is refused unless ``--force``, which replaces it as a
whole.
"""

import argparse
import sys

from lsg_fairseq._fairseq_logs import command_logging


def build_parser() -> argparse.ArgumentParser:
    from lsg_fairseq.convert import families
    from lsg_fairseq.convert.common import arch_defaults

    known = families()
    p = argparse.ArgumentParser(
        prog="lsg-fairseq-convert",
        argument_default=argparse.SUPPRESS,  # options not given are left out: the family's defaults apply
        description=f"Convert an HF model folder ({', '.join(f.label for f in known.values())}) or an "
        "lsg-fairseq checkpoint into a fairseq model folder (model.pt + dict.txt + tokenizer files).",
    )
    p.add_argument(
        "src",
        metavar="SRC_DIR",
        help="HF model folder, or a fairseq checkpoint or a folder holding one (model.pt, else "
        "checkpoint_best.pt, else checkpoint_last.pt, as lsg-fairseq-export picks)",
    )
    p.add_argument("out", metavar="OUT_DIR", help="output folder (created; must be absent or empty unless --force)")
    p.add_argument(
        "--force",
        action="store_true",
        help="replace a non-empty OUT_DIR as a whole (only once the new one is complete)",
    )
    p.add_argument(
        "--to",
        choices=list(known),
        metavar="FAMILY",
        help=f"target model family: {', '.join(known)} (default: the source's own, or the family "
        "that the options given ask for, e.g. LSG options on a BART source)",
    )
    # the lengths' range is checked by the converter, for this command and the Python API alike
    base = ", ".join(f"{name} {arch_defaults(f.arch('base')).max_source_positions}" for name, f in known.items())
    p.add_argument(
        "--max-source-positions",
        type=int,
        metavar="N",
        help="encoder max length; position tables are tiled (default: the source's, or the target "
        f"architecture's when an HF BART folder gets a new encoder; base sizes: {base}); on a BART source "
        "without --to it picks lsg_bart: add --to bart to keep BART",
    )
    p.add_argument(
        "--max-target-positions",
        type=int,
        metavar="N",
        help="decoder max length; its position table is tiled or cut (default: the "
        "source's decoder length; BART -> LSG: the new encoder length, as the reference)",
    )
    for family in known.values():
        family.add_args(p)
    return p


def main(argv=None) -> None:
    args = build_parser().parse_args(argv)
    with command_logging():
        options = {k: v for k, v in vars(args).items() if k not in ("src", "out")}
        from lsg_fairseq.convert import convert
        from lsg_text.atomic import as_the_user_named_it
        from lsg_text.errors import UserError, report

        try:
            path = convert(args.src, args.out, **options)
        except UserError as e:  # ConversionError, DataError, CheckpointError: the message names the file
            sys.exit(report(e, "lsg-fairseq-convert"))
        except OSError as e:  # an unwritable parent folder, a full disk: OUT is left as it was
            where = as_the_user_named_it(e.filename, args.out)
            sys.exit(report(f"{where}: {e.strerror or e} (OUT_DIR left unchanged)", "lsg-fairseq-convert"))
        print(path)
        flags = training_flags(path)
        if flags:
            print(
                f"fairseq-train builds the model from its command line; fine-tune {path} with {flags}", file=sys.stderr
            )


# The model sizes, for a checkpoint whose sizes are not its --arch's (BART's names, then LOCOST's)
SIZE_SETTINGS = (
    *(f"{side}_{name}" for side in ("encoder", "decoder") for name in ("embed_dim", "ffn_embed_dim", "layers")),
    *("encoder_attention_heads", "decoder_attention_heads", "d_model", "d_ff", "d_kv", "d_state"),
)


def training_flags(path: str) -> str:
    """The fairseq-train flags that build the model of the checkpoint at ``path`` (fairseq builds the
    model from the command line): its ``--arch`` and lengths, its sizes where ``--arch`` alone would
    give others, and its ``weightless_settings`` (LSG's or LED's attention, which no weight records)."""
    import argparse

    from fairseq.models import ARCH_CONFIG_REGISTRY, ARCH_MODEL_REGISTRY

    from lsg_fairseq.checkpoint_policy import saved_model_cfg, settings_flags
    from lsg_fairseq.checkpoint_policy import model_arch

    cfg = saved_model_cfg(path)
    arch = model_arch(cfg) if cfg is not None else ""
    if arch not in ARCH_MODEL_REGISTRY:
        return ""
    sizes = argparse.Namespace()
    ARCH_CONFIG_REGISTRY[arch](sizes)  # what --arch alone gives
    values = {"arch": arch}
    for name in ("max_source_positions", "max_target_positions", *SIZE_SETTINGS):
        value = getattr(cfg, name, None)
        if value is not None and (name.startswith("max_") or value != getattr(sizes, name, value)):
            values[name] = value
    settings = getattr(ARCH_MODEL_REGISTRY[arch], "weightless_settings", None)
    return settings_flags({**values, **(settings(cfg) if settings else {})})


if __name__ == "__main__":
    main()
