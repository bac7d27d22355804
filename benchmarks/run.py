"""Long-input benchmark suite: full-attention BART vs LSG-BART vs LED vs LOCOST, base size.

For every (length, mode, arch) one fresh process builds the model with random weights and measures,
at batch 1 (``--batch N``: N sequences of the length a call, no padding; each record names its batch)
(on CPU the process is forked from this one, so imports are paid once; with ``--device
cuda`` it is spawned, since CUDA cannot be used in a child forked from a process that touched it,
and this process never touches CUDA: the device is described by a spawned probe; ``processes.py``):

- ``enc``:   encoder forward, no grad (eval mode);
- ``train``: forward + backward of the whole model, teacher-forced ``--target-len``-token target,
             cross-entropy loss (train mode, the architecture's dropout);
- ``gen``:   beam search, beam ``--beam``, exactly ``--new-tokens`` new tokens (min = max length),
             fairseq's ``SequenceGenerator`` as ``fairseq-generate`` runs it; includes the encoder.

Time: median of the timed repeats after ``--warmup`` untimed calls (repeats stop early once
``--budget`` seconds are spent, at least one). Memory: peak RSS of the process (VmHWM, reset after
the model is built) on CPU, ``torch.cuda.max_memory_allocated`` on GPU; reported absolute and
above the resident weights ("activations"). Within each length and mode all archs run back to
back, so ratios between archs see the same machine load.

Architectures (``--arch``): the benchmark rows of every model family (``lsg_fairseq.convert``,
``Family.benchmarks``: a new family brings its own, which says which modes it runs, its vocabulary,
whether ``--smoke`` runs it: ``lsg_fairseq.convert.registry.BenchRow``), plus ``linear``, the int8
variants and the HF peers built here.

- ``bart``: stock fairseq ``bart_base`` (6+6 layers, d 768); self-attention is
  ``F.multi_head_attention_forward`` -> ``scaled_dot_product_attention`` (full attention).
- ``lsg_<type>``: ``lsg_bart_base``, block 128, sparse block 128, factor 4, 1 global token, one
  arch per sparsity type (``lsg_none`` = local + global only). ``--main-lsg`` (lsg_norm) runs every
  mode; the others run ``--secondary-modes`` (enc) and ``train`` at ``--train-every-arch-at`` (16K).
- ``linear``: the lsg_norm encoder with the attention core removed (q/k/v/out projections, FFN,
  norms, embeddings still run): the floor every encoder attention pays on top of. Runs every mode.
- ``led``: ``led_base``, window 1024, first token global.
- ``locost``: ``locost_base`` (12+12 layers, d 768, N 512) as inference runs it: after the warm-up
  call the SSM kernels are cached up to ``--ssm-kernel-cache-mb`` per layer (default 30 MiB: all
  of them up to ~8K tokens, ~80% at 16K); the rest are generated in every call.
- ``locost_cold``: the same with the cache off (``enc`` only): every forward generates its kernels,
  as the first call at a new length does (and as every training step does). Both ``enc`` records
  split out SSM kernel generation and the rest of the SSM token mixer (FFTs, transposes, gate).
- ``locost_ckpt``: ``locost`` with ``--checkpoint-activations`` (``train`` only): how LOCOST trains
  on inputs whose activations do not fit otherwise.
- ``lsg_norm_flex``, ``led_flex``: ``lsg_norm`` / ``led`` with their attention forced onto
  FlexAttention (``lsg_layers.ops.flex``; CUDA, or a CPU without autograd; elsewhere the layers take
  whole tensors and the record says so): what ``auto`` ran on a GPU before the whole-tensor path
  measured faster there. Only when ``--arch`` names them.
- ``lsg_norm_int8``, ``led_int8``: ``lsg_norm`` / ``led`` after ``lsg_fairseq.quantize.quantize_int8``
  (dynamic int8 linear layers; ``enc`` only, CPU fp32). In the default arch list only where
  ``lsg_fairseq.quantize`` exists.
- ``hf_bart``, ``hf_led``: the peers, HF transformers' own ``BartForConditionalGeneration`` (SDPA
  attention) and ``LEDForConditionalGeneration`` (window ``--attention-window``, first token
  global) of the same sizes, random weights built from a config (nothing downloaded); ``enc`` and
  ``train`` only, where ``transformers`` is installed (``--arch`` names them; not in the default list).

``--layer-path cpu|whole`` forces the implementation of the layers that have two
(``lsg_layers.modules.paths``; default ``auto``: whole tensors on GPU, the CPU paths on CPU), e.g.
to time the whole-tensor paths on a CPU.

``--compile-layers`` compiles the encoder layers of the fairseq archs (``bart``, ``linear``, LSG,
LED: ``lsg_fairseq.models.compiled_layers``; LOCOST and the HF peers have no such layers and are
recorded as failed): static graphs per length, compiled by the warm-up calls (LSG's in its first
two; ``--warmup 2``), and each record counts the graphs its timed calls compiled
(``graphs_compiled_while_timed``, 0 where the warm-up held them all). Where a GPU's step waits on
the host (batch 1), it measures how much of a row's time is the eager dispatch.

Every time cell shows the ratio to ``bart`` and to ``linear`` at the same length and mode, every
memory cell the same ratios of the peak above the weights, then the absolute peak. The report
checks issue 13's targets (and the earlier issues' that still apply) from the CPU records; a GPU
run's targets (issues 32, 33) are judged by ``gpu_check.sh``'s report instead.

Outputs ``<out>/<tag>.json``, ``<tag>.md`` (tables, growth exponents, target checks) and
``<tag>_time.png`` / ``<tag>_memory.png`` (log-log), drawn by ``benchmarks/report.py``.
``--append`` merges into an existing JSON (e.g. a separate run of the long LOCOST lengths). A
``<tag>.json`` that is not run.py's (``gpu_check.sh`` writes ``cuda.json``), or that holds the other
kind of figures (``--smoke`` beside measured, or rows of another ``--batch`` to append to), is
refused before anything runs.

    python benchmarks/run.py                                   # the default suite (CPU: ~70 min)
    python benchmarks/run.py --arch locost --modes enc --lengths 65536 262144 --warmup 0 --append
    python benchmarks/run.py --append --arch lsg_norm_int8 led_int8 --modes enc   # int8 rows only
    python benchmarks/run.py --smoke --out /tmp/bench          # tiny models, one length (CI)
    python benchmarks/run.py --device cuda --dtype bf16 --tag cuda_rows --max-full-length 65536 --warmup 2 \
        --repeat 5 --lengths 4096 16384 65536 --arch bart linear lsg_norm led locost locost_cold hf_bart hf_led
"""

