"""Checkpoint load errors that name the file and say what is wrong with it (fairseq#2684).

``checkpoint_utils.load_checkpoint_to_cpu`` passes torch's errors through: a truncated or corrupt
file gives ``PytorchStreamReader failed reading zip archive: failed finding central directory``
with no file name (fairseq#2684 is a restart dying on exactly that), an HF ``pytorch_model.bin``
gives a bare ``KeyError``, and an HF ``model.safetensors`` looks truncated. Now a damaged file raises
:class:`~lsg_fairseq.checkpoint_io.CheckpointError` naming it, its size and what to do; a torch
file that is not a fairseq checkpoint is said to be one, and a file that is no torch file at all
(a tokenizer model or a dictionary passed as the checkpoint) is not called damaged; any other
error gets the file name as a note. A file that loads is returned unchanged.
"""

import os
import zipfile

from fairseq import checkpoint_utils

from lsg_fairseq.checkpoint_io import CheckpointError, is_local
from lsg_fairseq.fairseq_fixes._wrap import wrap


def _first_line(error, limit=None) -> str:
    return type(error).__name__ + (f": {str(error).splitlines()[0][:limit]}" if str(error) else "")


def _is_safetensors(path) -> bool:
    """A safetensors file: an 8-byte little-endian header length, then the JSON header."""
    with open(path, "rb") as f:
        head = f.read(9)
    return len(head) == 9 and head[8:9] == b"{" and 0 < int.from_bytes(head[:8], "little") < os.path.getsize(path)


ZIP_MAGIC = b"PK\x03\x04"  # torch.save's zip archive (since torch 1.6)
PICKLE_MAGIC = b"\x80"  # an older torch.save's pickle (protocol 2 and later)


def _torch_save_head(path):
    """None where ``path`` begins as a torch.save file does (or is empty: what a save killed at once
    leaves), else its first bytes: a file of another kind (a sentencepiece model, a dictionary, an
    HTML page saved as the file), which no restart would mend."""
    with open(path, "rb") as f:
        head = f.read(12)
    if not head or head.startswith(ZIP_MAGIC) or ZIP_MAGIC.startswith(head) or head.startswith(PICKLE_MAGIC):
        return None
    return head


def _checked_load(original):
    def load_checkpoint_to_cpu(path, arg_overrides=None, load_on_all_ranks=False):
        try:
            return original(path, arg_overrides=arg_overrides, load_on_all_ranks=load_on_all_ranks)
        except FileNotFoundError:
            raise
        except Exception as e:
            # torch.save has written zip archives since torch 1.6; a truncated one has lost its
            # central directory, so a file that is not a readable zip and did not load is damaged
            # (old non-zip checkpoints that load fine never get here).
            local = is_local(path) and os.path.isfile(path)
            if local and _is_safetensors(path):
                raise CheckpointError(
                    f"{path}: HF weights (safetensors), not a fairseq checkpoint; convert the HF folder "
                    "holding it with lsg-fairseq-convert, and point at the model.pt it writes"
                ) from e
            head = _torch_save_head(path) if local else None
            if head is not None:
                raise CheckpointError(
                    f"{path}: not a checkpoint (not a torch.save file; it begins {head!r}); point at a "
                    "checkpoint_*.pt written by fairseq-train, or a model.pt written by lsg-fairseq-convert"
                ) from e
            if local and not zipfile.is_zipfile(path):
                raise CheckpointError(
                    f"{path}: truncated or corrupt checkpoint ({os.path.getsize(path)} bytes, not a complete "
                    f"torch.save archive; torch.load: {_first_line(e)}). If a run was killed while "
                    "writing it with a fairseq that lacks lsg_fairseq's atomic saves, restart from the "
                    "previous checkpoint_*.pt with --restore-file"
                ) from e
            if local and isinstance(e, (KeyError, TypeError, AttributeError)):
                # a torch.save archive of something else (an HF pytorch_model.bin, a tensor, ...)
                raise CheckpointError(
                    f"{path}: a torch file but not a fairseq checkpoint ({_first_line(e, 200)}); convert HF weights "
                    "with lsg-fairseq-convert, or point at a checkpoint_*.pt written by fairseq-train"
                ) from e
            e.add_note(f"(while loading the checkpoint {path})")
            raise

    return load_checkpoint_to_cpu


def install() -> None:
    wrap(checkpoint_utils, "load_checkpoint_to_cpu", _checked_load)
