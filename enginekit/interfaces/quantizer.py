"""Quantizer: how the cache stores K and V."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import ClassVar

from enginekit.config import QuantizerConfig
from enginekit.interfaces.base import Plugin
from enginekit.spec.model import ModelShape
from enginekit.spec.quant import KVQuant


class Quantizer(Plugin, ABC):
    """Chooses the cache's storage format. The bytes it implies are computed by
    ``KVSpec`` (both executors); the torch executor stores and reads that format with the
    kernels of ``enginekit.kernels`` (kinds ``none``, ``fp8``, ``int4``)."""

    Config: ClassVar[type[QuantizerConfig]] = QuantizerConfig

    def __init__(self, config: QuantizerConfig) -> None:
        self.config = config

    @abstractmethod
    def kv_quant(self, shape: ModelShape, block_size: int) -> KVQuant:
        """The storage format for ``shape`` with blocks of ``block_size`` tokens, with
        every knob of this quantizer that the executors need (fp8: where the scales come
        from). Pure.
        Raises ConfigError (naming the ``quantizer.*`` key) when the format cannot hold
        this shape."""