import argparse
import dataclasses
import datetime
import itertools
import json
import logging
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)

# Imported once here; every measurement is a fork of this process. No tensor op may run in the
# parent before forking (an initialised OpenMP pool does not survive fork).
import torch  # noqa: E402

import lsg_fairseq  # noqa: E402,F401  (registers lsg_bart, led, locost)
import report  # noqa: E402  (benchmarks/report.py: tables, targets, plots)
from fairseq import options  # noqa: E402
from fairseq.models import ARCH_MODEL_REGISTRY  # noqa: E402

from lsg_fairseq.convert import families  # noqa: E402
from lsg_fairseq.convert.registry import BenchRow, BenchSettings  # noqa: E402
from lsg_fairseq.models.compiled_layers import compile_encoder_layers  # noqa: E402
from lsg_text.argtypes import int_range  # noqa: E402
from lsg_text.atomic import atomic_outputs  # noqa: E402
from lsg_text.errors import ConfigError, UserError  # noqa: E402
from lsg_text.errors import report as report_error  # noqa: E402  (the module `report` is the tables)
from lsg_text.provenance import cpu_name  # noqa: E402,F401  (int8.py, cpu_path_by_head_dim.py import it from here)
from lsg_layers.modules.paths import PATHS, forced_path, paths_ran  # noqa: E402
from report import MODES  # noqa: E402
from bench_models import ProjectionsOnly, _Task, build_hf_model, make_dictionary, make_step  # noqa: E402
import processes  # noqa: E402  (benchmarks/processes.py: where a row is measured)
from processes import probe_device, row_fields, start_method  # noqa: E402,F401
from readings import profile_table, read_peak, reset_peak, ssm_breakdown, sync  # noqa: E402
from tables import read_table, refuse_mixed_figures  # noqa: E402

logging.getLogger("matplotlib").setLevel(logging.WARNING)


