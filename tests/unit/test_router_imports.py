"""The router imports the semantic stages' machinery (:mod:`laya.semantic`, numpy) only when its configuration
turns a semantic stage on."""

from __future__ import annotations

import subprocess
import sys

HEAVY = """
import sys

def heavy():
    return sorted(m for m in sys.modules if m.split(".")[0] in ("numpy", "wordllama") or m.startswith("laya.semantic"))
"""


def run(code: str) -> None:
    """``code`` in a clean interpreter: this one has imported everything the other tests needed."""
    done = subprocess.run([sys.executable, "-c", HEAVY + code], capture_output=True, text=True, timeout=120,
                          check=False)
    assert done.returncode == 0, done.stderr[-2000:]


def test_the_router_imports_no_numpy_while_no_semantic_stage_is_on() -> None:
    run("""
import laya.router.ingress
assert heavy() == [], heavy()

from redis import Redis
from laya.config import Settings
from laya.router.ingress import Router
from laya.router.rules import RuleSet, RuleSpec

rules = RuleSet([RuleSpec(name="hello", match="exact", patterns=["hello"], reply="Hello!")], source="<test>")
router = Router(Settings(), Redis(), consumer="test", rules=rules)
assert router.intent_stage.index is None and router.semantic_stage.cache is None
assert heavy() == [], heavy()
""")


def test_a_rule_with_examples_loads_the_semantic_package() -> None:
    run("""
from redis import Redis
from laya.config import Settings
from laya.router.ingress import Router
from laya.router.rules import RuleSet, RuleSpec

rules = RuleSet([RuleSpec(name="track", examples=["where is my parcel"], reply="Tracking.")], source="<test>")
router = Router(Settings(), Redis(), consumer="test", rules=rules)
assert router.intent_stage.index is not None and len(router.intent_stage.index) == 1
assert "numpy" in sys.modules and "laya.semantic.intents" in sys.modules, heavy()
""")
