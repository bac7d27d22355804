"""What an exported BART-shaped HF folder holds beside the weights and config.json: the tokenizer
files and ``generation_config.json``, written as HF writes them.

HF id == fairseq dictionary index, so ``vocab.json`` maps each GPT-2 BPE token to the index of its
id in ``dict.txt`` (identity for converted models); a sentencepiece model is copied as
``spm.model`` because HF's BART tokenizer files (byte-level BPE) cannot represent it.
"""

import logging
import os
import shutil
from typing import Callable, Dict

from lsg_fairseq.convert import common as C
from lsg_fairseq.convert.checkpoint import Checkpoint
from lsg_text.offline_bpe import GPT2_FILES, SENTENCEPIECE_MODEL, SENTENCEPIECE_NAMES

logger = logging.getLogger(__name__)


def hf_vocab(encoder: Dict[str, int], dictionary) -> Dict[str, int]:
    """GPT-2 BPE token -> HF id (= fairseq index of that GPT-2 id in dict.txt).

    Tokens whose GPT-2 id is not in the dictionary are ``<unk>`` in fairseq; they are left out, so
    HF's tokenizer gives ``<unk>`` for them too. fairseq's specials keep their own indices.
    """
    vocab = {tok: dictionary.indices[str(gid)] for tok, gid in encoder.items() if str(gid) in dictionary.indices}
    for sym in ("<s>", "<pad>", "</s>", "<unk>", "<mask>"):
        if sym in dictionary.indices:
            vocab[sym] = dictionary.index(sym)
    return vocab


def tokenizer_writer(checkpoint: Checkpoint, tokenizer_class: str, max_length: int) -> Callable[[str], None]:
    """What the HF folder gets of the model's tokenizer: GPT-2 BPE files, or the sentencepiece model."""
    encoder_json, merges = (checkpoint.find(name) for name in GPT2_FILES)
    spm_path = checkpoint.find(*SENTENCEPIECE_NAMES)
    d = checkpoint.dictionary
    if encoder_json and merges:
        vocab = hf_vocab(C.read_json(encoder_json, dict), d)  # a damaged one is named, not a traceback
        specials = {
            "bos_token": "<s>",
            "cls_token": "<s>",
            "eos_token": "</s>",
            "mask_token": "<mask>",
            "pad_token": "<pad>",
            "sep_token": "</s>",
            "unk_token": "<unk>",
        }

        def write(folder):
            C.write_json(folder, "vocab.json", vocab)
            shutil.copyfile(merges, os.path.join(folder, "merges.txt"))  # has the "#version" header HF skips
            C.write_json(folder, "special_tokens_map.json", specials)
            C.write_json(
                folder,
                "tokenizer_config.json",
                dict(
                    specials,
                    add_prefix_space=False,
                    errors="replace",
                    trim_offsets=True,
                    model_max_length=max_length,
                    tokenizer_class=tokenizer_class,
                ),
            )

        return write
    if spm_path:
        import sentencepiece as spm

        sp = spm.SentencePieceProcessor()
        sp.Load(spm_path)
        same_ids = all(sp.id_to_piece(i) == d[i] for i in range(4, min(sp.get_piece_size(), len(d))))
        logger.warning(
            "%s: a sentencepiece vocabulary, which HF's BART tokenizer files (byte-level BPE) cannot "
            "represent; copied as %s%s",
            spm_path,
            SENTENCEPIECE_MODEL,
            ": its piece ids are the model's token ids (add <s>=0 and </s>=2 around sp.encode(text))"
            if same_ids
            else " with dict.txt: token id = line number + 4 in dict.txt, not the piece id",
        )

        def write(folder):
            shutil.copyfile(spm_path, os.path.join(folder, SENTENCEPIECE_MODEL))
            if not same_ids:
                d.save(os.path.join(folder, "dict.txt"))

        return write
    logger.warning(
        "%s: no tokenizer files (%s, or %s) beside the checkpoint or in its data folder; the HF folder has none",
        checkpoint.path,
        " + ".join(GPT2_FILES),
        SENTENCEPIECE_MODEL,
    )
    return lambda folder: None


def generation_config(config: dict) -> dict:
    out = {"_from_model_config": True}
    for key in ("bos_token_id", "decoder_start_token_id", "eos_token_id", "forced_eos_token_id", "pad_token_id"):
        if key in config:
            out[key] = config[key]
    return out