def family_rows():
    """{row: BenchRow} of every model family, in the registry's order, and {row: its family's name}."""
    rows, owner = {}, {}
    for family in families().values():
        for name, row in family.benchmarks().items():
            if name in rows:
                raise ValueError(f"benchmark row {name!r} of the {family.name} family is the {owner[name]} family's")
            rows[name], owner[name] = row, family.name
    return rows, owner


FAMILY_ROWS, ROW_FAMILY = family_rows()
# Rows built here from the families' (the fairseq archs): the lsg_norm encoder without its attention
# core, the lsg_norm / led models after quantize_int8 (enc only, where lsg_fairseq.quantize exists),
# and the two with their attention forced onto FlexAttention (a GPU's path before auto took whole
# tensors there: so that one run compares both).
OWN_ROWS = {
    "linear": dataclasses.replace(FAMILY_ROWS["lsg_norm"], variant=False, smoke=True, color="tab:gray"),
    "lsg_norm_int8": dataclasses.replace(FAMILY_ROWS["lsg_norm"], modes=("enc",), variant=False, color="navy"),
    "led_int8": dataclasses.replace(FAMILY_ROWS["led"], modes=("enc",), variant=False, color="darkgreen"),
    "lsg_norm_flex": dataclasses.replace(
        FAMILY_ROWS["lsg_norm"], variant=False, default=False, smoke=False, layer_path="flex", color="tab:cyan"
    ),
    "led_flex": dataclasses.replace(
        FAMILY_ROWS["led"], default=False, smoke=False, layer_path="flex", color="tab:olive"
    ),
}
INT8_ARCHS = ("lsg_norm_int8", "led_int8")
# The peers: transformers' own encoders (build_hf_model), only when --arch names them.
HF_ROWS = {
    "hf_bart": BenchRow(
        None,
        modes=("enc", "train"),
        default=False,
        smoke=False,
        full_attention=True,
        growth=FAMILY_ROWS["bart"].growth,
        color="tab:purple",
    ),
    "hf_led": BenchRow(None, modes=("enc", "train"), default=False, smoke=False, color="tab:brown"),
}
HF_ARCHS = tuple(HF_ROWS)
_CLASH = sorted(set(FAMILY_ROWS) & (set(OWN_ROWS) | set(HF_ROWS)))
if _CLASH:
    raise ValueError(f"benchmark rows {', '.join(_CLASH)} of a model family are run.py's own")
ROWS = {**FAMILY_ROWS, **OWN_ROWS, **HF_ROWS}
ALL_ARCHS = tuple(ROWS)


def quantize_available() -> bool:
    """Whether ``lsg_fairseq.quantize`` (``quantize_int8``, which the int8 archs need) is installed."""
    import importlib.util

    return importlib.util.find_spec("lsg_fairseq.quantize") is not None


def default_archs():
    """Every row whose ``default`` is set (all but the HF peers); the int8 ones only where
    ``lsg_fairseq.quantize`` exists."""
    return [a for a, row in ROWS.items() if row.default and (a not in INT8_ARCHS or quantize_available())]


def bench_settings(args) -> BenchSettings:
    """What the rows read of these flags: each field of ``BenchSettings`` from the flag of its name."""
    return BenchSettings(**{f.name: getattr(args, f.name) for f in dataclasses.fields(BenchSettings)})


