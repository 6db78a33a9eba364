"""The routing benchmark times the router's deciding stages, chosen by name."""

from __future__ import annotations

import pytest
from redis import Redis
from routing import DECIDING_STAGES, deciding_stages

from laya.config import Settings
from laya.router.ingress import Router
from laya.router.rules import RuleSet


def _router() -> Router:
    return Router(Settings(), Redis(), consumer="bench", rules=RuleSet([], source="<test>"))


def test_the_deciding_stages_are_those_named_in_the_router_s_order() -> None:
    router = _router()
    assert [stage.name for stage in deciding_stages(router)] == list(DECIDING_STAGES)
    router.stages.insert(2, router.decode_stage)  # a stage by another name changes nothing measured
    assert [stage.name for stage in deciding_stages(router)] == list(DECIDING_STAGES)


def test_a_named_stage_the_router_lost_is_an_error() -> None:
    router = _router()
    router.stages = [stage for stage in router.stages if stage.name != "cache"]
    with pytest.raises(RuntimeError, match=r"no stage named \['cache'\]"):
        deciding_stages(router)
