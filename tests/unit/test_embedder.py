"""The embedder's word cache gives the tokenizer's own ids, and is used only where that holds."""

from __future__ import annotations

import numpy as np
import pytest
from tokenizers import Tokenizer, models, normalizers, pre_tokenizers

from laya.semantic.embedder import Embedder, load_embedder
from laya.text import normalise
from tests.datasets import load

AWKWARD = [
    "", " ", "a", "don't", "3.14 km/h!", "naïve café 東京 🙂", "tab\there", "new\nline", "x<s>y", "hello <s> world",
    "</s> end", "  two  spaces ", " leading", "trailing ", "a  b", "‘quoted’ — dash", "email me at a@b.co",
    "a\u2581 1", "x\u2581y z", "\u2581 lead", "word " * 3 + "x" * 100,
]


@pytest.fixture(scope="module")
def embedder() -> Embedder:
    return load_embedder()


def test_wordllamas_tokenizer_splits_at_spaces(embedder: Embedder) -> None:
    assert embedder.by_word


def test_cached_ids_are_the_tokenizers_ids(embedder: Embedder) -> None:
    texts = list(AWKWARD)
    for name in ("semantic_cache/tuning-hand-written.jsonl", "semantic_cache/tuning-templated.jsonl"):
        for pair in load(name):
            texts += [pair["a"], pair["b"]]
    texts += [normalise(text) for text in texts]
    whole = embedder._tokenizer
    for _ in range(2):  # the second pass reads every word from the cache
        for text in texts:
            assert embedder.token_ids(text) == whole.encode(text, add_special_tokens=False).ids, repr(text)


def test_the_vector_is_the_normalised_sum_of_the_token_rows(embedder: Embedder) -> None:
    ids = embedder._tokenizer.encode("how do i reset my password", add_special_tokens=False).ids
    expected = embedder.table[ids].sum(axis=0)
    expected /= np.linalg.norm(expected)
    np.testing.assert_allclose(embedder.embed("how do i reset my password"), expected, atol=1e-6)
    assert not embedder.embed("").any()


def test_numbers_are_read_digit_by_digit_as_the_tokenizer_does_and_stay_out_of_the_cache() -> None:
    # Unique ids and amounts would churn the word cache (and each cost a tokenizer call): WordLlama's tokenizer
    # spells a number as "▁" and its digits, and the embedder does so itself.
    embedder = load_embedder()
    rng = np.random.default_rng(0)
    numbers = ["0", "00", "007", *(str(rng.integers(10 ** rng.integers(1, 19))) for _ in range(300))]
    texts = [f"order {n} is late" for n in numbers] + [f"{n} {n[::-1]}" for n in numbers] + ["3.14 2024-05-06 x9 9x ²"]
    for text in texts:
        assert embedder.token_ids(text) == embedder._tokenizer.encode(text, add_special_tokens=False).ids, text
    assert embedder._digits is not None
    assert not [word for word in embedder._words if word.isascii() and word.isdigit()]


def test_the_kernels_row_sum_is_numpys(embedder: Embedder) -> None:
    from laya.semantic.embedder import _scan

    if _scan is None or not _scan.supported():
        pytest.skip("the C kernel is not built, or this CPU runs none of its kernels")
    texts = [text for text in AWKWARD if text.strip()]
    for pair in load("semantic_cache/tuning-hand-written.jsonl")[:200]:
        texts.append(pair["a"])
    for text in texts:
        ids = embedder.token_ids(text)
        np.testing.assert_allclose(embedder.embed(text), embedder.embed_numpy(ids), atol=2e-7, err_msg=text)
    with pytest.raises(ValueError, match="outside the table"):
        _scan.embed(embedder.table, np.asarray([len(embedder.table)], dtype=np.int32), np.empty(embedder.dim, np.float32))


def test_a_full_word_cache_starts_again(embedder: Embedder) -> None:
    small = Embedder(embedder.table, embedder._tokenizer, word_cache=3)
    text = "one two three four five six"
    assert small.token_ids(text) == embedder._tokenizer.encode(text, add_special_tokens=False).ids
    assert len(small._words) <= 3


def _tiny_tokenizer(vocab: dict[str, int], *, pre_tokenized: bool) -> Tokenizer:
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    tokenizer.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    if pre_tokenized:
        tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    return tokenizer


def test_a_tokenizer_whose_tokens_span_words_is_never_cached_by_word() -> None:
    table = np.eye(8, dtype=np.float32)
    plain = {"<unk>": 0, "▁": 1, "a": 2, "b": 3, "▁a": 4, "▁b": 5}
    assert Embedder(table, _tiny_tokenizer(plain, pre_tokenized=False)).by_word
    spanning = Embedder(table, _tiny_tokenizer({**plain, "a▁b": 6}, pre_tokenized=False))
    assert not spanning.by_word
    assert not Embedder(table, _tiny_tokenizer(plain, pre_tokenized=True)).by_word
    # Without the cache the embedder still gives the tokenizer's ids.
    assert spanning.token_ids("a b") == spanning._tokenizer.encode("a b", add_special_tokens=False).ids
