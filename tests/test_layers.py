"""The package's import graph has layers, and nothing is imported only for its side effects.

Read from the source (``ast``), not by importing: a function-level import counts like a top-level
one. The layers, lowest first (ARCHITECTURE.md, "Layers"):

    lsg_text                      the fairseq-free text library (never imports lsg_fairseq)
    lsg_layers.ops, checkpoint_io pure tensor functions; the checkpoint error type
    lsg_layers.modules, data,     layers (torch modules), fairseq datasets, the generator,
    generation,
    checkpoint_policy,            the --restore-file policy, the device and precision policy
    device_policy
    models, tasks, optim,         what fairseq registers, and the patches of fairseq internals
    fairseq_fixes, quantize
    convert                       HF <-> fairseq checkpoints
    lsg_fairseq.ops, .modules     the old import paths of lsg_layers (aliases; nothing of ours uses them)
    lsg_fairseq (entry point)     imports models/tasks/optim (registration) and installs the fixes
    cli                           the console scripts

``lsg_layers`` and ``lsg_text`` stand apart from the plugin: they import neither fairseq nor
``lsg_fairseq`` (checked from the source here, and by importing them in a fresh interpreter).

A module may import a module of a lower layer, or one of its own sub-package (``models.lsg_bart``
-> ``models.custom_encoder``); never one of the same layer's other packages or above. The one
import made for its side effects (registration, fixes) is ``import lsg_fairseq`` itself. Inside a
sub-package the imports form no cycle either (``convert/__init__`` -> ``convert.hf_export`` ->
``convert/__init__`` was one): every module can be read after the ones it imports.
"""

import ast
import importlib
import json
import os
import pkgutil
import subprocess
import sys

import pytest

from conftest import REPO_ROOT

# (module prefix, layer); the longest matching prefix wins
LAYERS = [
    ("lsg_text", 0),
    ("lsg_layers", 1),  # its __init__ (docstring only)
    ("lsg_fairseq._autoimport", 1),
    ("lsg_fairseq._fairseq_logs", 1),
    ("lsg_fairseq._aliases", 1),
    ("lsg_layers.ops", 1),
    ("lsg_fairseq.checkpoint_io", 1),
    ("lsg_layers.modules", 2),
    ("lsg_fairseq.data", 2),
    ("lsg_fairseq.generation", 2),
    ("lsg_fairseq.checkpoint_policy", 2),
    ("lsg_fairseq.device_policy", 2),
    ("lsg_fairseq.models", 3),
    ("lsg_fairseq.tasks", 3),
    ("lsg_fairseq.optim", 3),
    ("lsg_fairseq.fairseq_fixes", 3),
    ("lsg_fairseq.quantize", 3),
    ("lsg_fairseq.convert", 4),
    ("lsg_fairseq.ops", 4),  # the old import paths of lsg_layers (aliases, lsg_fairseq/_aliases.py)
    ("lsg_fairseq.modules", 4),
    ("lsg_fairseq", 5),  # the entry point, lsg_fairseq/__init__.py
    ("lsg_fairseq.cli", 6),
]
PACKAGES = ("lsg_fairseq", "lsg_layers", "lsg_text")
STANDALONE = ("lsg_layers", "lsg_text")  # packages usable without fairseq or the plugin


def module_files():
    """{dotted module name: path} of every module of both packages."""
    found = {}
    for package in PACKAGES:
        for folder, _, files in os.walk(os.path.join(REPO_ROOT, package)):
            for name in files:
                if name.endswith(".py"):
                    path = os.path.join(folder, name)
                    dotted = os.path.relpath(path, REPO_ROOT)[: -len(".py")].replace(os.sep, ".")
                    found[dotted.removesuffix(".__init__")] = path
    return found


MODULES = module_files()


def layer_of(module: str):
    """(layer, group): group is the prefix that matched (a sub-package imports itself freely)."""
    prefix = max((p for p, _ in LAYERS if module == p or module.startswith(p + ".")), key=len)
    return dict(LAYERS)[prefix], prefix


