"""``none``: the cache stores K and V in the model's own dtype."""

from __future__ import annotations

from dataclasses import dataclass

from enginekit.config import QuantizerConfig
from enginekit.interfaces import Quantizer
from enginekit.models.shapes import ModelShape


@dataclass
class NoQuantizerConfig(QuantizerConfig):
    name: str = "none"


class NoQuantizer(Quantizer):
    Config = NoQuantizerConfig

    def bits_per_element(self, model_bits: int) -> int:
        return model_bits

    def scale_bytes_per_token(self, shape: ModelShape) -> int:
        return 0
