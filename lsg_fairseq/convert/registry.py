"""The model families: how the converter, the exporter, ``lsg-fairseq-convert`` and the benchmark
find a model, without a list of names anywhere.

A family is one registered fairseq model and its HuggingFace format, both ways: a :class:`Family`
subclass in a module of this package, registered by :func:`register_family` when the module is
imported. :func:`families` imports every module of the package the first time it is called, so a
new family is one new file (README "Adding an encoder").

Which family converts a source (``lsg-fairseq-convert SRC OUT [--to NAME] [options]``) is decided
by one method, :meth:`Family.refusal` (``None``: it takes the source; else why not):

1. with ``--to NAME``: family NAME, asked with ``options["to"] == NAME``; a refusal is the error
   (:data:`NOT_ITS_SOURCE`: worded here, naming the families that can take the source);
2. without: first a family that takes the source with the options given but not without them (the
   options claim it: LSG options on a BART source ask for LSG-BART), else one that takes it without
   options (its own source).

A checkpoint to export goes to the family whose :attr:`Family.models` hold the registered fairseq
model of its arch.

Benchmark rows (``benchmarks/run.py`` finds every row of a family here, and nowhere else): a
family's :meth:`Family.benchmarks` returns ``{row name: BenchRow}``. A :class:`BenchRow` holds
``argv(length, settings)``, which returns ``[fairseq arch, flags...]`` for one input length, and
what run.py needs to know of the row: its dictionary size (``vocab``), the modes it runs
(``modes``), whether it is in the default and ``--smoke`` lists (``default``, ``smoke``), whether
it is one of several variants of which ``--main-lsg`` alone runs every mode (``variant``: LSG's
sparsity types), whether it is skipped beyond ``--max-full-length`` (``full_attention``), whether
its ``enc`` records split the S4D work (``ssm_split``), and how the report shows it (``growth``,
``color``). ``settings`` is a :class:`BenchSettings`: the run.py flags a row may read, copied from
the flags of the same names, so that no family reads the script's namespace. run.py writes what the
report shows of each row into its JSON (``rows``), so ``benchmarks/report.py`` needs no list of rows.
"""

import argparse
import os
import zipfile
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Tuple

from lsg_fairseq._autoimport import import_all
from lsg_fairseq.checkpoint_policy import model_arch
from lsg_fairseq.convert import common as C
from lsg_fairseq.convert.checkpoint import Checkpoint, resolve_checkpoint
from lsg_text.argtypes import int_range
from lsg_text.fileio import CHECKPOINT_NAMES, folder_checkpoint

# Longest position table a conversion makes: a longer learned table is surely a typo.
MAX_POSITIONS = 1 << 20
POSITIONS = int_range(1, MAX_POSITIONS)
# Options every family may honour (lsg-fairseq-convert adds their flags once, before the families').
COMMON_OPTIONS = ("max_source_positions", "max_target_positions")


@dataclass
class SourceInfo:
    """What a conversion source is, read once; families decide from it without reading files."""

    path: str
    hf_config: Optional[dict] = None  # config.json of an HF folder (None: not one, or unreadable)
    checkpoint: Optional[str] = None  # a fairseq checkpoint file (model.pt, or the one in the folder)
    arch: Optional[str] = None  # its --arch
    model: Optional[str] = None  # the registered fairseq model of that arch (bart, lsg_bart, ...)

    @property
    def model_type(self) -> Optional[str]:
        return (self.hf_config or {}).get("model_type")

    def describe(self) -> str:
        if self.hf_config is not None:
            return f"an HF {self.model_type or 'model'} folder"
        if self.checkpoint is not None:
            return f"a fairseq {self.arch or 'model'} checkpoint"
        return "not a model"


