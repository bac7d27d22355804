"""``fairseq-validate`` without ``--task``: argparse's own error instead of ``KeyError: None``.

fairseq 0.12's validation parser has no default task (fairseq-generate's is translation,
fairseq-train's translation), and ``options.parse_args_and_arch`` looks ``args.task`` up in the
task registry without checking it: ``TASK_REGISTRY[None]``, a KeyError traceback that names
nothing. The wrapper turns exactly that case into ``parser.error``, what argparse says of any other
missing required flag (exit status 2). No upstream issue found.
"""

from fairseq import options

from lsg_fairseq.fairseq_fixes._wrap import wrap


def _missing_task(original):
    def parse_args_and_arch(parser, input_args=None, *args, **kwargs):
        try:
            return original(parser, input_args, *args, **kwargs)
        except KeyError as e:
            if e.args != (None,) or getattr(parser.parse_known_args(input_args)[0], "task", "") is not None:
                raise  # not the lookup of a missing --task
            parser.error(
                "the following arguments are required: --task (the checkpoint's, e.g. --task "
                "long_document_summarization)"
            )

    return parse_args_and_arch


def install() -> None:
    wrap(options, "parse_args_and_arch", _missing_task)
