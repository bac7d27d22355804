"""The tree passes ``ruff check`` and ``ruff format --check`` with the settings in pyproject.toml
(CI runs the suite, so CI lints); and the check does fail on a file that breaks a rule."""

import os
import shutil
import subprocess

import pytest

from conftest import BIN, REPO_ROOT

RUFF = os.path.join(BIN, "ruff") if os.path.exists(os.path.join(BIN, "ruff")) else shutil.which("ruff")


def ruff(*args, cwd=REPO_ROOT):
    assert RUFF, "ruff is not installed: pip install -e '.[test]'"
    return subprocess.run([RUFF, *args], cwd=cwd, capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("command", [["check", "."], ["format", "--check", "."]], ids=["check", "format"])
def test_the_tree_is_clean(command):
    proc = ruff(*command)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]


def test_the_check_can_fail(tmp_path):
    (tmp_path / "pyproject.toml").write_text(open(os.path.join(REPO_ROOT, "pyproject.toml")).read())
    (tmp_path / "bad.py").write_text("import os\n\nx = 'a'  \n")  # unused import, trailing space, quotes
    assert ruff("check", "--no-cache", ".", cwd=tmp_path).returncode == 1
    assert ruff("format", "--check", "--no-cache", ".", cwd=tmp_path).returncode == 1
