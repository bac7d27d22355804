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


FIXTURE = "tests/data/fixtures/lsg/lsg_norm/hf"


def convert(tmp_path, quiet: bool):
    """lsg-fairseq-convert on a fixture, as the command runs (``quiet``) or with its logging set-up
    taken out; (stdout, stderr)."""
    setup = "" if quiet else "import contextlib; c.command_logging = contextlib.nullcontext; "
    code = f"import lsg_fairseq.cli.convert as c; {setup}c.main(['{FIXTURE}', '{tmp_path / 'out'}'])"
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout, proc.stderr


def test_a_conversion_prints_its_result_and_nothing_of_fairseq(tmp_path):
    """Building the model goes through fairseq's hydra config conversion: its DEBUG lines and hydra's
    deprecation warnings reached the user's terminal (26 lines); now only the result's path, and on
    stderr the one line of the flags that fine-tune it."""
    out, err = convert(tmp_path, quiet=True)
    model = tmp_path / "out" / "model.pt"
    assert out.strip() == str(model), out
    assert err.startswith(f"fairseq-train builds the model from its command line; fine-tune {model} with --arch ")
    assert err.count("\n") == 1, err[:2000]


def test_the_conversion_check_can_fail(tmp_path):
    out, err = convert(tmp_path, quiet=False)
    assert "DEBUG:hydra" in err and "UserWarning" in err


def test_main_called_in_process_leaves_the_callers_logging_as_it_was(tmp_path):
    """A test or a notebook calling the converter's ``main`` keeps its root handlers and level."""
    from lsg_fairseq.cli import convert as cli

    root = logging.getLogger()
    before = (root.handlers[:], root.level)
    cli.main([FIXTURE, str(tmp_path / "out")])
    assert (root.handlers, root.level) == before
