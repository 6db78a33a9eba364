"""The sentence embedder of the semantic stages: WordLlama's static token vectors, loaded offline.

``wordllama`` ships its 256-dimension ``l2_supercat`` weights and its tokenizer
inside the wheel. Its own ``WordLlama.load()`` looks for the tokenizer under
``tokenizer/`` while the wheel has it under ``tokenizers/``, and then tries to
download it; Laya never lets it: it loads with ``cache_dir`` set to the
package's own folder and ``disable_download=True``.

A sentence's vector is the sum of its tokens' vectors, scaled to unit length
(what ``WordLlamaInference.embed(norm=True)`` computes, without its padding and
batching, which cost more than the sum for one sentence). A dot product of two
vectors is their cosine similarity.

Tokenizing is most of an embedding's cost (a call into the tokenizer takes
about 25 µs for a short sentence), and a router sees the same words again and
again. WordLlama's tokenizer is SentencePiece-style BPE: every space becomes
``▁`` and no token has a ``▁`` after its first character, so no token spans two
words and a sentence's tokens are its words' tokens, one word after the other.
The embedder therefore keeps each word's token ids (``word_cache`` words at
most) and tokenizes only words it has not seen. It checks that property of the
tokenizer when it loads and tokenizes whole texts when it does not hold, or
when a text has two spaces in a row, a space at either end, a ``▁`` of its own
(the tokenizer would join it to the space before it), or one of the tokenizer's
special tokens (``<s>``), which the tokenizer cuts out first.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from types import ModuleType
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from laya.errors import LayaError

_scan: ModuleType | None
try:
    from laya.semantic import _scan  # the C kernel (laya/semantic/_scan.c): its row sum
except ImportError:  # built without a C compiler: numpy sums the rows
    _scan = None

__all__ = ["Embedder", "EmbedderUnavailable", "TextEmbedder", "Vector", "load_embedder"]

log = logging.getLogger("laya.semantic.embedder")

Vector = npt.NDArray[np.float32]


class EmbedderUnavailable(LayaError):
    """The embedding model could not be loaded: the semantic stages are off, exact routing goes on."""

    code = "embedder_unavailable"


class TextEmbedder(Protocol):
    """What the semantic stages need: unit vectors for texts."""

    dim: int

    def embed(self, text: str) -> Vector: ...

    def embed_many(self, texts: list[str]) -> npt.NDArray[np.float32]: ...


class Embedder:
    """WordLlama's token table and tokenizer, summed per sentence."""

    def __init__(self, table: npt.NDArray[np.float32], tokenizer: Any, *, word_cache: int = 50_000) -> None:
        self.table = np.ascontiguousarray(table, dtype=np.float32)
        self.dim = int(self.table.shape[1])
        self._tokenizer = tokenizer
        if tokenizer.get_vocab_size() > self.table.shape[0]:
            raise EmbedderUnavailable(f"the tokenizer knows {tokenizer.get_vocab_size()} tokens but the table "
                                      f"holds {self.table.shape[0]}: the two files do not belong together")
        self.by_word = _splits_at_spaces(tokenizer)
        """Whether a text's tokens are its words' tokens in order (the cache below is used only then)."""
        self._specials = [token.content for token in tokenizer.get_added_tokens_decoder().values()]
        self._words: dict[str, list[int]] = {}
        self._word_cache = word_cache
        self._digits = _digit_ids(tokenizer) if self.by_word else None
        """``[▁, 0, 1, … 9]``'s ids where the tokenizer spells a number digit by digit (checked here): a number
        is then read without the tokenizer and kept out of the word cache, which unique ids and amounts
        would otherwise churn."""

    def token_ids(self, text: str) -> list[int]:
        """The tokenizer's ids for ``text``, from the word cache where that gives the same ids."""
        if (not self.by_word or "  " in text or text.startswith(" ") or text.endswith(" ") or "\u2581" in text
                or any(special in text for special in self._specials)):
            return list(self._tokenizer.encode(text, add_special_tokens=False).ids)
        words = self._words
        ids: list[int] = []
        digits = self._digits
        for word in text.split(" "):
            known = words.get(word)
            if known is None and digits is not None and word.isascii() and word.isdigit():
                ids.append(digits[0])
                ids += [digits[1 + ord(c) - 48] for c in word]
                continue
            if known is None:
                known = self._tokenizer.encode(word, add_special_tokens=False).ids if word else []
                if len(word) <= 64:  # a bound on the size of an entry; the cache bounds their number
                    if len(words) >= self._word_cache:
                        words.clear()  # crude, and rare: the words a router sees repeat
                    words[word] = known
            ids += known
        return ids

    def embed(self, text: str) -> Vector:
        ids = self.token_ids(text)
        if not ids:
            return np.zeros(self.dim, dtype=np.float32)
        if _scan is not None and _scan.supported():  # one call (numpy's three cost more than the sum)
            out: Vector = np.empty(self.dim, dtype=np.float32)
            _scan.embed(self.table, np.asarray(ids, dtype=np.int32), out)
            return out
        return self.embed_numpy(ids)

    def embed_numpy(self, ids: list[int]) -> Vector:
        """:meth:`embed`'s sum of token rows in numpy: where the C kernel is not built, and in its tests."""
        vector: Vector = self.table.take(ids, axis=0).sum(axis=0)
        norm = float(vector @ vector) ** 0.5
        return vector / norm if norm > 0 else vector

    def embed_many(self, texts: list[str]) -> npt.NDArray[np.float32]:
        out = np.empty((len(texts), self.dim), dtype=np.float32)
        for i, text in enumerate(texts):
            out[i] = self.embed(text)
        return out


