"""Importing the plugin leaves stock fairseq runs as they were (tests/stock_fairseq/README.md).

Among them fairseq's own activation-checkpointing test, which passes ``--restore-file x.pt`` (no
such file) to mean "start fresh": the plugin's refusal of a missing restore file once made it fail
in any process that had imported the plugin; it now holds for this plugin's tasks only.
"""

import json
import os
import subprocess
import sys

from conftest import REPO_ROOT

SCRIPT = os.path.join(REPO_ROOT, "tests", "stock_fairseq", "scenarios.py")


def run_scenarios(folder, *flags, **env_vars):
    folder.mkdir()
    env = dict(
        os.environ,
        OMP_NUM_THREADS="1",
        PYTHONPATH=os.pathsep.join([REPO_ROOT, os.environ.get("PYTHONPATH", "")]),
        **env_vars,
    )
    proc = subprocess.run(
        [sys.executable, SCRIPT, str(folder / "results.json"), *flags],
        cwd=folder,
        capture_output=True,
        text=True,
        env=env,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads((folder / "results.json").read_text())


def test_stock_fairseq_scenarios_identical_with_the_plugin(tmp_path):
    # Stock fairseq 0.12 predates torch 2.6's weights-only torch.load: alone, it cannot load its own
    # checkpoints (fairseq#5603; fixed by fairseq_fixes.weights_only_load, shown by
    # test_fairseq_fixes.py). The plain run gets the switch stock fairseq users set instead.
    plain = run_scenarios(tmp_path / "plain", TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD="1")
    assert sorted(plain) == ["activation_checkpointing", "bart_beam_state", "persistent_save", "train_generate_resume"]
    assert {name: r["outcome"] for name, r in plain.items()} == dict.fromkeys(plain, "passed")
    # the scenarios observe something: stock fairseq's sticky beam size (fairseq#3893) among others
    assert plain["bart_beam_state"]["beam_size"] == 2 and "invalid" in plain["bart_beam_state"]["odd_batch_forward"]
    assert plain["train_generate_resume"]["hypotheses"] and plain["train_generate_resume"]["resumed"]["epoch"] == 2
    with_plugin = run_scenarios(tmp_path / "plugin", "--plugin")
    assert with_plugin == plain
