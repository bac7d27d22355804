"""The package's import graph has layers, and nothing is imported only for its side effects.

Read from the source (``ast``), not by importing: a function-level import counts like a top-level
one. The layers, lowest first (README "Where things live"):

    lsg_text                      the fairseq-free text library (never imports lsg_fairseq)
    ops, checkpoint_io            pure tensor functions; the checkpoint error type
    modules, data, generation,    layers (torch modules), fairseq datasets, the generator,
    checkpoint_policy,            the --restore-file policy, the device and precision policy
    device_policy
    models, tasks, optim,         what fairseq registers, and the patches of fairseq internals
    fairseq_fixes, quantize
    convert                       HF <-> fairseq checkpoints
    lsg_fairseq (entry point)     imports models/tasks/optim (registration) and installs the fixes
    cli                           the console scripts

A module may import a module of a lower layer, or one of its own sub-package (``models.lsg_bart``
-> ``models.custom_encoder``); never one of the same layer's other packages or above. The one
import made for its side effects (registration, fixes) is ``import lsg_fairseq`` itself. Inside a
sub-package the imports form no cycle either (``convert/__init__`` -> ``convert.hf_export`` ->
``convert/__init__`` was one): every module can be read after the ones it imports.
"""

import ast
import os

import pytest

from conftest import REPO_ROOT

# (module prefix, layer); the longest matching prefix wins
LAYERS = [
    ("lsg_text", 0),
    ("lsg_fairseq._autoimport", 1),
    ("lsg_fairseq._fairseq_logs", 1),
    ("lsg_fairseq.ops", 1),
    ("lsg_fairseq.checkpoint_io", 1),
    ("lsg_fairseq.modules", 2),
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
    ("lsg_fairseq", 5),  # the entry point, lsg_fairseq/__init__.py
    ("lsg_fairseq.cli", 6),
]
PACKAGES = ("lsg_fairseq", "lsg_text")


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
        "from lsg_fairseq.ops.blocks import KEY_ALIGN\n"
        "print(KEY_ALIGN)\n"
    )
    assert upward_imports("lsg_fairseq.ops.bad", str(bad)) == [
        "line 1: lsg_fairseq.optim.grouped_adam (layer 3; lsg_fairseq.ops.bad is layer 1)",
        "line 2: lsg_fairseq.models.lsg_bart (layer 3; lsg_fairseq.ops.bad is layer 1)",
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