def _digit_ids(tokenizer: Any) -> list[int] | None:
    """The ids of "▁" and of "0" … "9" when the tokenizer spells every number as "▁" and then its digits one
    by one (Llama's SentencePiece does); ``None`` when any sample says otherwise."""
    spelled = tokenizer.encode("0123456789", add_special_tokens=False).ids
    if len(spelled) != 11:
        return None
    for sample in (*"0123456789", "42", "007", "90210", "31415926535897932384"):
        if tokenizer.encode(sample, add_special_tokens=False).ids != [spelled[0]] + [spelled[1 + int(c)] for c in sample]:
            return None
    return list(spelled)


def _splits_at_spaces(tokenizer: Any) -> bool:
    """True when ``tokenizer`` encodes a text as its space-separated words' encodings, one after the other.

    That holds for SentencePiece-style BPE whose only normalisation is "prepend
    ``▁``, spaces to ``▁``", with no pre-tokenizer, and whose vocabulary has no
    token with ``▁`` past its first character, except runs of ``▁`` alone:
    only two spaces in a row make those, and such texts (and texts that start
    or end with a space) are tokenized whole. Anything else, and the embedder
    tokenizes every text whole.
    """
    import json

    config = json.loads(tokenizer.to_str())
    steps = (config.get("normalizer") or {}).get("normalizers", [])
    expected = [{"type": "Prepend", "prepend": "\u2581"},
                {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"}]
    if config.get("pre_tokenizer") is not None or steps != expected:
        return False
    return not any("\u2581" in token[1:] and set(token) != {"\u2581"} for token in tokenizer.get_vocab())


def load_embedder(package_dir: Path | None = None) -> Embedder:
    """Load WordLlama from its own package folder, never from the network.

    Raises :class:`EmbedderUnavailable` with the reason (package missing,
    files missing, a download it would have needed); callers turn the semantic
    stages off and go on.
    """
    started = time.perf_counter()
    try:
        import wordllama
        from tokenizers import Tokenizer
        from wordllama import WordLlama
    except ImportError as exc:
        raise EmbedderUnavailable(f"the wordllama package is not installed ({exc}); "
                                  "`pip install wordllama` turns the semantic stages on") from None
    folder = package_dir if package_dir is not None else Path(wordllama.__file__).resolve().parent
    try:
        model = WordLlama.load(cache_dir=folder, disable_download=True)
    except Exception as exc:  # noqa: BLE001 - any failure of a third-party loader only turns the stage off
        raise EmbedderUnavailable(f"WordLlama could not load from {folder} without a download: "
                                  f"{type(exc).__name__}: {exc}") from None
    # A copy without padding: the model's own tokenizer pads every batch to its longest text.
    tokenizer = Tokenizer.from_str(model.tokenizer.to_str())
    tokenizer.no_padding()
    tokenizer.no_truncation()
    embedder = Embedder(model.embedding, tokenizer)
    log.debug("WordLlama loaded from %s in %.2f s (%d dimensions)", folder, time.perf_counter() - started,
              embedder.dim)
    return embedder