def parse_args(argv=None):
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=__doc__.split("\n\n", 1)[1],
    )
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument(
        "--arch",
        nargs="+",
        default=None,
        choices=ALL_ARCHS,
        metavar="ARCH",
        help=f"architectures (default: all, the int8 ones only where lsg_fairseq.quantize "
        f"exists): {', '.join(ALL_ARCHS)}",
    )
    p.add_argument("--modes", nargs="+", default=list(MODES), choices=MODES)
    p.add_argument("--lengths", type=int, nargs="+", default=[1024, 4096, 16384])
    p.add_argument(
        "--secondary-modes",
        nargs="*",
        default=["enc"],
        choices=MODES,
        help="modes run by the variant rows (the LSG sparsity types) other than --main-lsg (default: enc only, "
        "to keep the suite short)",
    )
    p.add_argument(
        "--train-every-arch-at",
        type=int,
        nargs="*",
        default=[16384],
        metavar="LENGTH",
        help="lengths at which the secondary LSG types run train too, so that every arch has a "
        "train row there (default: 16384; none: give the flag no value)",
    )
    p.add_argument("--main-lsg", default="lsg_norm", help="the variant row (LSG arch) that runs every mode")
    p.add_argument(
        "--max-full-length", type=int, default=16384, help="longest input for full-attention bart (quadratic time)"
    )
    p.add_argument(
        "--batch",
        type=int_range(1),
        default=1,
        help="sequences in each call, all of one length (no padding); the issues' targets are at batch 1",
    )
    p.add_argument("--target-len", type=int, default=256, help="teacher-forced target tokens (train)")
    p.add_argument("--new-tokens", type=int, default=128, help="tokens generated per hypothesis (gen)")
    p.add_argument("--beam", type=int, default=4)
    p.add_argument("--warmup", type=int, default=1, help="untimed calls before timing")
    p.add_argument("--repeat", type=int, default=3, help="timed calls (median reported)")
    p.add_argument(
        "--budget",
        type=float,
        default=12.0,
        help="stop repeating once this many seconds were timed (at least one call)",
    )
    p.add_argument("--timeout", type=float, default=900.0, help="seconds before a measurement is killed")
    p.add_argument("--threads", type=int, default=2, help="torch.set_num_threads in each measurement")
    p.add_argument("--dtype", default="fp32", choices=["fp32", "bf16", "fp16"])
    p.add_argument(
        "--layer-path",
        default="auto",
        choices=PATHS,
        help="force one path of the layers that have several: cpu, whole or flex (default auto: the CPU "
        "paths on a CPU, whole tensors on a GPU; flex only when forced)",
    )
    p.add_argument(
        "--start-method",
        default="auto",
        choices=["auto", "fork", "spawn"],
        help="how measurement processes start (auto: fork on CPU, spawn with --device cuda)",
    )
    # The rows' settings (BenchSettings: its fields are these flags, and their defaults)
    p.add_argument("--block-size", type=int, default=BenchSettings.block_size)
    p.add_argument("--sparse-block-size", type=int, default=BenchSettings.sparse_block_size)
    p.add_argument("--sparsity-factor", type=int, default=BenchSettings.sparsity_factor)
    p.add_argument("--num-global-tokens", type=int, default=BenchSettings.num_global_tokens)
    p.add_argument("--attention-window", type=int, default=BenchSettings.attention_window, help="LED full window W")
    p.add_argument(
        "--locost-kernel-cache-mb",
        type=float,
        default=BenchSettings.locost_kernel_cache_mb,
        help="--ssm-kernel-cache-mb for the locost arch (default: the arch's own default)",
    )
    p.add_argument(
        "--locost-kernel-compile",
        action="store_true",
        help="the locost archs with --ssm-kernel-compile (the fused, torch.compile'd kernel generator)",
    )
    p.add_argument(
        "--locost-kernel-product",
        choices=["fp32", "tf32", "bf16"],
        default=BenchSettings.locost_kernel_product,
        help="with --locost-kernel-compile: the generator's product precision when training in half "
        "precision (--ssm-kernel-product)",
    )
    p.add_argument(
        "--ssm-breakdown-max-length",
        type=int,
        default=65536,
        help="locost enc: split out kernel generation / FFT convolution (one extra encoder call) up to this length",
    )
    p.add_argument(
        "--checkpoint-activations",
        action="store_true",
        help="every fairseq arch with --checkpoint-activations (e.g. train at 64K; the HF peers are unchanged)",
    )
    p.add_argument(
        "--compile-layers",
        action="store_true",
        help="the fairseq archs' encoder layers torch.compile'd, one static graph per length "
        "(lsg_fairseq.models.compiled_layers; the warm-up calls compile: LSG's in its first two; a record "
        "counts the graphs its timed calls compiled)",
    )
    p.add_argument(
        "--compile-backend",
        default="inductor",
        choices=["inductor", "aot_eager"],
        help="with --compile-layers: torch.compile's backend (aot_eager: the same graphs run by eager "
        "kernels, no code generated: the CPU smoke's plumbing check)",
    )
    p.add_argument(
        "--one-process",
        action="store_true",
        help="all rows in one process, one after the other, instead of one each (spawned with "
        "--device cuda, where each process start costs seconds; on CPU a row's peak RSS "
        "then may include what earlier rows left in the heap)",
    )
    p.add_argument(
        "--control-row",
        action="store_true",
        help="with --one-process: time the first row again after the others, in a model built again "
        "(its record's `control`); a host or device that drifted while the process ran shows as a "
        "ratio away from 1",
    )
    p.add_argument(
        "--profile", action="store_true", help="also write a torch.profiler op table of one call per measurement"
    )
    p.add_argument("--out", default=os.path.join(REPO, "benchmarks", "results"))
    p.add_argument("--tag", default=None, help="output file stem (default: the device name)")
    p.add_argument("--append", action="store_true", help="merge into an existing <tag>.json")
    p.add_argument("--no-plots", action="store_true")
    p.add_argument(
        "--report-only", action="store_true", help="measure nothing: redraw <tag>.md and the plots from <tag>.json"
    )
    p.add_argument(
        "--smoke", action="store_true", help="tiny models, one 256-token length, 1 timed call: checks the plumbing (CI)"
    )
    args = p.parse_args(argv)
    if args.smoke:
        args.arch = args.arch or [a for a in default_archs() if ROWS[a].smoke]
        args.lengths = [256]
        args.target_len, args.new_tokens, args.beam = 16, 8, 2
        args.warmup, args.repeat, args.budget, args.threads = 0, 1, 1.0, 1
        args.block_size = args.sparse_block_size = 32
        args.attention_window = 64
        args.max_full_length = 256
        args.train_every_arch_at = [256]
    args.arch = list(args.arch or default_archs())
    args.tag = args.tag or args.device
    return args


