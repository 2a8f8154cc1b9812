"""The type stubs (cuda-interop-py/cuda_interop.pyi, shipped in the wheel with
py.typed) name exactly the module's public API: every function, class,
method and property of the built module is in the stubs, and every name in
the stubs exists in the module. (The `_`-prefixed test hooks are not part of
the API and have no stubs.) Where mypy is installed, the stubs also pass
`mypy --strict` on their own; where it is not, that check is skipped, and
says so."""

import ast
import os
import shutil
import subprocess
import sys

import pytest

import cuda_interop

STUB = os.path.join(os.path.dirname(__file__), "..", "..", "cuda-interop-py", "cuda_interop.pyi")
# Protocol methods a consumer calls: part of the API though dunder.
PROTOCOL = {"__dlpack__", "__dlpack_device__", "__cuda_array_interface__", "__enter__", "__exit__"}


def stub_api():
    tree = ast.parse(open(STUB).read())
    top, classes = set(), {}
    for node in tree.body:
        if isinstance(node, ast.FunctionDef):
            top.add(node.name)
        elif isinstance(node, ast.ClassDef):
            top.add(node.name)
            classes[node.name] = {n.name for n in node.body if isinstance(n, ast.FunctionDef)}
        elif isinstance(node, ast.AnnAssign):
            top.add(node.target.id)
        elif isinstance(node, ast.Assign):
            top.update(t.id for t in node.targets)
    return top, classes


def public(names):
    return {n for n in names if not n.startswith("_") or n in PROTOCOL}


def test_the_stubs_name_the_modules_public_api():
    top, classes = stub_api()
    runtime = public(vars(cuda_interop)) | {"__version__", "PROTOCOL_VERSION"}
    aliases = {"StreamArg", "Delivery"}  # typing aliases of the stubs only
    assert runtime - top == set(), "in the module, not in the stubs"
    assert top - aliases - {"__version__"} - runtime == set(), "in the stubs, not in the module"
    for name, members in classes.items():
        cls = getattr(cuda_interop, name)
        assert public(vars(cls)) - members == set(), f"{name}: in the module, not in the stubs"
        assert members - set(dir(cls)) == set(), f"{name}: in the stubs, not in the module"


def test_the_stubs_type_check():
    mypy = shutil.which("mypy")
    if mypy is None:
        try:
            import mypy  # noqa: F401
        except ImportError:
            pytest.skip("mypy is not installed (pip install mypy): the stubs were not type-checked")
        mypy = None
    command = [mypy] if mypy else [sys.executable, "-m", "mypy"]
    result = subprocess.run(
        command + ["--strict", "--no-incremental", STUB], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout + result.stderr
