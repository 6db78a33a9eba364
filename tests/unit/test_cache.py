from __future__ import annotations

import time

from laya.contract import CachedAnswer, cacheable
from laya.router.cache import LocalCache, cache_key
from laya.schema import Request
from laya.text import normalise


def key(**fields: object) -> str:
    request = Request(**{"prompt": "Hello World", **fields})  # type: ignore[arg-type]
    return cache_key(request, "default", 64)


def test_normalisation_folds_case_width_and_whitespace() -> None:
    assert normalise("  Ｈｅｌｌｏ\t\nWORLD ") == "hello world"
    assert normalise("Straße") == "strasse"
    assert key() == key(prompt="hello   world") == key(prompt="HELLO WORLD\n")


def test_every_generation_parameter_is_part_of_the_key() -> None:
    base = key()
    variants = [key(prompt="hello there"), key(temperature=0.5), key(top_p=0.5), key(top_k=1),
                key(repeat_penalty=1.1), key(seed=1), key(stop=["\n"])]
    assert len({base, *variants}) == len(variants) + 1
    request = Request(prompt="Hello World")
    assert cache_key(request, "other", 64) != base
    assert cache_key(request, "default", 65) != base


def test_chat_keys_cover_every_message() -> None:
    a = Request(messages=[{"role": "system", "content": "A"}, {"role": "user", "content": "q"}])  # type: ignore[list-item]
    b = Request(messages=[{"role": "system", "content": "B"}, {"role": "user", "content": "q"}])  # type: ignore[list-item]
    assert cache_key(a, "m", 8) != cache_key(b, "m", 8)


def test_only_complete_answers_are_cacheable() -> None:
    assert cacheable("stop", 3, 64)
    assert cacheable("length", 64, 64)
    assert not cacheable("context", 10, 64)
    assert not cacheable("length", 10, 64)
    assert not cacheable(None, 0, 64)


def test_lru_evicts_oldest_and_expires() -> None:
    cache = LocalCache(2, ttl_s=60)
    cache.put("a", CachedAnswer(text="1"))
    cache.put("b", CachedAnswer(text="2"))
    assert cache.get("a") == CachedAnswer(text="1")  # a is now the most recent
    cache.put("c", CachedAnswer(text="3"))
    assert cache.get("b") is None and len(cache) == 2
    short = LocalCache(2, ttl_s=0.01)
    short.put("a", CachedAnswer(text="1"))
    time.sleep(0.02)
    assert short.get("a") is None
