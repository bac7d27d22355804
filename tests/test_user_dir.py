"""`--user-dir`: fairseq wants a path; the helper prints one that works from anywhere."""

import os
import subprocess
import sys

from conftest import BIN, REPO_ROOT


def test_user_dir_helper_prints_the_package_folder(tmp_path):
    out = subprocess.run(
        [os.path.join(BIN, "lsg-fairseq-user-dir")], cwd=tmp_path, capture_output=True, text=True, check=True
    )
    path = out.stdout.strip()
    assert os.path.isabs(path) and os.path.basename(path) == "lsg_fairseq"
    assert os.path.samefile(path, os.path.join(REPO_ROOT, "lsg_fairseq"))


def test_user_dir_helper_imports_neither_the_plugin_nor_fairseq(tmp_path):
    """Printing the path needs no import of the plugin (and with it fairseq and torch, seconds): it
    still works where importing fairseq would fail."""
    broken = tmp_path / "broken"
    for name in ("fairseq", "torch"):
        (broken / name).mkdir(parents=True)
        (broken / name / "__init__.py").write_text(f"raise ImportError('{name} imported')\n")
    env = dict(os.environ, PYTHONPATH=str(broken))
    out = subprocess.run(
        [os.path.join(BIN, "lsg-fairseq-user-dir")], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    assert os.path.samefile(out.stdout.strip(), os.path.join(REPO_ROOT, "lsg_fairseq"))
    failing = subprocess.run(  # the broken packages do break an import of the plugin
        [sys.executable, "-c", "import lsg_fairseq"], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert failing.returncode != 0 and "imported" in failing.stderr


def _choices(flag, value):
    # An invalid choice makes argparse list every registered one, plugin's included.
    out = subprocess.run(
        [os.path.join(BIN, "fairseq-train"), REPO_ROOT, "--user-dir", "lsg_fairseq", flag, value],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
    )
    assert out.returncode != 0 and "invalid choice" in out.stderr
    return out.stderr


def test_relative_user_dir_from_repo_root_registers_the_plugin():
    # `--user-dir lsg_fairseq` from the repo root: fairseq resolves it against the cwd.
    archs = _choices("--arch", "no_such_arch")
    for name in ("lsg_bart_tiny", "lsg_bart_base", "lsg_bart_large", "locost_tiny", "locost_base", "led_base"):
        assert name in archs
    tasks = _choices("--task", "no_such_task")
    for name in ("long_document_summarization", "gap_sentence_generation"):
        assert name in tasks