def probe(src: str) -> SourceInfo:
    """Read what ``src`` is: an HF folder (its config.json) or a fairseq checkpoint (its arch)."""
    if not os.path.exists(src):
        raise C.ConversionError(f"{src}: no such file or folder")
    if os.path.isdir(src) and os.path.exists(os.path.join(src, "config.json")):
        try:
            config = C.read_hf_config(src)
        except C.ConversionError:
            # a damaged config.json (not JSON, not UTF-8, not an object) is what the user must
            # hear about, unless the folder also holds a fairseq checkpoint, which is then the source
            if folder_checkpoint(src) is None:
                raise
        else:
            C.check_architectures(config, src)
            return SourceInfo(src, hf_config=config)
    try:
        path = resolve_checkpoint(src)  # a folder: the file lsg-fairseq-export takes from it
    except C.ExportError:  # a folder without one: no family's
        return SourceInfo(src)
    if not path.endswith(".pt"):
        return SourceInfo(src)
    import torch
    from fairseq import checkpoint_utils
    from fairseq.models import ARCH_MODEL_NAME_REGISTRY

    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception:  # noqa: BLE001  (any unreadable file: no family's)
        if not zipfile.is_zipfile(path):
            # damaged, or no torch file: fairseq's loader (as lsg_fairseq patches it) says which
            # ("truncated or corrupt checkpoint", "not a checkpoint") in the words train, generate
            # and export use
            checkpoint_utils.load_checkpoint_to_cpu(path)
        return SourceInfo(src)
    cfg = state.get("cfg") if isinstance(state, dict) else None
    model_args = cfg.get("model") if isinstance(cfg, dict) else None
    if model_args is None and isinstance(state, dict):
        model_args = state.get("args")
    arch = model_arch(model_args) if model_args is not None else ""
    return SourceInfo(src, checkpoint=path, arch=arch or None, model=ARCH_MODEL_NAME_REGISTRY.get(arch))


@dataclass(frozen=True)
class BenchSettings:
    """What a benchmark row may read of ``benchmarks/run.py``'s flags: run.py copies each field from
    its flag of the same name (``--block-size`` -> ``block_size``), whose default is the field's."""

    smoke: bool = False  # --smoke: build the tiny shape (``<name>_tiny``)
    block_size: int = 128  # LSG-BART --block-size
    sparse_block_size: int = 128  # LSG-BART --sparse-block-size
    sparsity_factor: int = 4  # LSG-BART --sparsity-factor
    num_global_tokens: int = 1  # LSG-BART --num-global-tokens
    attention_window: int = 1024  # LED --attention-window (the full window W)
    locost_kernel_cache_mb: Optional[float] = None  # LOCOST --ssm-kernel-cache-mb (None: the arch's default)
    locost_kernel_compile: bool = False  # LOCOST --ssm-kernel-compile (the fused generator)
    locost_kernel_product: Optional[str] = None  # LOCOST --ssm-kernel-product: fp32, tf32 or bf16 (None: unset)


@dataclass(frozen=True)
class BenchRow:
    """One row of ``benchmarks/run.py``: how to build its model, and what run.py and the report need
    to know about it (``argv`` is None only for run.py's own rows that are not fairseq models)."""

    argv: Optional[Callable[[int, BenchSettings], List[str]]]  # (length, settings) -> [fairseq arch, flags...]
    vocab: int = 50265  # dictionary size of the model (BART's GPT-2 BPE; --smoke uses 100 for every row)
    modes: Optional[Tuple[str, ...]] = None  # the run.py --modes it runs: enc, train, gen (None: all)
    default: bool = True  # in run.py's default rows (otherwise only when --arch names it)
    smoke: bool = True  # in run.py --smoke's default rows too (the CI check)
    variant: bool = False  # one of several variants: --secondary-modes only, unless --main-lsg names it (dashed)
    full_attention: bool = False  # quadratic in the length: skipped beyond run.py's --max-full-length
    ssm_split: bool = False  # its enc records split S4D kernel generation and convolution (s4d.* labels)
    growth: str = "1"  # the expected log-log exponent of time and memory in the length (report's growth table)
    layer_path: Optional[str] = None  # the path it forces its layers onto (paths.PATHS; None: --layer-path)
    color: Optional[str] = None  # its colour in the plots (None: matplotlib's next)