def imports_of(path: str, modules=MODULES):
    """[(line, imported module, bound names)] of our packages' imports in a file (``modules``: the
    known module names, so that ``from package import submodule`` counts as the submodule)."""
    tree = ast.parse(open(path, encoding="utf-8").read(), path)
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] in PACKAGES:
                    bound = alias.asname or alias.name.split(".")[0]
                    out.append((node.lineno, alias.name, [bound]))
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module.split(".")[0] in PACKAGES:
            for alias in node.names:
                full = f"{node.module}.{alias.name}"  # `from pkg import submodule` imports the submodule
                out.append((node.lineno, full if full in modules else node.module, [alias.asname or alias.name]))
    return tree, out


def used_names(tree) -> set:
    names = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
    for node in ast.walk(tree):  # __all__ = [...] re-exports count as uses
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "__all__" for t in node.targets):
            names |= {e.value for e in ast.walk(node.value) if isinstance(e, ast.Constant)}
    return names


def upward_imports(module: str, path: str):
    layer, group = layer_of(module)
    wrong = []
    for line, target, _ in imports_of(path)[1]:
        target_layer, target_group = layer_of(target)
        if target_group != group and target_layer >= layer:
            wrong.append(f"line {line}: {target} (layer {target_layer}; {module} is layer {layer})")
    return wrong


def side_effect_imports(path: str):
    """Imports none of whose bound names is used, except ``import lsg_fairseq`` (the entry point)."""
    tree, imports = imports_of(path)
    used = used_names(tree)
    return [
        f"line {line}: {target}" for line, target, bound in imports if target != "lsg_fairseq" and not set(bound) & used
    ]


def import_graph(modules=MODULES) -> dict:
    """{module: the modules of ours it imports}, imports inside functions included."""
    return {
        module: {target for _, target, _ in imports_of(path, modules)[1] if target in modules and target != module}
        for module, path in modules.items()
    }


