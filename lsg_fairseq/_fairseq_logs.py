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
import warnings
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


@contextmanager
def command_logging():
    """While a command of ours that builds fairseq models runs (the converter, the exporter): its
    own warnings on stderr as ``WARNING: message``, nothing of fairseq's or hydra's below a warning.
    fairseq left the root logger at DEBUG with its handler (above), so a ``basicConfig`` would do
    nothing: the root's handlers and level are swapped for the block and put back after (a test or
    a notebook calling ``main`` keeps its own). Building a model goes through fairseq's config
    conversion, which calls hydra's deprecated experimental API: its UserWarnings concern fairseq,
    not the user."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    ours = logging.StreamHandler()  # sys.stderr as it is now
    ours.setFormatter(logging.Formatter("%(levelname)s: %(message)s"))
    root.handlers = [ours]
    root.setLevel(logging.WARNING)
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", category=UserWarning, module=r"hydra\.")
            warnings.filterwarnings(
                "ignore", message=r"\s*.config. is validated against ConfigStore", category=UserWarning
            )
            yield
    finally:
        root.handlers = handlers
        root.setLevel(level)


@dataclass(frozen=True)
class DropMessage:
    """A logging filter that drops the records whose message is exactly ``message`` (equal filters
    compare equal, so adding one twice adds it once)."""

    message: str

    def filter(self, record: logging.LogRecord) -> bool:
        return record.getMessage() != self.message
