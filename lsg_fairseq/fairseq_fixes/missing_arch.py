"""``fairseq-train`` without ``--arch``: argparse's own error instead of a bare traceback (fairseq#4326).

fairseq 0.12's ``options.parse_args_and_arch`` looks ``args.arch`` up in the model registries to
add the arch's flags; when no ``--arch`` was given it is None, found in neither, and the function
raises ``RuntimeError()`` with no message: a traceback that names nothing. The wrapper turns exactly
that case into ``parser.error``, what argparse says of any other missing required flag (usage, then
``error: the following arguments are required: --arch/-a``, exit status 2). Any other exception,
and every parse with an ``--arch``, is untouched.
"""

from fairseq import options

from lsg_fairseq.fairseq_fixes._wrap import wrap


def _missing_arch(original):
    def parse_args_and_arch(parser, input_args=None, parse_known=False, suppress_defaults=False, modify_parser=None):
        try:
            return original(
                parser,
                input_args=input_args,
                parse_known=parse_known,
                suppress_defaults=suppress_defaults,
                modify_parser=modify_parser,
            )
        except RuntimeError as e:
            if e.args or getattr(parser.parse_known_args(input_args)[0], "arch", "") is not None:
                raise  # not fairseq's bare raise for a missing --arch
            parser.error(
                "the following arguments are required: --arch/-a (e.g. --arch lsg_bart_base; the list: "
                f"{parser.prog} --user-dir DIR --help)"
            )

    return parse_args_and_arch


def install() -> None:
    wrap(options, "parse_args_and_arch", _missing_arch)
