"""Quantizer: what the cache stores per element, and the scales that come with it."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import ClassVar

from enginekit.config import QuantizerConfig
from enginekit.interfaces.base import Plugin
from enginekit.models.shapes import ModelShape


class Quantizer(Plugin, ABC):
    Config: ClassVar[type[QuantizerConfig]] = QuantizerConfig

    def __init__(self, config: QuantizerConfig) -> None:
        self.config = config

    @abstractmethod
    def bits_per_element(self, model_bits: int) -> int:
        """Bits of one stored K or V element, given the model's activation width. Pure."""

    @abstractmethod
    def scale_bytes_per_token(self, shape: ModelShape) -> int:
        """Bytes of scales (and zero points) stored per token, over all layers. Pure."""
