"""Which code and which machine produced a committed table: the last commit that touched the code an
experiment runs, and the CPU's name."""

import platform
import subprocess
from typing import Sequence

# the installed code (setup.py's packages): every experiment runs some of it, so every stamp covers it
PACKAGES = ("lsg_layers", "lsg_fairseq", "lsg_text")


def git_stamp(repo: str, code_paths: Sequence[str]) -> str:
    """The last commit (short hash) that changed any of ``code_paths`` in ``repo``, plus
    " + uncommitted changes" when those paths have edits not committed yet; "unknown" outside git.
    A commit that touches none of the paths (a README, say) does not change what the table measured."""

    def git(*args):
        try:
            return subprocess.run(["git", "-C", repo, *args], capture_output=True, text=True).stdout.strip()
        except OSError:
            return ""

    code = git("log", "-1", "--format=%h", "--", *code_paths) or "unknown"
    dirty = git("status", "--porcelain", "--untracked-files=no", "--", *code_paths)
    return code + (" + uncommitted changes" if dirty else "")


def cpu_name() -> str:
    """The CPU's model name (/proc/cpuinfo), else what ``platform`` knows."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()
