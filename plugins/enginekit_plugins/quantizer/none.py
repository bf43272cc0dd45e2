"""``none``: the cache stores K and V in the model's own dtype."""

from __future__ import annotations

from dataclasses import dataclass

from enginekit.config import QuantizerConfig
from enginekit.interfaces import KVQuant, ModelShape, Quantizer


@dataclass
class NoQuantizerConfig(QuantizerConfig):
    name: str = "none"


class NoQuantizer(Quantizer):
    Config = NoQuantizerConfig

    def kv_quant(self, shape: ModelShape, block_size: int) -> KVQuant:
        return KVQuant()
