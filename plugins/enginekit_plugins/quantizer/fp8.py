"""``fp8``: K and V stored as float8 e4m3 with one scale per (layer, K|V, kv head).

Half the bytes of a 16-bit cache. The scales come from the checkpoint when it has them
(``self_attn.k_scale`` / ``v_scale``, per layer or per kv head), otherwise from the
max-abs of each layer's K and V on the first prefill, times ``calibration_margin``
(e4m3 keeps about two significant digits across its whole range, so headroom is cheap;
values beyond the range saturate). A scale is never silently 1.0: the run's report says
where the scales came from, and ``scales=checkpoint`` refuses a folder without them.
"""

from __future__ import annotations

from dataclasses import dataclass

from enginekit.config import QuantizerConfig
from enginekit.errors import ConfigError
from enginekit.interfaces import FP8_SCALE_SOURCES, KVQuant, ModelShape, Quantizer


@dataclass
class FP8QuantizerConfig(QuantizerConfig):
    name: str = "fp8"
    scales: str = "auto"  # auto | checkpoint | calibrate
    calibration_margin: float = 2.0


class FP8Quantizer(Quantizer):
    Config = FP8QuantizerConfig
    config: FP8QuantizerConfig

    def __init__(self, config: FP8QuantizerConfig) -> None:
        super().__init__(config)
        if config.scales not in FP8_SCALE_SOURCES:
            raise ConfigError(
                f"quantizer.scales={config.scales!r}: choose {', '.join(FP8_SCALE_SOURCES)}"
            )
        if not config.calibration_margin >= 1.0:
            raise ConfigError(
                f"quantizer.calibration_margin must be >= 1, got {config.calibration_margin}"
            )

    def kv_quant(self, shape: ModelShape, block_size: int) -> KVQuant:
        return KVQuant(
            "fp8",
            fp8_scales=self.config.scales,
            fp8_calibration_margin=self.config.calibration_margin,
        )
