"""Quantizer: how the cache stores K and V, and where fp8's scales come from."""

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
        """The storage format for ``shape`` with blocks of ``block_size`` tokens. Pure.
        Raises ConfigError (naming the ``quantizer.*`` key) when the format cannot hold
        this shape."""

    def scale_source(self) -> str:
        """Where fp8 scales come from: ``checkpoint`` (the model folder's ``k_scale`` /
        ``v_scale``; an error if absent), ``calibrate`` (max-abs of the first prefill
        with a margin) or ``auto`` (checkpoint when present, else calibrate). Irrelevant
        to formats without global scales."""
        return "auto"

    def calibration_margin(self) -> float:
        """Factor applied to the calibrated max-abs before it becomes the fp8 range."""
        return 2.0
