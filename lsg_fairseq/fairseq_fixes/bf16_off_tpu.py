"""Make ``--bf16`` / ``--memory-efficient-bf16`` usable off TPUs (fairseq#4696).

fairseq 0.12's ``options.parse_args_and_arch`` sets ``args.tpu = True`` whenever bf16 is on (bf16
was TPU-only when it was written). The trainer then takes the XLA path and dies calling
``xm.xla_device()`` with no torch_xla installed, on GPUs and CPUs alike. The fix suggested in the
issue is to decouple the two flags: the wrapper sets ``tpu`` back to False when bf16 is on and
``--tpu`` was not given. For the same reason ``--fp16 --bf16`` ends in a ValueError traceback about
``--tpu``; the wrapper turns it into argparse's one line about the two flags given. Everything
else about bf16 is fairseq's own code (the model is cast with ``.to(torch.bfloat16)``, no loss scaling).

Verified on CPU (tests/test_bf16.py): ``--bf16`` (fp32 master weights, ``FP16Optimizer``) and
``--memory-efficient-bf16`` (``MemoryEfficientFP16Optimizer``) both run fairseq's trainer with
bf16 weights. Not verified: a GPU run (none was available). fairseq-hydra-train builds its config
without ``parse_args_and_arch`` and never had the bug (``common.tpu`` stays false; tests/test_hydra.py).
"""

import sys

from fairseq import options

from lsg_fairseq.fairseq_fixes._wrap import wrap


def _tpu_requested(input_args) -> bool:
    argv = sys.argv[1:] if input_args is None else input_args
    return any(a == "--tpu" for a in argv)


def _bf16_off_tpu(original):
    def parse_args_and_arch(parser, input_args=None, parse_known=False, suppress_defaults=False, modify_parser=None):
        try:
            result = original(
                parser,
                input_args=input_args,
                parse_known=parse_known,
                suppress_defaults=suppress_defaults,
                modify_parser=modify_parser,
            )
        except ValueError as e:
            if "Cannot combine --fp16 and --tpu" not in str(e) or _tpu_requested(input_args):
                raise
            # the same bug: --fp16 with --bf16 (each possibly --memory-efficient-) is refused as
            # "--fp16 and --tpu" and a traceback; argparse's own one line says what was given
            parser.error("--fp16 and --bf16 cannot be combined (or their --memory-efficient- forms): give one")
        args = result[0] if isinstance(result, tuple) else result
        if getattr(args, "bf16", False) and getattr(args, "tpu", False) and not _tpu_requested(input_args):
            args.tpu = False
        return result

    return parse_args_and_arch


def install() -> None:
    wrap(options, "parse_args_and_arch", _bf16_off_tpu)
