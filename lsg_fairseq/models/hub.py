"""Hub interface for long inputs: ``lsg_fairseq.from_pretrained(model_dir).sample([...])``.

fairseq's ``BARTHubInterface`` truncates every input to ``min(max_positions) - 2`` over the
(source, target) pair: 1,022 tokens even for a 16K-source model (fairseq_notes §2). This
subclass truncates the source only, to the model's own ``max_source_positions``, and follows the
task's ``<s>`` convention instead of forcing a ``<s>`` prefix. It generates through the task's
``build_generator``, i.e. :class:`~lsg_fairseq.generation.LongInputSequenceGenerator`, which leaves
the model as it found it (fairseq#3893), as ``lsg-fairseq-summarize`` (built on this hub) does.
"""

import logging
import os
import re
from typing import List, Optional

import torch
from fairseq import hub_utils, utils
from fairseq.hub_utils import GeneratorHubInterface
from fairseq.models.bart.hub_interface import BARTHubInterface
from omegaconf import open_dict

from lsg_fairseq.checkpoint_io import CheckpointError
from lsg_fairseq.models.vocabulary_fit import VOCABULARY_KEYS
from lsg_text.errors import MissingFileError, one_line
from lsg_text.fileio import CHECKPOINT_NAMES, DataError, folder_checkpoint
from lsg_text.offline_bpe import (
    GPT2_FILES,
    SENTENCEPIECE_NAMES,
    TOKENIZER_RECORD,
    check_gpt2_files,
    read_tokenizer_record,
    tokenizer_files,
)

logger = logging.getLogger(__name__)


class LongInputHubInterface(BARTHubInterface):
    """BART's hub, with source-only truncation to ``max_source_positions`` (no 1,024 cap)."""

    checkpoint_path = "MODEL_DIR/model.pt"  # the file it was loaded from (:func:`from_pretrained` sets it)

    @property
    def max_source_tokens(self) -> int:
        return min(self.task.max_positions()[0], self.model.max_positions()[0])

    @property
    def prepend_bos(self) -> bool:
        return self.task.prepend_bos  # the model's convention (LOCOST: no <s>), unless --no-prepend-bos

    def set_max_source_positions(self, n: int) -> None:
        """Read up to ``n`` source tokens. Below the model's limit this only truncates earlier;
        above it only encoders without a position table (LOCOST) can follow."""
        model_max = self.model.max_positions()[0]
        if n > model_max:
            if getattr(self.model.encoder, "embed_positions", None) is not None:
                from lsg_fairseq.checkpoint_policy import longer_positions_hint, model_arch

                arch = model_arch(self.cfg.model) or type(self.model).__name__  # hydra's: _name alone
                raise ValueError(
                    f"--max-source-positions {n}: this model's position table holds {model_max} tokens; "
                    + longer_positions_hint(arch, self.checkpoint_path, n)
                )
            self.model.encoder.max_source_positions = n
        with open_dict(self.task.cfg):
            self.task.cfg.max_source_positions = n
        # GeneratorHubInterface resolved its batching limits once, at construction
        self.max_positions = utils.resolve_max_positions(self.task.max_positions(), self.model.max_positions())

    def encode(self, sentence: str, *addl_sentences, no_separator=True) -> torch.LongTensor:
        if addl_sentences:
            raise ValueError("long-input summarization encodes one document at a time")
        pieces = self.bpe.encode(sentence).split()
        budget = self.max_source_tokens - 1 - int(self.prepend_bos)  # room for </s> (and <s>)
        if len(pieces) > budget:
            logger.warning(f"input of {len(pieces)} tokens truncated to {budget} (max source positions)")
            pieces = pieces[:budget]
        text = ("<s> " if self.prepend_bos else "") + " ".join(pieces) + " </s>"
        return self.task.source_dictionary.encode_line(text, append_eos=False, add_if_not_exist=False).long()

    def decode(self, tokens: torch.LongTensor) -> str:
        d = self.task.target_dictionary
        text = d.string(tokens.cpu(), extra_symbols_to_ignore={d.bos()})
        return self.bpe.decode(text).strip() if self.bpe is not None else text

    def generate(self, tokenized_sentences: List[torch.LongTensor], *args, **kwargs):
        # Skip BART's forced <s> prefix: the task's inference_step adds it when its convention asks.
        return GeneratorHubInterface.generate(self, tokenized_sentences, *args, **kwargs)


def detect_bpe(model_dir: str) -> dict:
    """hub kwargs for the tokenizer of ``model_dir`` (GPT-2 BPE or sentencepiece).

    ``tokenizer.txt`` (written by the converter) names the kind, and the files beside it must agree
    (a stale ``spm.model`` next to a new ``encoder.json`` is refused). Without the record, the files
    decide, and a folder holding both kinds is refused: nothing says which one the model uses.
    """
    kind = read_tokenizer_record(model_dir)  # None: no record; checks the files against it
    found = tokenizer_files(model_dir)
    if kind is None:
        if found["gpt2"] and found["sentencepiece"]:
            raise DataError(
                f"{model_dir}: holds both GPT-2 BPE files ({', '.join(found['gpt2'])}) and "
                f"{found['sentencepiece'][0]}, and no {TOKENIZER_RECORD} saying which one the model uses; "
                "delete the files of the tokenizer the model does not use"
            )
        kind = "gpt2" if len(found["gpt2"]) == len(GPT2_FILES) else "sentencepiece" if found["sentencepiece"] else None
    if kind == "gpt2":
        enc, merges = (os.path.join(model_dir, n) for n in GPT2_FILES)
        return {"bpe": "gpt2", "gpt2_encoder_json": enc, "gpt2_vocab_bpe": merges}
    if kind == "sentencepiece":
        return {"bpe": "sentencepiece", "sentencepiece_model": os.path.join(model_dir, found["sentencepiece"][0])}
    raise MissingFileError(
        f"{model_dir}: no tokenizer files (expected encoder.json + vocab.bpe for GPT-2 BPE, or one of "
        f"{', '.join(SENTENCEPIECE_NAMES)} for sentencepiece)"
    )


