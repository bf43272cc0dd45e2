"""FP8Scales: where an fp8 KV pool's scales come from, and setting them.

An fp8 cache stores ``K / scale`` per (layer, K|V, kv head). A wrong scale is the classic
silent failure of fp8 KV caches (a scale left at 1.0 clips or flushes values and the
model produces garbage without any error), so the scales here always have a stated
origin, and the run's report prints it:

- ``checkpoint``: the model folder's ``k_scale`` / ``v_scale`` tensors;
- ``calibrated``: each layer's max-abs K and V per kv head on the first prefill the
  executor runs, times a margin, mapped to e4m3's largest finite value (448); or, where a
  KV tier loads blocks before any prefill ran, the scales those blocks were stored with
  (they travel in the tier's payload).

The pool's scales are NaN until set, and the write kernels refuse a layer whose scales
were never set.
"""

from __future__ import annotations

import torch

from enginekit.errors import ConfigError
from enginekit.kernels.layout import KVTensors
from enginekit.spec.quant import KVQuant

FP8_E4M3_MAX = 448.0
MIN_SCALE = 1e-12  # an all-zero calibration batch must not give a zero scale


def calibrated_scale(x: torch.Tensor, margin: float) -> torch.Tensor:
    """float32 [kv_heads]: the scale mapping ``margin`` × the max-abs of ``x`` [N,
    kv_heads, head_dim] per kv head to e4m3's largest finite value. Pure."""
    amax = x.detach().float().abs().amax(dim=(0, 2))
    return (amax * margin / FP8_E4M3_MAX).clamp(min=MIN_SCALE)


class FP8Scales:
    """Owns ``pool.fp8_scales`` [layers, 2, kv_heads]. ``source`` is the storage format's
    ``KVQuant.fp8_scales``: ``checkpoint`` needs ``checkpoint_scales``, ``calibrate``
    ignores them, ``auto`` uses them when present. Raises ConfigError for ``checkpoint``
    without them."""

    def __init__(
        self,
        pool: KVTensors,
        source: str,
        margin: float,
        checkpoint_scales: torch.Tensor | None,
    ) -> None:
        if pool.fp8_scales is None:
            raise ValueError("FP8Scales needs an fp8 pool")
        self.pool = pool
        self.scales = pool.fp8_scales
        self.margin = margin
        self.num_calibration_tokens = 0
        if checkpoint_scales is not None and source in ("auto", "checkpoint"):
            if tuple(checkpoint_scales.shape) != tuple(self.scales.shape):
                raise ConfigError(
                    f"checkpoint KV scales have shape {tuple(checkpoint_scales.shape)}, "
                    f"expected {tuple(self.scales.shape)} (layers, K|V, kv heads)"
                )
            if not bool(((checkpoint_scales > 0) & checkpoint_scales.isfinite()).all()):
                raise ConfigError("checkpoint KV scales must be positive and finite")
            pool.set_fp8_scales(None, checkpoint_scales)
            self.origin = "checkpoint"
        elif source == "checkpoint":
            raise ConfigError(
                "quantizer.scales=checkpoint, but the model folder has no k_scale/v_scale "
                "tensors: use quantizer.scales=calibrate (or auto)"
            )
        else:
            self.origin = "calibrated"

    @property
    def is_pending(self) -> bool:
        """Whether some layer still waits for its calibration."""
        return not all(self.pool.fp8_layers_set)

    def calibrate(self, layer: int, key: torch.Tensor, value: torch.Tensor) -> None:
        """Sets ``layer``'s scales from ``key``/``value`` [N, kv_heads, head_dim] unless
        already set (the first call per layer wins). Mutates the pool's scales."""
        if self.pool.fp8_layers_set[layer]:
            return
        scales = torch.stack(
            [calibrated_scale(key, self.margin), calibrated_scale(value, self.margin)]
        )
        self.pool.set_fp8_scales(layer, scales)
        if layer == 0:
            self.num_calibration_tokens = key.shape[0]

    @classmethod
    def of_pool(
        cls,
        pool: KVTensors,
        quant: KVQuant,
        checkpoint_scales: torch.Tensor | None,
    ) -> FP8Scales | None:
        """The scales of ``pool`` if it is an fp8 pool, else None, sourced as ``quant``
        says (``fp8_scales``, ``fp8_calibration_margin``; see the constructor)."""
        if pool.fp8_scales is None:
            return None
        return cls(pool, quant.fp8_scales, quant.fp8_calibration_margin, checkpoint_scales)

    def describe(self) -> str:
        if self.origin == "checkpoint":
            return "from the checkpoint"
        if self.is_pending:
            return "not calibrated yet (no prefill has run)"
        if self.num_calibration_tokens == 0:  # set by a KV tier's payload (PagedKVTensors)
            return "from the KV blocks a tier loaded before any prefill ran"
        return (
            f"calibrated on the first prefill ({self.num_calibration_tokens} tokens, "
            f"max-abs x {self.margin:g})"
        )