# ---------------------------------------------------------------------------------- models
# (what each row builds is here; the model pieces and the timed calls are bench_models.py's, the
# memory and profiler readings readings.py's)
def model_argv(arch: str, length: int, args) -> list:
    """fairseq arch name + flags for one benchmark arch at one input length (its row's ``argv``;
    ``linear`` and the int8 archs have the lsg_norm / led rows')."""
    argv = ROWS[arch].argv(length, bench_settings(args))
    if args.checkpoint_activations and "--checkpoint-activations" not in argv:
        argv = argv + ["--checkpoint-activations"]
    return argv


def build_model(arch: str, length: int, args):
    if arch in HF_ARCHS:
        return build_hf_model(arch, length, args)
    fairseq_arch, *flags = model_argv(arch, length, args)
    vocab = 100 if args.smoke else ROWS[arch].vocab
    dictionary = make_dictionary(vocab)
    parser = options.get_training_parser()
    ns = options.parse_args_and_arch(
        parser,
        ["/nonexistent", "--task", "translation", "--arch", fairseq_arch, "--max-target-positions", "1024"] + flags,
    )
    model = ARCH_MODEL_REGISTRY[fairseq_arch].build_model(ns, _Task(dictionary))
    if arch == "linear":
        for layer in model.encoder.layers:
            layer.self_attn = ProjectionsOnly(layer.self_attn)
    if arch in INT8_ARCHS:
        if args.device != "cpu" or args.dtype != "fp32":
            raise ValueError(f"{arch}: int8 runs on the CPU in fp32 only (--device cpu --dtype fp32)")
        # imported here: run.py must import (and run every other arch) where the module is absent
        from lsg_fairseq.quantize import quantize_int8

        model = quantize_int8(model)  # CPU, fp32: nn.Linear -> dynamic int8 (inference only)
    return model, dictionary


# ---------------------------------------------------------------------------------- one measurement
def _built(arch, length, args):
    """(model on the device in the run's dtype, dictionary, device), seeded."""
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[args.dtype]
    torch.manual_seed(0)
    model, dictionary = build_model(arch, length, args)
    model.to(device=device, dtype=dtype)
    return model, dictionary, device


def _compiled(model, arch, args):
    """``model`` with its encoder layers compiled where ``--compile-layers`` asks (in place)."""
    if args.compile_layers:
        if arch in HF_ARCHS:
            raise ValueError(f"{arch}: --compile-layers compiles the fairseq archs' encoder layers only")
        compile_encoder_layers(model, dynamic=False, backend=args.compile_backend)
    return model


def _relative_diff(a, b) -> float:
    """max |a - b| / max |b|, in float32."""
    a, b = a.float(), b.float()
    return ((a - b).abs().max() / b.abs().max().clamp_min(1e-30)).item()


