"""``int4``: two 4-bit codes per byte, asymmetric, with float16 scales and zero points.

Keys are quantized per channel and values per token (KIVI's finding: key outliers sit
in fixed channels, value errors must stay per token). ``group_size`` values share one
(scale, zero) pair: for keys, that many consecutive tokens of one channel (capped at the
block, so a group never straddles blocks); for values, that many consecutive channels
of one token (capped at the head). With 16-bit scale and zero, a group of G costs
4 + 32/G bits per value: 4.5 at G = 64, against 16 unquantized.

A key group being filled (the last block of a decoding sequence) is re-quantized
whenever a token joins it, over the group's tokens so far (dequantized) and the new
ones. Each re-rounding can add half a step, so a group filled one token at a time ends
up to about two steps of its final grid from the group quantized at once (measured:
at most 2.0 at group 16, mean under 0.5); full blocks written by one prefill chunk are
quantized once.
"""

from __future__ import annotations

from dataclasses import dataclass

from enginekit.config import QuantizerConfig
from enginekit.interfaces import KVQuant, ModelShape, Quantizer


@dataclass
class Int4QuantizerConfig(QuantizerConfig):
    name: str = "int4"
    group_size: int = 64


class Int4Quantizer(Quantizer):
    Config = Int4QuantizerConfig
    config: Int4QuantizerConfig

    def kv_quant(self, shape: ModelShape, block_size: int) -> KVQuant:
        return KVQuant.int4(self.config.group_size, block_size, shape.head_dim)