# What a family answers for a source that is not its own, with no more to say (the registry names
# the families that can take it)
NOT_ITS_SOURCE = "not its source"


class Family:
    """One model family: a registered fairseq model and its HF format, both ways, and its
    benchmark rows. The whole interface: the attributes below and the seven methods; a subclass
    sets the attributes and overrides the methods it needs."""

    name = ""  # the fairseq model it converts to (``register_model`` name) and the value of --to
    models: Tuple[str, ...] = ()  # the registered models whose checkpoints it exports (default: name)
    label = ""  # what people call it ("LSG-BART"), in messages
    option_label = ""  # what its own flags are called ("LSG options"; default: the label)
    common_options: Tuple[str, ...] = COMMON_OPTIONS  # of COMMON_OPTIONS, those it honours

    def arch(self, size: str) -> str:
        """Its architecture of a size: ``<name>_tiny`` / ``_base`` / ``_large`` (``register_model_architecture``)."""
        return f"{self.name}_{size}"

    # ------------------------------------------------------------- HF (or fairseq) -> fairseq
    def refusal(self, source: SourceInfo, options: dict) -> Optional[str]:
        """``None`` when it converts ``source`` with ``options``, else why not (:data:`NOT_ITS_SOURCE`
        when the registry may word it). ``options["to"] == self.name`` when ``--to`` asks for it;
        without ``--to`` it takes its own sources, and others only when ``options`` ask for it."""
        return NOT_ITS_SOURCE

    def add_args(self, parser: argparse.ArgumentParser) -> None:
        """Its own ``lsg-fairseq-convert`` flags (beside the common --to and lengths)."""

    def option_names(self) -> set:
        """The options it honours: its flags' destinations and its common options."""
        parser = argparse.ArgumentParser(add_help=False)
        self.add_args(parser)
        return {a.dest for a in parser._actions} | set(self.common_options)

    def convert(self, source: SourceInfo, out: str, **options) -> str:
        """Write the fairseq model folder into ``out`` (an empty folder); returns ``model.pt``'s path."""
        raise NotImplementedError

    # ------------------------------------------------------------- fairseq -> HF
    def export(self, checkpoint: Checkpoint) -> Callable[[str], None]:
        """Check and map everything now (a refusal writes nothing); the returned function writes
        the HF files into a folder."""
        raise C.ExportError(f"{checkpoint.path}: the {self.name} family has no HuggingFace format")

    # ------------------------------------------------------------- benchmarks/run.py
    def benchmarks(self) -> Dict[str, BenchRow]:
        """Its benchmark rows, ``{row name: BenchRow}`` (see the module docstring), in the order run.py
        lists and runs them."""
        return {}


_FAMILIES: Dict[str, Family] = {}


def register_family(family_cls):
    """Class decorator: register one instance of a :class:`Family` subclass under its name."""
    family = family_cls()
    if not family.models:
        family.models = (family.name,)
    _FAMILIES[family.name] = family
    return family_cls


def families() -> Dict[str, Family]:
    """{name: family} of every module of this package (imported the first time: a family module
    registers itself, so adding one touches no list)."""
    import_all(__package__, os.path.dirname(__file__))
    return dict(sorted(_FAMILIES.items()))


def families_taking(source: SourceInfo, known: Dict[str, Family]) -> List[str]:
    """The names of the families that convert ``source`` when ``--to`` names them."""
    return [f.name for f in known.values() if f.refusal(source, {"to": f.name}) is None]