def measure(arch, mode, length, args, readings: bool = True) -> dict:
    """One row timed and, with ``readings``, profiled after (``take_readings``)."""
    model, dictionary, device = _built(arch, length, args)
    params = sum(p.numel() for p in model.parameters())
    with forced_path(model, ROWS[arch].layer_path or args.layer_path):
        # a compiled encoder's output against the eager one's, on the device measured (enc: no dropout);
        # the step calls the model's layers, compiled in place in between
        encode = (
            make_step(model, dictionary, mode, length, args, device) if args.compile_layers and mode == "enc" else None
        )
        eager = encode() if encode else None
        rec = measure_model(_compiled(model, arch, args), dictionary, arch, mode, length, args, device, readings)
        rec["layer_path"] = paths_ran(model)  # as the layers took it: cpu, whole, flex (None: no such layer)
        if args.compile_layers:
            rec["compiled_layers"] = True
        if encode:
            rec["compiled_vs_eager"] = _relative_diff(encode(), eager)
    rec["params"] = params
    if device.type == "cuda":
        rec["device_name"] = torch.cuda.get_device_name(device)
    return rec


def _splits_ssm(arch, mode, length, args) -> bool:
    return bool(ROWS[arch].ssm_split) and mode == "enc" and length <= args.ssm_breakdown_max_length


def wants_readings(arch, mode, length, args) -> bool:
    """Whether a row is profiled after it is timed: the S4D split, ``--profile``'s table."""
    return bool(args.profile) or _splits_ssm(arch, mode, length, args)


def take_readings(model, step, arch, mode, length, args, device) -> dict:
    """The row's readings under the profiler (after its timed calls, never before them)."""
    rec = {}
    if _splits_ssm(arch, mode, length, args):
        rec.update(ssm_breakdown(model, step, device))
    if args.profile:
        rec["profile"] = profile_table(step, arch, mode, length, args)
    return rec


def measure_readings(arch, mode, length, args) -> dict:
    """``take_readings`` of a row in a model built again, after one warm-up call (``--one-process``:
    every row of the process is timed before any is profiled)."""
    model, dictionary, device = _built(arch, length, args)
    _compiled(model, arch, args)
    with forced_path(model, ROWS[arch].layer_path or args.layer_path):
        step = make_step(model, dictionary, mode, length, args, device)
        step()  # what the timed calls found built: LOCOST's cached spectra, compiled kernels
        return take_readings(model, step, arch, mode, length, args, device)


def dynamo_frames() -> int:
    """The frames dynamo has compiled in this process so far (compile_counts.py counts its graphs so).
    0 before dynamo is imported (nothing has compiled then): importing it only to read 0 would cost
    every row seconds of imports (sympy's among them), in each forked or spawned child."""
    if "torch._dynamo" not in sys.modules:
        return 0
    from torch._dynamo.utils import counters

    return counters["frames"]["total"]


def measure_model(model, dictionary, arch, mode, length, args, device, readings: bool = True) -> dict:
    step = make_step(model, dictionary, mode, length, args, device)
    base = reset_peak(device)
    for _ in range(args.warmup):
        step()
    compiled_before = dynamo_frames()
    times, issued = [], []
    while len(times) < max(1, args.repeat):
        sync(device)
        t = time.perf_counter()
        out = step()
        issued.append(time.perf_counter() - t)  # the host has queued the call (on a GPU, not run it)
        sync(device)
        times.append(time.perf_counter() - t)
        if sum(times) >= args.budget:
            break
    peak = read_peak(device)
    rec = {
        "times_s": times,
        "median_s": statistics.median(times),
        # on a GPU: the host's share of the wall, near 1 where the host sets the pace (batch 1, many
        # small kernels) or where the driver's queue of pending launches is full, lower where the
        # device sets it; 1 on a CPU by definition
        "host_share": statistics.median(i / w for i, w in zip(issued, times)),
        "peak_mb": peak,
        "base_mb": base,
        "activations_mb": peak - base,
    }
    if args.compile_layers:
        # the warm-up calls are meant to hold every compile (tests/test_compiled_layers.py); counted
        # rather than assumed: when a call compiles depends on the row and on dynamo's guards (on
        # Python 3.13.0 one of LSG's fails a call late: scripts/torch_versions_py313.md)
        rec["graphs_compiled_while_timed"] = dynamo_frames() - compiled_before
    caches = [m.cached_kernel_bytes() for m in model.modules() if hasattr(m, "cached_kernel_bytes")]
    if caches:  # LOCOST: its kernel caches, made after the peak was reset, are in the peak
        rec["ssm_cache_mb"] = sum(caches) / 2**20
    if mode == "gen":
        rec["new_tokens"] = out
        rec["new_tokens_per_s"] = out / rec["median_s"]
    if readings:
        rec.update(take_readings(model, step, arch, mode, length, args, device))
    return rec


