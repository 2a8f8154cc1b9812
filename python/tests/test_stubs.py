"""The type stubs (cuda-interop-py/cuda_interop.pyi, shipped in the wheel with
py.typed) name exactly the module's public API: every function, class,
method and property of the built module is in the stubs, and every name in
the stubs exists in the module. (The `_`-prefixed test hooks are not part of
the API and have no stubs.) Where mypy is importable (Debian: python3-mypy,
which the `mypy` package pulls in), the stubs pass `mypy --strict` on their
own, and so does a file that uses the module as users do (`with` blocks
over receivers and frames, `list_senders()`); where it is not, those checks
are skipped, and say so."""

import ast
import importlib.util
import os
import shutil
import subprocess
import sys
import textwrap

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
    aliases = {"StreamArg", "Delivery", "SlotKind"}  # typing aliases of the stubs only
    assert runtime - top == set(), "in the module, not in the stubs"
    assert top - aliases - {"__version__"} - runtime == set(), "in the stubs, not in the module"
    for name, members in classes.items():
        cls = getattr(cuda_interop, name)
        assert public(vars(cls)) - members == set(), f"{name}: in the module, not in the stubs"
        assert members - set(dir(cls)) == set(), f"{name}: in the stubs, not in the module"


def mypy_strict(*paths, cwd):
    """Runs `python3 -m mypy --strict` on `paths` (skips where mypy is not
    importable); returns its output, asserting it passed."""
    if importlib.util.find_spec("mypy") is None:
        pytest.skip(
            "mypy is not importable by this interpreter (Debian: apt install python3-mypy; "
            "elsewhere: pip install mypy): the stubs were not type-checked"
        )
    result = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--no-incremental",
         "--cache-dir", os.devnull, *paths],
        capture_output=True, text=True, cwd=cwd,
        env=dict(os.environ, MYPYPATH=cwd),
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def test_the_stubs_type_check(tmp_path):
    shutil.copy(STUB, tmp_path / "cuda_interop.pyi")
    mypy_strict("cuda_interop.pyi", cwd=tmp_path)


# What users write: every `with` block, a return from inside one (which
# needs `__exit__` typed as never swallowing: `-> bool` would make mypy
# report a missing return), the stream arguments, list_senders().
USER_CODE = """
    from typing import List, Optional, Tuple

    import cuda_interop


    def describe(info: cuda_interop.SenderInfo) -> str:
        return (
            f"{info.name}: {info.width}x{info.height} pitch {info.row_pitch} {info.format} "
            f"{info.kind} slots={info.slots} fps={info.fps:.1f} pid={info.pid} {info.socket}"
        )


    def senders() -> List[str]:
        return [describe(s) for s in cuda_interop.list_senders()]


    def first_tag(rx: cuda_interop.Receiver) -> int:
        with rx.next(1.0) as frame:
            return frame.tag


    def shape_of_next(name: str) -> Tuple[int, ...]:
        with cuda_interop.connect_named(name, 5.0, delivery="lossless") as rx:
            layout: Optional[Tuple[int, int, int, int]] = rx.layout
            assert layout is not None and rx.delivery == "lossless"
            with rx.next(1.0) as frame:
                kind, ordinal = frame.__dlpack_device__()
                capsule = frame.__dlpack__(stream=None, max_version=(1, 0))
                del capsule
                shape = frame.shape
            missed: int = rx.dropped + rx.held + rx.received
        return shape


    def poll(path: str) -> Optional[int]:
        rx = cuda_interop.connect(path, 2.0)
        try:
            frame = rx.next(0.5)
        except TimeoutError:
            return None
        finally:
            rx.close()
        frame.release(stream=-1)
        interface = frame.__cuda_array_interface__ if frame.slot is not None else None
        return frame.tag if interface is None else frame.nbytes
"""


def test_user_code_type_checks_against_the_stubs(tmp_path):
    shutil.copy(STUB, tmp_path / "cuda_interop.pyi")
    (tmp_path / "user.py").write_text(textwrap.dedent(USER_CODE))
    mypy_strict("user.py", cwd=tmp_path)


def test_help_opens_with_what_the_module_does():
    doc = cuda_interop.__doc__ or ""
    assert doc.startswith("Receive video frames"), doc[:80]
    assert "[`" not in doc
    for obj in (cuda_interop.Receiver, cuda_interop.Frame, cuda_interop.SenderInfo):
        for name, member in vars(obj).items():
            assert "[`" not in (getattr(member, "__doc__", None) or ""), (obj, name)
    assert "(1, 0)" in cuda_interop.Frame.__dlpack_device__.__doc__
