"""HF <-> fairseq for every model family (BART, LSG-BART, LED, LOCOST), both ways.

Contract (binding; other parts and checks rely on it)::

    lsg-fairseq-convert SRC OUT_DIR [--to FAMILY] [--max-source-positions N] [family flags] [--force]
    lsg-fairseq-export CKPT_OR_MODEL_DIR HF_DIR [--force]
    lsg_fairseq.convert.convert(src, out, **options) / lsg_fairseq.convert.export(src, out)

``convert`` reads what the source is (``config.json`` of an HF folder, or a fairseq checkpoint),
finds its family (:mod:`.registry`) and writes ``OUT_DIR/model.pt`` (loadable by
``fairseq.checkpoint_utils.load_model_ensemble_and_task([OUT_DIR/model.pt])`` after
``import lsg_fairseq``), ``OUT_DIR/dict.txt``, tokenizer files for offline use and
``OUT_DIR/token_map.json`` only when fairseq indices differ from HF ids (a list: fairseq index ->
HF id). ``OUT_DIR/tokenizer.txt`` names the tokenizer (gpt2, sentencepiece or none), which the hub
checks against the files beside it.

``export`` is the way back: a fairseq checkpoint (``model.pt`` written by ``convert``, or a training
run's ``checkpoint_best.pt`` / ``checkpoint_last.pt``) or a folder holding one -> the HF folder of
its family (``BartForConditionalGeneration``, ``LEDForConditionalGeneration``, the LSG authors'
LSG-BART format, the reference LOCOST format). Only the weights and the model cfg are read; the
dictionary and tokenizer files are looked up beside the checkpoint, then in its data folder.

Both write their output folder all-or-nothing (:func:`lsg_text.atomic.atomic_folder`): a temp
folder beside it, moved into place only when complete. An existing non-empty output folder is
refused unless ``force=True`` (``--force``), which replaces it as a whole.

The families are modules of this package (``bart.py``, ``lsg_bart.py``, ``led.py``,
``locost.py``), each a :class:`~.registry.Family` holding both directions; the others are what
they share: ``common.py`` (reading, building, saving), ``fields.py`` (config tables),
``bart_state.py`` (BART weights), ``hf_tokenizer.py``, ``lsg_init.py`` (LSG global tokens) and
``locost_vocab.py`` (LOCOST token ids), ``checkpoint.py`` (a fairseq checkpoint to export).
"""

import os

from lsg_fairseq.convert.checkpoint import check_weights_fit, model_shapes, read_checkpoint
from lsg_fairseq.convert.common import ConversionError, ExportError
from lsg_fairseq.convert.registry import (
    Family,
    check_options,
    families,
    family_for_arch,
    family_for_source,
    probe,
    register_family,
)

__all__ = [
    "ConversionError",
    "ExportError",
    "Family",
    "convert",
    "detect_family",
    "export",
    "families",
    "register_family",
]


def detect_family(src: str, **options) -> Family:
    """The family that converts ``src`` with these options (``to=`` included)."""
    return family_for_source(probe(src), {k: v for k, v in options.items() if v is not None})


def convert(src: str, out: str, force: bool = False, **options) -> str:
    """Convert ``src`` into a fairseq model folder ``out``; returns the path of ``model.pt``.

    ``out`` appears complete or not at all; a non-empty ``out`` needs ``force`` (replaced whole).
    """
    from lsg_text.atomic import atomic_folder, final_location
    from lsg_text.fileio import DataError, check_output_folder
    from lsg_text.offline_bpe import write_tokenizer_record

    options = {k: v for k, v in options.items() if v is not None}  # None: the family's default
    # what the source is and whether the options fit it before OUT: a bad flag is reported before
    # the user is asked to empty OUT or pass --force (probing reads a config, or one checkpoint)
    source = probe(src)
    family = family_for_source(source, options)
    check_options(family, options, source)
    options.pop("to", None)
    try:
        check_output_folder(out, force, [src])  # before the (slow) conversion
    except DataError as e:
        raise ConversionError(str(e)) from None
    with atomic_folder(out, force=force, inputs=[src]) as tmp:
        path = family.convert(source, tmp, **options)
        try:
            write_tokenizer_record(tmp)
        except DataError:  # tmp is deleted on the way out: name the folder the files came from
            where = src if os.path.isdir(src) else os.path.dirname(os.path.abspath(src))
            raise ConversionError(
                f"{where}: holds both GPT-2 BPE files and a sentencepiece model, which the converter would "
                "copy beside model.pt; delete the files of the tokenizer the model does not use"
            ) from None
        return final_location(path)


def export(src: str, out: str, force: bool = False) -> str:
    """The inverse of :func:`convert`: fairseq checkpoint or model folder -> HF folder ``out``; returns ``out``."""
    from lsg_text.atomic import atomic_folder
    from lsg_text.fileio import DataError

    checkpoint = read_checkpoint(src)
    family = family_for_arch(checkpoint)
    shapes = model_shapes(checkpoint)  # its cfg builds its model: every family reads a checked cfg
    write = family.export(checkpoint)  # every refusal before anything is written
    check_weights_fit(checkpoint, shapes)  # after the families' refusals, which name the problem in their terms
    try:
        with atomic_folder(out, force=force, inputs=checkpoint.search_dirs) as tmp:
            write(tmp)
    except DataError as e:
        raise ExportError(str(e)) from None
    return os.path.abspath(out)