def measures() -> processes.Measures:
    """What a child process runs for a row: this module's functions as they are at the call (a
    spawned child finds them by name)."""
    return processes.Measures(measure, measure_readings, wants_readings)


def run_one(arch, mode, length, args) -> dict:
    """The record of one row, measured in a process of its own."""
    return processes.run_one(measures(), arch, mode, length, args)


def run_rows(rows, args):
    """The records of ``rows`` [(arch, mode, length)], measured in one process (``--one-process``)."""
    return processes.run_rows(measures(), rows, args)


def skipped(arch, length, args):
    """Why (arch, length) is not measured at all, or None."""
    if ROWS[arch].full_attention and length > args.max_full_length:
        return f"skipped: full attention beyond --max-full-length {args.max_full_length}"
    return None


def modes_of(arch, length, args):
    """The modes ``arch`` runs at ``length``: its row's, and of a variant row other than --main-lsg
    only --secondary-modes (and train at --train-every-arch-at). ``linear`` runs all three: it is a
    reference in every table."""
    row = ROWS[arch]
    modes = set(row.modes or MODES)
    if row.variant and arch != args.main_lsg:
        modes &= set(args.secondary_modes) | ({"train"} if length in (args.train_every_arch_at or ()) else set())
    return modes


def earlier_table(stem: str, args) -> tuple:
    """The records and runs that ``<stem>.json`` holds for this run to merge into (``--append``) or
    redraw (``--report-only``); ``[], []`` for a run that replaces it. Refused (:class:`UserError`):
    what :func:`read_table` refuses, and a table of the other kind of figures
    (:func:`refuse_mixed_figures`)."""
    old = read_table(stem + ".json", "run.py", ("records", "runs"), args.report_only)
    if old is None:
        return [], []
    if not args.report_only:
        held = {bool(run.get("config", {}).get("smoke")) for run in old["runs"]}
        refuse_mixed_figures(stem + ".json", held, args.smoke, args.append, "--smoke")
        batches = sorted({run.get("config", {}).get("batch", 1) for run in old["runs"]} - {args.batch})
        if args.append and batches:  # its rows would replace rows of the same arch, mode and length
            raise ConfigError(
                f"{stem}.json holds rows at batch {', '.join(map(str, batches))}, which a --batch {args.batch} run "
                "would merge into: choose another --out or --tag"
            )
    return (old["records"], old["runs"]) if args.append or args.report_only else ([], [])


