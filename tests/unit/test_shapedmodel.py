"""The K-quant and Q8_0 encoders of tests.shapedmodel against gguf's own decoders."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType
from gguf.quants import dequantize

from tests.shapedmodel import quantize


@pytest.mark.parametrize(("kind", "tolerance"), [("Q4_K", 0.12), ("Q6_K", 0.04), ("Q8_0", 0.01)])
def test_encoded_blocks_decode_to_the_weights(kind: str, tolerance: float) -> None:
    rng = np.random.default_rng(3)
    weights = rng.standard_normal((16, 1024)).astype(np.float32) * 0.02
    weights[5] = 0.0
    weights[6, 300] = 1.0  # a row that steers: one large weight among small ones
    decoded = dequantize(quantize(weights, kind), GGMLQuantizationType[kind])
    assert decoded.shape == weights.shape
    assert np.all(decoded[5] == 0.0)
    assert decoded[6, 300] == pytest.approx(1.0, abs=0.01)
    rms_error = np.sqrt(np.mean((decoded - weights) ** 2)) / np.sqrt(np.mean(weights**2))
    assert rms_error < tolerance
