"""LOCOST's token ids both ways: the reference's HF vocabulary (T5 sentencepiece) <-> a fairseq
dictionary, and the permutation between them (``token_map.json``: fairseq index -> HF id).

Ids. T5 uses pad 0 / eos 1 / unk 2 (no bos) and starts decoding from ``decoder_start_token_id``
(0, the pad row). fairseq's Dictionary fixes ``<s>`` 0, ``<pad>`` 1, ``</s>`` 2, ``<unk>`` 3. The
fairseq dictionary is therefore a permutation of the HF vocabulary, and the embedding rows are
permuted with it:

    fairseq  0 <s>    <- HF decoder_start_token_id (the decoder's start embedding, see
                         lsg_fairseq/models/locost.py: fairseq's leading </s> is embedded with <s>)
             1 <pad>  <- HF pad_token_id
             2 </s>   <- HF eos_token_id
             3 <unk>  <- HF unk id (sentencepiece's, else 2)
             4 ...    <- every other HF id, in increasing order
             last     <mask> (added by the task) <- HF ``<extra_id_0>`` if the vocabulary has it, else unk

so ``token_map.json`` lists HF 0 twice (start and pad), which is expected (spec section 8). Logits
of fairseq indices that share an HF row are equal; fairseq never emits ``<pad>``.
"""

import logging
import os
from typing import Dict, List, Optional, Tuple

import torch

from lsg_fairseq.convert import common as C
from lsg_fairseq.convert.checkpoint import Checkpoint
from lsg_fairseq.convert.common import ConversionError, ExportError
from lsg_text.argtypes import NON_NEGATIVE_INT
from lsg_text.offline_bpe import HF_SENTENCEPIECE_NAME, SENTENCEPIECE_NAMES

logger = logging.getLogger(__name__)

SPM_NAMES = (HF_SENTENCEPIECE_NAME,) + SENTENCEPIECE_NAMES  # where a source folder's is found, first wins


def find_spm(src: str) -> Optional[str]:
    for name in SPM_NAMES:
        path = os.path.join(src, name)
        if os.path.exists(path):
            return path
    return None


def hf_symbols(src: str, vocab_size: int) -> Tuple[Dict[int, str], int]:
    """HF id -> token string for every embedding row, and the unk id.

    From the sentencepiece model (+ ``added_tokens.json``, else T5's ``<extra_id_k>`` layout after
    the pieces); without a tokenizer the symbols are the ids themselves ("17").
    """
    spm_path = find_spm(src)
    if spm_path is None:
        logger.warning("%s: no sentencepiece model; dict.txt symbols are the HF ids", src)
        return {i: str(i) for i in range(vocab_size)}, 2
    try:
        import sentencepiece as spm
    except ImportError as e:
        raise ConversionError("the sentencepiece package is needed to read " + spm_path) from e
    sp = spm.SentencePieceProcessor()
    try:
        sp.Load(spm_path)
    except Exception as e:  # noqa: BLE001  (OSError / RuntimeError, depending on the version)
        raise ConversionError(f"{spm_path}: not a readable sentencepiece model ({e}); re-download it") from None
    n = sp.GetPieceSize()
    symbols = {i: sp.IdToPiece(i) for i in range(min(n, vocab_size))}
    added_path = os.path.join(src, "added_tokens.json")
    added = C.read_json(added_path, dict) if os.path.exists(added_path) else None
    if added:
        if not all(isinstance(i, int) for i in added.values()):
            raise ConversionError(f"{added_path}: expected an object of token -> integer id")
        for tok, i in added.items():
            if i < vocab_size:
                symbols[int(i)] = tok
    for i in range(n, vocab_size):
        if i not in symbols:
            # HF T5Tokenizer (extra_ids=100): <extra_id_0> is the last id, counting down
            k = n + 99 - i
            symbols[i] = f"<extra_id_{k}>" if 0 <= k < 100 else f"<unused_{i}>"
    if n > vocab_size:
        raise ConversionError(f"{spm_path}: {n} pieces but the model has only {vocab_size} embedding rows")
    return symbols, sp.unk_id()