def import_cycles(graph: dict) -> list:
    """Every import cycle: the strongly connected components of more than one module (Tarjan),
    each sorted, in sorted order."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(module):
        index[module] = low[module] = len(index)
        stack.append(module)
        on_stack.add(module)
        for target in sorted(graph.get(module, ())):
            if target not in index:
                visit(target)
                low[module] = min(low[module], low[target])
            elif target in on_stack:
                low[module] = min(low[module], index[target])
        if low[module] == index[module]:
            component = []
            while not component or component[-1] != module:
                component.append(stack.pop())
                on_stack.discard(component[-1])
            if len(component) > 1:
                found.append(sorted(component))

    for module in sorted(graph):
        if module not in index:
            visit(module)
    return sorted(found)


def test_layers_cover_every_module():
    assert len(MODULES) > 60
    for module in MODULES:
        layer_of(module)  # max() of nothing raises for a module outside every prefix


@pytest.mark.parametrize("module", sorted(MODULES))
def test_no_upward_import(module):
    wrong = upward_imports(module, MODULES[module])
    assert not wrong, f"{MODULES[module]} imports upward:\n" + "\n".join(wrong)


@pytest.mark.parametrize("module", sorted(m for m in MODULES if m != "lsg_fairseq"))
def test_no_import_only_for_side_effects(module):
    unused = side_effect_imports(MODULES[module])
    assert not unused, f"{MODULES[module]} imports without using:\n" + "\n".join(unused)


def test_the_checks_can_fail(tmp_path):
    """An ops module importing an optimizer for its registration and an unused model is caught twice."""
    bad = tmp_path / "bad.py"
    bad.write_text(
        "import lsg_fairseq.optim.grouped_adam  # registers an optimizer\n"
        "from lsg_fairseq.models import lsg_bart\n"
        "from lsg_layers.ops.blocks import KEY_ALIGN\n"
        "print(KEY_ALIGN)\n"
    )
    assert upward_imports("lsg_layers.ops.bad", str(bad)) == [
        "line 1: lsg_fairseq.optim.grouped_adam (layer 3; lsg_layers.ops.bad is layer 1)",
        "line 2: lsg_fairseq.models.lsg_bart (layer 3; lsg_layers.ops.bad is layer 1)",
    ]
    assert upward_imports("lsg_fairseq.cli.bad", str(bad)) == []
    assert side_effect_imports(str(bad)) == [
        "line 1: lsg_fairseq.optim.grouped_adam",
        "line 2: lsg_fairseq.models.lsg_bart",
    ]


def test_no_import_cycle():
    cycles = import_cycles(import_graph())
    assert not cycles, "import cycles (imports inside functions count):\n" + "\n".join(" <-> ".join(c) for c in cycles)


def test_the_cycle_check_can_fail(tmp_path):
    """Two modules of one package importing each other, one of them inside a function, are a cycle;
    either import alone is not."""
    a, b = tmp_path / "a.py", tmp_path / "b.py"
    a.write_text("from lsg_fairseq.convert import b\n\n\ndef run():\n    return b.VALUE\n")
    b.write_text("VALUE = 1\n\n\ndef later():\n    from lsg_fairseq.convert.a import run\n    return run()\n")
    modules = {"lsg_fairseq.convert.a": str(a), "lsg_fairseq.convert.b": str(b)}
    assert import_graph(modules) == {
        "lsg_fairseq.convert.a": {"lsg_fairseq.convert.b"},
        "lsg_fairseq.convert.b": {"lsg_fairseq.convert.a"},
    }
    assert import_cycles(import_graph(modules)) == [["lsg_fairseq.convert.a", "lsg_fairseq.convert.b"]]
    b.write_text("VALUE = 1\n")
    assert import_cycles(import_graph(modules)) == []


def plugin_imports(path: str):
    """Imports of fairseq or lsg_fairseq anywhere in a file (what a standalone package must not have)."""
    wrong = []
    for node in ast.walk(ast.parse(open(path, encoding="utf-8").read(), path)):
        names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
        if isinstance(node, ast.ImportFrom) and node.level == 0:
            names = [node.module]
        wrong += [f"line {node.lineno}: {n}" for n in names if n.split(".")[0] in ("fairseq", "lsg_fairseq")]
    return wrong


@pytest.mark.parametrize("module", sorted(m for m in MODULES if m.split(".")[0] in STANDALONE))
def test_standalone_packages_import_no_plugin(module):
    wrong = plugin_imports(MODULES[module])
    assert not wrong, f"{MODULES[module]} imports fairseq or the plugin:\n" + "\n".join(wrong)


def test_the_standalone_check_can_fail(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text(
        "import torch\n\n\ndef f():\n    from fairseq.models import bart\n    import lsg_fairseq.ops.blocks\n"
    )
    assert plugin_imports(str(bad)) == ["line 5: fairseq.models", "line 6: lsg_fairseq.ops.blocks"]


def test_lsg_layers_imports_without_fairseq(tmp_path):
    """Every module of lsg_layers, imported in a fresh interpreter (this process has long imported
    fairseq), loads neither fairseq nor lsg_fairseq."""
    import lsg_layers

    modules = ["lsg_layers"] + sorted(m.name for m in pkgutil.walk_packages(lsg_layers.__path__, "lsg_layers."))
    assert {"lsg_layers.ops.blocks", "lsg_layers.modules.s4d", "lsg_layers.modules.lsg_attention"} <= set(modules)
    code = (
        "import importlib, json, sys\n"
        f"for name in {modules!r}:\n"
        "    importlib.import_module(name)\n"
        "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in ('fairseq', 'lsg_fairseq'))))"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    assert json.loads(r.stdout.strip().splitlines()[-1]) == []


def test_old_import_paths_are_the_moved_modules():
    """``lsg_fairseq.ops.<name>`` / ``lsg_fairseq.modules.<name>`` are the lsg_layers modules themselves
    (a monkeypatch through either reaches both); cross-attention, which needs fairseq, is in models."""
    import lsg_layers

    moved = [  # the two sub-packages that moved out of lsg_fairseq (lsg_layers' own modules never lived there)
        m.name
        for m in pkgutil.walk_packages(lsg_layers.__path__, "lsg_layers.")
        if not m.ispkg and m.name.startswith(("lsg_layers.ops.", "lsg_layers.modules."))
    ]
    assert len(moved) >= 15
    for name in moved:
        old = name.replace("lsg_layers.", "lsg_fairseq.", 1)
        assert importlib.import_module(old) is importlib.import_module(name), old
    from lsg_fairseq.modules.cross_attention import LongSourceCrossAttention

    assert LongSourceCrossAttention.__module__ == "lsg_fairseq.models.cross_attention"


def test_nothing_of_ours_imports_the_old_paths():
    """The aliases are for other people's code: ours imports the new homes."""
    old = [
        f"{path}: {line}: {target}"
        for module, path in MODULES.items()
        for line, target, _ in imports_of(path)[1]
        if target.split(".")[:2] in (["lsg_fairseq", "ops"], ["lsg_fairseq", "modules"])
    ]
    assert old == []
