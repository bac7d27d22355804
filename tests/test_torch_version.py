"""lsg_layers.torch_version: the torch floor said once (setup.py's torch>= is MIN_TORCH), a torch
older than it refused in one line at import, and the compiled encoder layers' own, newer floor."""

import os
import re
import subprocess
import sys

import pytest
import torch

from conftest import REPO_ROOT

from lsg_layers.torch_version import COMPILED_LAYERS_TORCH, MIN_TORCH, at_least, check, version_tuple


def test_setup_py_floor_is_min_torch():
    with open(os.path.join(REPO_ROOT, "setup.py")) as f:
        (floor,) = re.findall(r'"torch>=(\d+)\.(\d+)"', f.read())
    assert tuple(map(int, floor)) == MIN_TORCH
    assert at_least(MIN_TORCH) and MIN_TORCH < COMPILED_LAYERS_TORCH


def test_versions_are_read_as_major_minor():
    assert version_tuple("2.13.0+cpu") == (2, 13)
    assert version_tuple("2.11.0a0+git1234abc") == (2, 11)
    assert version_tuple("2.6.0") == (2, 6) and at_least((2, 6), "2.6.0") and at_least((2, 6), "2.10.1")
    assert not at_least((2, 10), "2.9.1+cu128")  # 10 > 9 as numbers, not as text
    with pytest.raises(ValueError, match="not a torch version: 'nightly'"):
        version_tuple("nightly")


def test_an_older_torch_is_one_line():
    check("2.6.0+cu124")
    with pytest.raises(ImportError) as e:
        check("2.4.1+cu121")
    message = str(e.value)
    assert "\n" not in message
    assert message.startswith("lsg-fairseq needs torch >= 2.6, and this is torch 2.4.1+cu121: install torch >= 2.6")


def test_importing_the_plugin_refuses_an_older_torch_before_any_module_fails():
    """torch 2.2 failed deep in lsg_layers/ops/window_attention.py (a private aten op missing); the
    check runs first. The interpreter's torch says it is 2.2.2."""
    code = "import torch; torch.__version__ = '2.2.2'; import lsg_fairseq"
    r = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 1
    assert r.stderr.rstrip().splitlines()[-1] == (
        "ImportError: lsg-fairseq needs torch >= 2.6, and this is torch 2.2.2: install torch >= 2.6 "
        "(the build for your CUDA; README, 'Install by hand')"
    ), r.stderr[-2000:]
    assert "window_attention" not in r.stderr


def test_compiled_layers_refuse_a_torch_older_than_theirs(monkeypatch):
    from lsg_fairseq.models.compiled_layers import compile_encoder_layers

    monkeypatch.setattr(torch, "__version__", "2.9.1")
    need = r"^compiling the encoder layers needs torch >= 2\.10; this is torch 2\.9\.1$"
    with pytest.raises(RuntimeError, match=need):
        compile_encoder_layers(torch.nn.Module())  # refused before the model is looked at
