"""The JSON tables under ``benchmarks/results`` as the scripts that append to them read them back:
whose table a file is (``run.py``'s, ``int8.py``'s, ``gpu_check.sh``'s report), and the rule
that smoke figures (tiny models) and measured ones never share a table. Each refusal is a
:class:`~lsg_text.errors.UserError` raised before anything is measured or written.
"""

import json
import os
from typing import Optional

from lsg_text.errors import ConfigError, MissingFileError

# what wrote a JSON of benchmarks/results, by a key only that writer's JSON has
TABLE_WRITERS = {"records": "run.py's table", "stages": "gpu_check.sh's report", "speed": "int8.py's table"}


def read_table(path: str, script: str, keys: tuple, report_only: bool) -> Optional[dict]:
    """The table ``script`` (``run.py``, ``int8.py``) wrote at ``path``, None where there is none.
    Refused (:class:`UserError`), before anything is measured or written: no file for
    ``--report-only``, and a file that is not JSON or lacks any of ``keys`` (another writer's:
    ``benchmarks/results/cuda.json`` is ``gpu_check.sh``'s report)."""
    if not os.path.exists(path):
        if report_only:
            raise MissingFileError(
                f"{path}: does not exist (--report-only redraws a table {script} wrote; --out and --tag name it)"
            )
        return None
    try:
        with open(path) as f:
            old = json.load(f)
    except json.JSONDecodeError as e:
        raise ConfigError(
            f"{path}: not {script}'s table (not JSON: {e.msg}, line {e.lineno}): choose another --out or --tag"
        ) from None
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"{path}: not {script}'s table ({e}): choose another --out or --tag") from None
    if not (isinstance(old, dict) and all(key in old for key in keys)):
        found = [w for key, w in TABLE_WRITERS.items() if isinstance(old, dict) and key in old]
        what = found[0] if found else "no " + " and ".join(keys)
        raise ConfigError(f"{path}: not {script}'s table ({what}): choose another --out or --tag")
    return old


def refuse_mixed_figures(path: str, held_smoke: set, smoke: bool, append: bool, smoke_flag: str) -> None:
    """Smoke figures (tiny models: ``smoke_flag``) never replace or join measured ones, nor measured
    ones join smoke ones (``held_smoke``: whether each run of the table at ``path`` was a smoke run)."""
    if (smoke and False in held_smoke) or (append and not smoke and True in held_smoke):
        held, this = ("measured", smoke_flag) if smoke else (smoke_flag, "measured")
        verb = "merge into" if append else "replace"
        raise ConfigError(f"{path} holds {held} figures, which a {this} run would {verb}: choose another --out")
