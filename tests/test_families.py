"""README "Adding an encoder": a new model family is its files, and nothing else is touched.

``tests/toy_family`` holds the recipe's files for a toy encoder, BART whose tokens attend only to
their neighbours up to a fixed window: the attention module, the registered model and its archs,
the family (both conversion directions, its config field, its benchmark row). They are copied
into a copy of the package, and the copy converts an HF BART folder to the toy family (API and
``lsg-fairseq-convert``, whose ``--to`` and flags come from the family), exports it (API and
``lsg-fairseq-export``), converts the export back (detected as the toy's own), and
``benchmarks/run.py --smoke`` runs its row (and lists it among its default rows).
"""

import json
import os
import shutil
import subprocess
import sys

import pytest

from conftest import FIXTURES, REPO_ROOT
from test_layers import LAYERS, import_cycles, import_graph, side_effect_imports, upward_imports

TOY = os.path.join(REPO_ROOT, "tests", "toy_family")
BART_HF = os.path.join(FIXTURES, "lsg", "bart_plain", "hf")

# Run inside the copy: every step of the recipe's promise, with plain asserts.
_CHILD = r"""
import json, os, sys
import torch
import lsg_fairseq
from fairseq import checkpoint_utils
from lsg_fairseq.convert import convert, export, families

src, work = sys.argv[1], sys.argv[2]
assert "local_bart" in families(), sorted(families())
convert(src, f"{work}/local", to="local_bart", local_window=8)
export(f"{work}/local", f"{work}/hf")
config = json.load(open(f"{work}/hf/config.json"))
assert config["architectures"] == ["LocalBartForConditionalGeneration"] and config["local_window"] == 8, config
convert(f"{work}/hf", f"{work}/again")  # no --to: the exported folder is the toy family's own
convert(src, f"{work}/wide", to="local_bart", local_window=1000)
convert(src, f"{work}/plain")

def load(name):
    models, cfg, task = checkpoint_utils.load_model_ensemble_and_task([f"{work}/{name}/model.pt"])
    return models[0].eval(), cfg

local, cfg = load("local")
again, again_cfg = load("again")
assert cfg.model.arch == again_cfg.model.arch == "local_bart_base" and again_cfg.model.local_window == 8
g = torch.Generator().manual_seed(0)
src_tokens = torch.randint(4, 400, (2, 300), generator=g)
src_tokens[:, 0], src_tokens[:, -1] = 0, 2
lengths = torch.tensor([300, 300])
prev = torch.randint(4, 400, (2, 7), generator=g)
prev[:, 0] = 2
with torch.no_grad():
    out = {name: load(name)[0](src_tokens, lengths, prev)[0] for name in ("wide", "plain")}
    out["local"], out["again"] = local(src_tokens, lengths, prev)[0], again(src_tokens, lengths, prev)[0]
assert torch.equal(out["local"], out["again"])  # HF -> fairseq -> HF -> fairseq: the same model
assert torch.allclose(out["wide"], out["plain"], atol=1e-5)  # a window over everything: BART's attention
assert not torch.allclose(out["local"], out["plain"], atol=1e-3)  # a window of 8 changes what tokens see
print("ok")
"""


def toy_files():
    """os.walk of the recipe's files, in both packages they join."""
    for package in ("lsg_fairseq", "lsg_layers"):
        yield from os.walk(os.path.join(TOY, package))


@pytest.fixture(scope="module")
def toy_repo(tmp_path_factory):
    """A copy of the packages and the benchmark with the recipe's files added, nothing else changed."""
    root = tmp_path_factory.mktemp("toy_repo")
    ignore = shutil.ignore_patterns("__pycache__")
    for folder in ("lsg_fairseq", "lsg_layers", "lsg_text", "benchmarks"):
        shutil.copytree(os.path.join(REPO_ROOT, folder), root / folder, ignore=ignore)
    added = []
    for folder, _, files in toy_files():
        for name in files:
            if name.endswith(".py"):
                rel = os.path.relpath(os.path.join(folder, name), TOY)
                assert not (root / rel).exists(), f"{rel} would replace a file: the recipe only adds files"
                shutil.copyfile(os.path.join(folder, name), root / rel)
                added.append(rel)
    assert sorted(added) == [
        "lsg_fairseq/convert/local_bart.py",
        "lsg_fairseq/models/local_bart.py",
        "lsg_layers/modules/local_attention.py",
    ]
    return root


def run(root, argv, timeout=600):
    env = dict(os.environ, PYTHONPATH=str(root), HF_HUB_OFFLINE="1")
    return subprocess.run(argv, capture_output=True, text=True, cwd=root, env=env, timeout=timeout)


