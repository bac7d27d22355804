"""Keep fairseq's log lines that say nothing to a user of this plugin's commands out of their output.

fairseq 0.12 configures logging when it is imported: ``fairseq/models/wav2vec/
wav2vec2_classification.py`` calls ``logging.basicConfig(level=logging.DEBUG)`` at module level (a
stderr handler on the root logger), so the INFO record that ``fairseq/tasks/text_to_speech.py``
logs at import when tensorboardX is missing ("Please install tensorboardX: pip install
tensorboardX") was the first line every ``lsg-fairseq-*`` command printed, ``--help`` included.
The plugin's entry point (``lsg_fairseq/__init__.py``, which every command imports first) imports
fairseq inside :func:`quiet_import`. fairseq's own commands (``fairseq-train``, ``fairseq-generate``)
import fairseq before the plugin and keep their lines; the root logger stays as fairseq sets it.
"""

import logging
from contextlib import contextmanager
from dataclasses import dataclass


@contextmanager
def quiet_import():
    """Inside the block (fairseq's import), fairseq's loggers drop INFO and DEBUG records; their
    warnings and errors still show. Their level is restored after."""
    logger = logging.getLogger("fairseq")
    level = logger.level
    logger.setLevel(logging.WARNING)
    try:
        yield
    finally:
        logger.setLevel(level)


@dataclass(frozen=True)
class DropMessage:
    """A logging filter that drops the records whose message is exactly ``message`` (equal filters
    compare equal, so adding one twice adds it once)."""

    message: str

    def filter(self, record: logging.LogRecord) -> bool:
        return record.getMessage() != self.message
