"""The suite's warning filters (pyproject.toml, [tool.pytest.ini_options]) hide what third-party code
raises and nothing of ours: a pytest run over warnings from fairseq's, hydra's and our own modules
shows ours only, and all of them without the filters."""

import os
import subprocess
import sys

from conftest import REPO_ROOT

WARNINGS = """
import warnings


def test_warns():
    # hydra's, as fairseq's convert_namespace_to_omegaconf raises it
    warnings.warn_explicit("\\nThe strict flag in the compose API is deprecated.", UserWarning, "compose.py", 56,
                           module="hydra.compose")
    # compiling fairseq's wav2vec2_asr.py (an invalid escape), and a file of ours
    compile("x = '\\\\d'\\n", "/venv/site-packages/fairseq/models/wav2vec/wav2vec2_asr.py", "exec")
    compile("x = '\\\\d'\\n", "/repo/lsg_fairseq/models/ours.py", "exec")
    # the same message raised by our code stays visible
    warnings.warn_explicit("The strict flag in the compose API is deprecated.", UserWarning, "bart.py", 1,
                           module="lsg_fairseq.convert.bart")
    warnings.warn("a warning of ours", DeprecationWarning)
"""

# what compiling an invalid escape sequence raises: Python 3.12 made it a SyntaxWarning
ESCAPE_WARNING = "SyntaxWarning" if sys.version_info >= (3, 12) else "DeprecationWarning"


def shown(tmp_path, *options) -> str:
    """The warnings summary of a pytest run of WARNINGS under this repository's settings."""
    (tmp_path / "test_warns.py").write_text(WARNINGS)
    # fairseq's epoch iterators set PYTHONWARNINGS in this process's environment when a test ran
    # them with data workers (fairseq/data/iterators.py); a child given warning options keeps
    # DeprecationWarning hidden, whatever the settings under test say
    env = {k: v for k, v in os.environ.items() if k != "PYTHONWARNINGS"}
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-c", os.path.join(REPO_ROOT, "pyproject.toml"), "--rootdir", str(tmp_path)]
        + ["-p", "no:cacheprovider", "-q", *options, "test_warns.py"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    return proc.stdout


def test_third_party_warnings_are_hidden_ours_shown(tmp_path):
    out = shown(tmp_path)
    assert "5 warnings" not in out and "3 warnings" in out, out
    assert f"ours.py:1: {ESCAPE_WARNING}: invalid escape sequence" in out
    assert "wav2vec2_asr.py" not in out and "compose.py" not in out
    assert "bart.py:1: UserWarning: The strict flag" in out and "a warning of ours" in out


def test_the_filters_can_fail(tmp_path):
    """Without the filters, fairseq's and hydra's show too."""
    out = shown(tmp_path, "-o", "filterwarnings=")
    assert "5 warnings" in out and "wav2vec2_asr.py" in out and "compose.py" in out, out
