"""Our commands speak first: no fairseq INFO line before their own output (``lsg_fairseq._fairseq_logs``),
and the check does fail where fairseq is imported plainly, as the commands did before."""

import logging
import subprocess
import sys

import pytest

from conftest import REPO_ROOT

NOISE = ("INFO", "DEBUG", "tensorboardX")


def first_line(*argv) -> str:
    """The first line of a command's stdout and stderr together (Python run in the repository)."""
    proc = subprocess.run(
        [sys.executable, *argv], cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stdout[-3000:]
    return proc.stdout.splitlines()[0]


def noise(line: str) -> list:
    return [word for word in NOISE if word in line]


@pytest.mark.parametrize(
    "argv, usage",
    [
        (["-m", "lsg_fairseq.cli.convert", "--help"], "usage: lsg-fairseq-convert"),
        (["-m", "lsg_fairseq.cli.fairseq_wrappers", "generate", "--help"], "usage: lsg-fairseq-generate"),
    ],
    ids=["convert", "generate"],
)
def test_our_commands_speak_first(argv, usage):
    line = first_line(*argv)
    assert line.startswith(usage) and not noise(line), line


def test_the_check_can_fail():
    """fairseq imported plainly prints its INFO line before anything the program prints."""
    line = first_line("-c", "import fairseq; print('usage: ours')")
    assert noise(line) == ["INFO", "tensorboardX"], line


def test_drop_message_drops_that_message_only():
    from lsg_fairseq._fairseq_logs import DropMessage

    logger = logging.getLogger("lsg_fairseq.test_quiet_commands")
    seen = []
    handler = logging.Handler()
    handler.emit = lambda record: seen.append(record.getMessage())
    logger.addHandler(handler)
    try:
        logger.addFilter(DropMessage("--user-dir=/x has already been imported."))
        logger.addFilter(DropMessage("--user-dir=/x has already been imported."))
        assert len(logger.filters) == 1
        logger.warning("--user-dir=/x has already been imported.")
        logger.warning("--user-dir=/y has already been imported.")
        assert seen == ["--user-dir=/y has already been imported."]
    finally:
        logger.removeHandler(handler)
        logger.filters.clear()