def check_spm_matches_dict(spm_path: str, dict_path: str) -> None:
    """Raise a DataError naming both files when the sentencepiece model does not fit dict.txt."""
    import sentencepiece

    from lsg_text.offline_bpe import check_sentencepiece_dictionary

    if not os.path.exists(dict_path):
        return  # fairseq reports the missing dictionary itself
    sp = sentencepiece.SentencePieceProcessor()
    try:
        sp.Load(spm_path)
    except Exception as e:  # noqa: BLE001  (OSError / RuntimeError, depending on the version)
        raise DataError(f"{spm_path}: not a readable sentencepiece model ({one_line(e)[:200]})") from None
    check_sentencepiece_dictionary(sp, load_dictionary(dict_path).symbols, spm_path, dict_path)


def check_gpt2_matches_dict(dictionary, dict_path: str, encoder_json: str) -> None:
    """Raise a DataError naming both files when ``dictionary`` (read from ``dict_path``) is not a GPT-2
    BPE dictionary (its symbols are GPT-2 token ids): fairseq's decoder would fail with ``int()``'s
    ValueError after generating."""
    for symbol in dictionary.symbols[dictionary.nspecial :]:
        if symbol == "<mask>" or symbol.startswith("madeupword") or symbol.isdigit():
            continue
        raise DataError(
            f"{dict_path}: holds {symbol!r}, not a GPT-2 token id, so it does not fit {encoder_json} (GPT-2 BPE "
            "dictionaries list ids); use the dict.txt written with this model's tokenizer"
        )


def load_dictionary(dict_path: str):
    """fairseq's ``Dictionary.load``, with a DataError naming the file for a damaged one."""
    from fairseq.data import Dictionary

    try:
        return Dictionary.load(dict_path)
    except Exception as e:  # noqa: BLE001  (ValueError, a bare Exception for bad encodings, ...)
        raise DataError(
            f"{dict_path}: not a fairseq dictionary ({one_line(e)[:200]}); expected lines '<token> <count>'"
        ) from None


def from_pretrained(model_dir: str, checkpoint_file: Optional[str] = None, **overrides) -> LongInputHubInterface:
    """Load ``model_dir/checkpoint_file`` with the dictionary and tokenizer files beside it; by default
    the folder's ``model.pt``, else ``checkpoint_best.pt``, else ``checkpoint_last.pt``."""
    if checkpoint_file is None:
        checkpoint_file = folder_checkpoint(model_dir)
        if checkpoint_file is None:
            raise MissingFileError(f"{model_dir}: no checkpoint (none of {', '.join(CHECKPOINT_NAMES)})")
    path = os.path.join(model_dir, checkpoint_file)
    if not os.path.isfile(path):
        raise MissingFileError(f"{path}: no such checkpoint")
    kwargs = detect_bpe(model_dir)
    kwargs.update(overrides)
    dict_path = os.path.join(model_dir, "dict.txt")
    if os.path.exists(dict_path):
        load_dictionary(dict_path)  # fairseq's own error for a damaged one names no file
    if kwargs.get("bpe") == "sentencepiece":
        # before loading the checkpoint: a foreign spm model would silently give <unk> everywhere
        check_spm_matches_dict(kwargs["sentencepiece_model"], dict_path)
    elif kwargs.get("bpe") == "gpt2":
        check_gpt2_files(kwargs["gpt2_encoder_json"], kwargs["gpt2_vocab_bpe"], "MODEL_DIR", "MODEL_DIR")
    try:
        loaded = hub_utils.from_pretrained(model_dir, checkpoint_file, ".", **kwargs)
    except RuntimeError as e:
        if "Error(s) in loading state_dict" not in str(e):
            raise
        mismatched = set(re.findall(r"size mismatch for ([\w.]+)", str(e)))
        if mismatched and mismatched <= set(VOCABULARY_KEYS) and "key(s) in state_dict" not in str(e):
            # a dict.txt of another model: only the embedding rows (one per symbol) differ
            raise CheckpointError(
                f"{path} does not fit the files beside it ({dict_path}: {one_line(e)[:300]}); use the dict.txt "
                "written with this checkpoint"
            ) from None
        # a tensor missing, unexpected or of another shape: the checkpoint itself does not fit its cfg
        raise CheckpointError(
            f"{path}: its weights do not fit the model its own cfg builds ({one_line(e)[:300]}); the checkpoint "
            "is damaged, or was edited or written by other code"
        ) from None
    if kwargs.get("bpe") == "gpt2":  # after the checkpoint's own errors, before any generation
        check_gpt2_matches_dict(loaded["task"].target_dictionary, dict_path, kwargs["gpt2_encoder_json"])
    hub = LongInputHubInterface(loaded["args"], loaded["task"], loaded["models"][0])
    hub.checkpoint_path = path
    # The checkpoint carries the training run's --max-tokens / --batch-size; the hub batches with
    # them, so any document longer than a training batch would fail an assertion. Callers choose
    # their own batches (lsg-fairseq-summarize --batch-size), so lift both limits.
    with open_dict(hub.cfg):
        hub.cfg.dataset.max_tokens = overrides.get("max_tokens")
        hub.cfg.dataset.batch_size = overrides.get("batch_size")
    return hub