def test_recipe_files_keep_the_layers():
    """The toy's files follow the import rules of the package they join (tests/test_layers.py)."""
    modules = {}
    for folder, _, files in toy_files():
        for name in files:
            path = os.path.join(folder, name)
            modules[os.path.relpath(path, TOY)[: -len(".py")].replace(os.sep, ".")] = path
    assert all(any(m.startswith(prefix + ".") for prefix, _ in LAYERS) for m in modules)
    for module, path in modules.items():
        assert upward_imports(module, path) == [] and side_effect_imports(path) == [], module
    assert import_cycles(import_graph(modules)) == []


def test_toy_family_converts_exports_and_converts_back(toy_repo, tmp_path):
    proc = run(toy_repo, [sys.executable, "-c", _CHILD, BART_HF, str(tmp_path)])
    assert proc.returncode == 0 and proc.stdout.strip().endswith("ok"), proc.stderr[-3000:]


def test_toy_family_on_the_command_line(toy_repo, tmp_path):
    out = tmp_path / "cli"
    proc = run(
        toy_repo,
        [
            sys.executable,
            "-m",
            "lsg_fairseq.cli.convert",
            BART_HF,
            str(out),
            "--to",
            "local_bart",
            "--local-window",
            "4",
        ],
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip() == str(out / "model.pt")
    # lsg-fairseq-export finds the family by the checkpoint's arch: the toy's HF folder, its window kept
    export_cli = os.path.join(os.path.dirname(sys.executable), "lsg-fairseq-export")
    export_cmd = [export_cli] if os.path.exists(export_cli) else [sys.executable, "-m", "lsg_fairseq.cli.export"]
    proc = run(toy_repo, export_cmd + [str(out), str(tmp_path / "hf")])
    assert proc.returncode == 0, proc.stderr[-3000:]
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert config["architectures"] == ["LocalBartForConditionalGeneration"] and config["local_window"] == 4, config
    proc = run(
        toy_repo, [sys.executable, "-m", "lsg_fairseq.cli.convert", str(tmp_path / "hf"), str(tmp_path / "back")]
    )
    assert proc.returncode == 0, proc.stderr[-3000:]  # no --to: the exported folder is the toy's own
    proc = run(
        toy_repo,
        [sys.executable, "-m", "lsg_fairseq.cli.convert", BART_HF, str(tmp_path / "bad"), "--local-window", "4"],
    )  # a BART source without --to: BART's, which has no window
    assert proc.returncode == 2 and proc.stderr.strip().splitlines()[-1] == (
        "lsg-fairseq-convert: error: unknown option(s) for the bart family: local_window "
        "(local-window BART options need --to local_bart)"
    )


def test_toy_family_benchmarks(toy_repo, tmp_path):
    proc = run(
        toy_repo,
        [
            sys.executable,
            os.path.join(toy_repo, "benchmarks", "run.py"),
            "--smoke",
            "--arch",
            "local_bart",
            "--out",
            str(tmp_path),
            "--tag",
            "toy",
            "--no-plots",
        ],
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads((tmp_path / "toy.json").read_text())
    assert {(r["arch"], r["mode"], r["status"]) for r in result["records"]} == {
        ("local_bart", mode, "ok") for mode in ("enc", "train", "gen")
    }
    assert result["rows"] == [  # what report.py knows of the row, written by run.py from the family's
        {"arch": "local_bart", "family": "local_bart", "growth": "1", "line": "solid", "color": None}
    ]
    # run.py --smoke's default rows (the CI check) include the toy's, and run.py was not edited
    code = "import sys; sys.path.insert(0, 'benchmarks'); import run; print(*run.parse_args(['--smoke']).arch)"
    proc = run(toy_repo, [sys.executable, "-c", code])
    assert proc.returncode == 0, proc.stderr[-3000:]
    smoke = proc.stdout.strip().splitlines()[-1].split()
    assert "local_bart" in smoke and {"bart", "lsg_norm", "linear", "locost"} <= set(smoke), smoke
    assert "lsg_lsh" not in smoke  # a row that says it is not in the smoke list


def test_one_small_interface_for_every_family():
    """registry.Family is the whole interface (seven methods, one of which says whether and why a
    family takes a source), and every family here is a class of it."""
    from lsg_fairseq.convert import registry

    methods = {n for n, v in vars(registry.Family).items() if callable(v) and not n.startswith("_")}
    assert methods == {"arch", "refusal", "add_args", "option_names", "convert", "export", "benchmarks"}
    known = registry.families()
    assert {"bart", "lsg_bart", "led", "locost"} <= set(known)
    assert all(isinstance(f, registry.Family) for f in known.values())
    for gone in ("detect", "can_convert", "why_not", "claims", "from_hf", "hf_values"):
        assert not any(hasattr(f, gone) for f in known.values()), gone