def fairseq_order(config: dict, unk_id: int, vocab_size: int, src: str) -> List[int]:
    """HF ids in fairseq index order for indices 0..V+0 (before the task's <mask>)."""
    pad = C.config_value(config, "pad_token_id", src, NON_NEGATIVE_INT, default=0)
    eos = C.config_value(config, "eos_token_id", src, NON_NEGATIVE_INT, default=1)
    start = C.config_value(config, "decoder_start_token_id", src, NON_NEGATIVE_INT, default=pad)
    for name, i in (
        ("pad_token_id", pad),
        ("eos_token_id", eos),
        ("decoder_start_token_id", start),
        ("unk id", unk_id),
    ):
        if not 0 <= i < vocab_size:
            raise ConversionError(f"{src}: {name} {i} is outside the vocabulary (0..{vocab_size - 1})")
    if len({pad, eos, unk_id}) != 3:
        raise ConversionError(f"{src}: pad ({pad}), eos ({eos}) and unk ({unk_id}) ids must differ")
    specials = {pad, eos, unk_id}
    return [start, pad, eos, unk_id] + [i for i in range(vocab_size) if i not in specials]


def write_dict(out_dir: str, order: List[int], symbols: Dict[int, str]) -> str:
    """dict.txt: one ``symbol 1`` line per HF id from fairseq index 4 on."""
    reserved = {"<s>", "<pad>", "</s>", "<unk>"}
    seen = set()
    path = os.path.join(out_dir, "dict.txt")
    with open(path, "w", encoding="utf-8") as f:
        for hf_id in order[4:]:
            sym = symbols[hf_id]
            if sym in reserved or sym in seen or not sym or any(c.isspace() for c in sym):
                raise ConversionError(
                    f"HF token {hf_id} ({sym!r}) cannot be a fairseq dictionary symbol (reserved, "
                    "duplicate or containing whitespace)"
                )
            seen.add(sym)
            f.write(f"{sym} 1\n")
    return path


def read_token_map(source: Checkpoint) -> List[int]:
    """fairseq index -> HF id (``token_map.json`` beside the checkpoint, else the identity)."""
    n = len(source.dictionary)
    path = source.find("token_map.json")
    if path is None:
        return list(range(n))
    token_map = C.read_json(path)  # not JSON, not UTF-8 (a UnicodeDecodeError traceback), unreadable: named
    if not (isinstance(token_map, list) and all(isinstance(i, int) and i >= 0 for i in token_map)):
        raise ExportError(f"{path}: expected a list of non-negative ints (fairseq index -> HF id)")
    if len(token_map) != n:
        raise ExportError(f"{path}: {len(token_map)} entries but the dictionary has {n} symbols")
    missing = sorted(set(range(max(token_map) + 1)) - set(token_map))
    if missing:
        raise ExportError(f"{path}: HF ids {missing[:10]} have no fairseq row; the HF embedding would have holes")
    return token_map


def unpermute(emb: torch.Tensor, token_map: List[int], source: Checkpoint) -> torch.Tensor:
    """(V_fairseq, d) rows -> (V_hf, d) in HF id order; see the module docstring for duplicates."""
    d = source.dictionary
    shared = emb.new_empty(max(token_map) + 1, emb.size(1))
    first: Dict[int, int] = {}
    dropped = []
    for idx, hf_id in enumerate(token_map):
        if hf_id not in first:
            first[hf_id] = idx
            shared[hf_id] = emb[idx]
        elif not torch.equal(emb[idx], emb[first[hf_id]]):
            if idx == d.pad():
                dropped.append(idx)
                continue
            raise ExportError(
                f"{source.path}: fairseq tokens {first[hf_id]} ({d[first[hf_id]]!r}) and {idx} ({d[idx]!r}) share "
                f"HF id {hf_id} (token_map.json) but their embedding rows differ; the HF file holds one row per id"
            )
    if dropped:
        logger.warning(
            "fairseq <pad> row (index %d) differs from HF id %d's row (the decoder start); HF keeps one "
            "row per id, the start row (fairseq never emits or attends to <pad>)",
            d.pad(),
            token_map[d.pad()],
        )
    return shared
