"""One converter for every model family: HF folders (BART, LSG-BART, LOCOST, LED) -> fairseq.

Contract (binding; other parts and checks rely on it)::

    lsg-fairseq-convert SRC OUT_DIR [--to KIND] [--max-source-positions N]
                        [--num-global-tokens G] [family flags]
    python -m lsg_fairseq.cli.convert ...        (same)
    lsg_fairseq.convert.convert(src, out, **options)

``convert`` detects the source kind (``config.json`` of an HF folder, or a fairseq checkpoint),
and writes ``OUT_DIR/model.pt`` (loadable by
``fairseq.checkpoint_utils.load_model_ensemble_and_task([OUT_DIR/model.pt])`` after
``import lsg_fairseq``), ``OUT_DIR/dict.txt``, tokenizer files for offline use and
``OUT_DIR/token_map.json`` only when fairseq indices differ from HF ids (a list: fairseq index ->
HF id). ``OUT_DIR/tokenizer.txt`` names the tokenizer (gpt2, sentencepiece or none), which the hub
checks against the files beside it.

``OUT_DIR`` is written all-or-nothing (:func:`lsg_text.fileio.atomic_folder`): families
write into a temp folder beside it, renamed into place only when complete. An existing non-empty
``OUT_DIR`` is refused unless ``force=True`` (``--force``), which replaces it as a whole.

The way back, ``lsg-fairseq-export CKPT_OR_MODEL_DIR HF_DIR [--force]`` /
``lsg_fairseq.convert.export(src, out)``, lives in ``hf_export*.py`` and reuses the families' tables.

Each family lives in its own module and registers itself with :func:`register_family`:
``detect(src) -> bool`` says whether it handles ``src``; ``convert(src, out, **options)`` does
the work and returns the path of the written ``model.pt``; the optional ``accepts(src, to) ->
bool`` claims sources of another kind when the user asks for this family's target (e.g. an HF
BART folder with ``--to led``), and is consulted before detection.
"""
import importlib
import os
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional

from lsg_text.errors import UserError


class ConversionError(UserError, ValueError):
    """A source the converter refuses, with a message naming the file or field at fault."""


@dataclass
class Family:
    name: str
    detect: Callable[[str], bool]
    convert: Callable[..., str]
    accepts: Optional[Callable[[str, Optional[str]], bool]] = None


_FAMILIES: Dict[str, Family] = {}

# Family modules, imported lazily so that `--help` stays fast and a broken family cannot hide
# another one's error message.
_FAMILY_MODULES: List[str] = ["bart", "locost", "led"]


def register_family(name: str, detect: Callable[[str], bool], convert: Callable[..., str],
                    accepts: Optional[Callable[[str, Optional[str]], bool]] = None) -> None:
    _FAMILIES[name] = Family(name, detect, convert, accepts)


def _load_families() -> None:
    here = os.path.dirname(__file__)
    for mod in _FAMILY_MODULES:
        if os.path.exists(os.path.join(here, mod + ".py")):
            importlib.import_module(f"{__name__}.{mod}")


def detect_family(src: str, to: Optional[str] = None) -> Family:
    if not os.path.exists(src):
        raise ConversionError(f"{src}: no such file or folder")
    _load_families()
    if to is not None:
        for family in _FAMILIES.values():
            if family.accepts is not None and family.accepts(src, to):
                return family
    for family in _FAMILIES.values():
        if family.detect(src):
            return family
    known = ", ".join(sorted(_FAMILIES)) or "none"
    raise ConversionError(
        f"{src}: not a model this converter knows (families: {known}). Expected an HF folder "
        "whose config.json describes BART, LSG-BART, LOCOST or LED, or a fairseq checkpoint "
        "written by lsg-fairseq."
    )


def convert(src: str, out: str, force: bool = False, **options) -> str:
    """Convert ``src`` into a fairseq model folder ``out``; returns the path of ``model.pt``.

    ``out`` appears complete or not at all; a non-empty ``out`` needs ``force`` (replaced whole).
    """
    from lsg_text.fileio import DataError, atomic_folder, check_output_folder, final_location
    from lsg_text.offline_bpe import write_tokenizer_record

    try:
        check_output_folder(out, force, [src])  # before the (slow) family detection
    except DataError as e:
        raise ConversionError(str(e)) from None
    family = detect_family(src, options.get("to"))
    with atomic_folder(out, force=force, inputs=[src]) as tmp:
        path = family.convert(src, tmp, **options)
        try:
            write_tokenizer_record(tmp)
        except DataError as e:
            raise ConversionError(str(e)) from None
        return final_location(path)


def export(src: str, out: str, force: bool = False) -> str:
    """The inverse of :func:`convert`: fairseq checkpoint or model folder -> HF folder ``out``.

    See :mod:`lsg_fairseq.convert.hf_export` (``lsg-fairseq-export``); returns ``out``.
    """
    from lsg_fairseq.convert.hf_export import export as export_to_hf

    return export_to_hf(src, out, force=force)
