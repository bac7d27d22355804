"""Import every module of a package folder, so that new files register themselves.

fairseq's ``import_user_module`` only auto-imports ``tasks/`` and ``models/`` the first time a
``--user-dir`` is seen; a plain ``import lsg_fairseq`` (hub, tests, converter) must register the
same things, so the package's entry point (its ``__init__``) imports its sub-packages itself.
"""

import importlib
import os


def import_all(package_name: str, package_dir: str) -> None:
    for entry in sorted(os.listdir(package_dir)):
        path = os.path.join(package_dir, entry)
        if entry.startswith(("_", ".")):
            continue
        if entry.endswith(".py"):
            name = entry[: -len(".py")]
        elif os.path.isdir(path) and os.path.exists(os.path.join(path, "__init__.py")):
            name = entry
        else:
            continue
        importlib.import_module(f"{package_name}.{name}")