def family_for_source(source: SourceInfo, options: dict) -> Family:
    """The family that converts ``source`` with ``options`` (see the module docstring)."""
    known = families()
    to = options.get("to")
    if to is not None:
        if to not in known:
            raise C.ConversionError(f"--to {to}: not a model family here (known: {', '.join(known)})")
        family = known[to]
        reason = family.refusal(source, options)
        if reason is None:
            return family
        if reason == NOT_ITS_SOURCE:
            able = families_taking(source, known)
            only = " only" if len(able) == 1 else ""
            reason = (
                f"{source.path} ({source.describe()}) converts to {' or '.join(able)}{only}"
                if able
                else unknown_source(source, known)
            )
        raise C.ConversionError(f"--to {to}: {reason}")
    for family in known.values():  # the options given claim it
        if family.refusal(source, options) is None and family.refusal(source, {}) is not None:
            return family
    for family in known.values():  # its own source
        if family.refusal(source, {}) is None:
            return family
    raise C.ConversionError(unknown_source(source, known))


def unknown_source(source: SourceInfo, known: Dict[str, Family]) -> str:
    """Why no family converts ``source``: what the converter takes, and what to use instead."""
    # the archs whose fairseq checkpoints convert: asked of each family, so that no list is kept here
    archs = [
        f.arch("*")
        for f in known.values()
        if any(f.refusal(SourceInfo(source.path, checkpoint=source.path, model=m), {}) is None for m in f.models)
    ]
    if source.checkpoint is not None and source.model is not None:
        exported = any(source.model in f.models for f in known.values())
        return (
            f"{source.path}: a fairseq {source.arch} checkpoint; lsg-fairseq-convert takes HF folders and "
            f"fairseq checkpoints of {' and '.join(archs)} archs only"
            + (f" (to make an HF folder of it: lsg-fairseq-export {source.path} HF_DIR)" if exported else "")
        )
    labels = [f.label for f in known.values()]
    return (
        f"{source.path}: not a model this converter knows (families: {', '.join(known)}). Expected an HF "
        f"folder whose config.json describes {', '.join(labels[:-1])} or {labels[-1]}, or a fairseq "
        f"checkpoint of a {' or '.join(archs)} arch ({', '.join(CHECKPOINT_NAMES)}, or a folder holding one)."
    )


def check_options(family: Family, options: dict, source: Optional[SourceInfo] = None) -> None:
    """Refuse options ``family`` does not honour (naming the family they belong to, and whether it
    takes ``source``) and lengths no table can have."""
    unknown = sorted(set(options) - family.option_names() - {"to"})
    if unknown:
        known = families()
        owners = [
            f for f in known.values() if f is not family and set(unknown) & (f.option_names() - set(COMMON_OPTIONS))
        ]
        able = families_taking(source, known) if source is not None else []

        def need(f):  # --to f, unless f does not take this source (then that --to is refused too)
            if source is None or f.name in able:
                return f"{f.option_label or f.label} options need --to {f.name}"
            return (
                f"{f.option_label or f.label} options need --to {f.name}, which does not take this source: it "
                f"converts to {' or '.join(able)}"
            )

        hint = "; ".join(need(f) for f in owners)
        raise C.ConversionError(
            f"unknown option(s) for the {family.name} family: {', '.join(unknown)}" + (f" ({hint})" if hint else "")
        )
    for name in COMMON_OPTIONS:
        problem = POSITIONS.problem(options.get(name, 1))
        if problem:
            raise C.ConversionError(f"--{name.replace('_', '-')} {options[name]} is not achievable: it {problem}")


def family_for_arch(checkpoint: Checkpoint) -> Family:
    """The family that exports ``checkpoint``: the one holding the registered model of its arch."""
    from fairseq.models import ARCH_MODEL_NAME_REGISTRY

    model = ARCH_MODEL_NAME_REGISTRY.get(checkpoint.arch)
    known = families()
    for family in known.values():
        if model in family.models:
            return family
    names = ", ".join(m for f in known.values() for m in f.models)
    raise C.ExportError(
        f"{checkpoint.path}: arch {checkpoint.arch!r} has no HuggingFace format here (known: the archs of {names})"
    )