def load_average():
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def main(argv=None):
    args = parse_args(argv)
    stem = os.path.join(args.out, args.tag)
    try:
        records, meta_runs = earlier_table(stem, args)
    except UserError as e:
        sys.exit(report_error(e, "run.py"))
    os.makedirs(args.out, exist_ok=True)
    if args.report_only:
        write_outputs(records, meta_runs, args, stem, plots=not args.no_plots)
        print(f"wrote {stem}.md" + ("" if args.no_plots else f", {stem}_time.png, {stem}_memory.png"))
        return
    device = probe_device(args)
    if not device["available"]:
        sys.exit(report_error(f"--device {args.device}: no such device visible to torch", "run.py"))
    run_meta = {
        "started": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "argv": sys.argv[1:] if argv is None else argv,
        "load_average_start": load_average(),
        "device": device["name"],
        "cuda": device["cuda"],
        "cpu": cpu_name(),
        "threads": args.threads,
        "torch": device["torch"],
        "dtype": args.dtype,
        "layer_path": args.layer_path,
        "config": {k: v for k, v in vars(args).items() if k not in ("out",)},
    }
    cuda = f"CUDA {run_meta['cuda']}, " if run_meta["cuda"] else ""
    print(
        f"# {run_meta['started']} {run_meta['device']} ({run_meta['cpu']}), torch {run_meta['torch']}, {cuda}"
        f"{args.threads} threads, load average {run_meta['load_average_start']}",
        flush=True,
    )
    start = time.time()
    plan = [
        (arch, mode, length)
        for length in args.lengths
        for mode in args.modes
        for arch in args.arch
        if mode in modes_of(arch, length, args)
    ]
    skips = [dict(row_fields(a, m, n, args), status=skipped(a, n, args)) for a, m, n in plan if skipped(a, n, args)]
    plan = [(a, m, n) for a, m, n in plan if not skipped(a, n, args)]
    measured = run_rows(plan, args) if args.one_process else (run_one(*row, args) for row in plan)
    for rec in itertools.chain(skips, measured):  # each record written as soon as it comes
        key = (rec["arch"], rec["mode"], rec["length"])
        records = [r for r in records if (r["arch"], r["mode"], r["length"]) != key]
        records.append(rec)
        if rec["status"] == "ok":
            msg = (
                f"{rec['median_s']:8.3f} s  peak {rec['peak_mb']:8.0f} MiB  "
                f"above weights {rec['activations_mb']:8.0f} MiB  ({len(rec['times_s'])} timed)"
            )
            if any(k in rec for k in ("profile", "ssm_share")):
                msg += "  + profiled readings"
            if "control" in rec:
                msg += f"  timed again last: {rec['control']['median_s']:.3f} s ({rec['control']['ratio']:.2f}x)"
        else:
            msg = rec["status"]
        # the seconds since the start: where a stage's wall goes (model builds, compiles, timed calls)
        print(f"{rec['length']:>7} {rec['mode']:<5} {rec['arch']:<16} {msg}  [{time.time() - start:.0f} s]", flush=True)
        write_outputs(records, meta_runs + [run_meta], args, stem, plots=False)
    run_meta["seconds"] = round(time.time() - start, 1)
    run_meta["load_average_end"] = load_average()
    meta_runs.append(run_meta)
    growth, checks = write_outputs(records, meta_runs, args, stem, plots=not args.no_plots)
    print("\n## Growth check (time and memory vs length, log-log exponent)\n")
    print(report.growth_markdown(growth))
    if records:
        print("\n## Targets\n")
        print(report.targets_markdown(checks))
    print(
        f"\nwrote {stem}.json, {stem}.md"
        + ("" if args.no_plots else f", {stem}_time.png, {stem}_memory.png")
        + f" in {run_meta['seconds']:.0f} s"
    )


def display_rows(records, meta_runs, args) -> list:
    """What the report knows of each arch the runs asked for or recorded, from its row, in
    ``report.display_order`` (by default the registry's order): its family, ``growth`` (the
    expected exponent), ``line`` (solid; dashed: a variant other than --main-lsg; dotted: int8) and
    ``color`` (None: matplotlib's next). An arch no row has any more (an old record) gets the defaults."""
    rows = []
    for arch in report.display_order(records, meta_runs):
        row = ROWS.get(arch, BenchRow(None))
        line = "dotted" if arch in INT8_ARCHS else "dashed" if row.variant and arch != args.main_lsg else "solid"
        rows.append(
            {"arch": arch, "family": ROW_FAMILY.get(arch), "growth": row.growth, "line": line, "color": row.color}
        )
    return rows


def write_outputs(records, meta_runs, args, stem, plots=True):
    """<stem>.json and <stem>.md (and the plots); called after every measurement, so that an
    interrupted run keeps what it measured (``--report-only`` redraws from the JSON). The JSON's
    ``rows`` (:func:`display_rows`) are all ``report.py`` knows of the rows."""
    rows = display_rows(records, meta_runs, args)
    growth = report.growth_rows(records, rows)
    checks = report.target_checks(records, args.main_lsg)
    result = {"runs": meta_runs, "rows": rows, "records": records, "growth": growth, "targets": checks}
    with atomic_outputs([stem + ".json", stem + ".md"]) as (js, md):  # a killed run keeps the last table whole
        json.dump(result, js, indent=1)
        md.write(report.report_markdown(records, meta_runs, growth, checks, rows))
    if plots:
        report.plot(records, stem, rows)
    return growth, checks


if __name__ == "__main__":
    main()
