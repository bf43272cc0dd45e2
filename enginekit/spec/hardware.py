"""Accelerator specs for the simulator, and the size of the KV pool they leave room for.

A ``HardwareSpec`` holds published peak figures plus two efficiencies: the share of peak
FLOP/s and of peak HBM bandwidth that a well-tuned serving engine actually reaches. The
simulator's roofline divides by ``peak × efficiency``, so the efficiencies are where a
calibration against a real GPU goes.

Defaults: ``compute_efficiency = 0.6`` (large bf16 GEMMs reach ~70-80 % of the dense peak,
but a serving step also runs attention, norms and small GEMMs) and
``memory_efficiency = 0.8`` (streaming reads reach ~80-90 % of the HBM peak).
``pcie_efficiency = 0.8``: host<->device copies of KV blocks reach ~50 GB/s of a Gen5
x16 link's 64 GB/s per direction.
"""

from __future__ import annotations

from dataclasses import dataclass

from enginekit.config import HardwareConfig
from enginekit.errors import ConfigError
from enginekit.spec.kv import KVSpec
from enginekit.spec.model import ModelShape

_GIB = 1 << 30
_MIB = 1 << 20


@dataclass(frozen=True)
class HardwareSpec:
    """One accelerator, as the roofline cost model sees it.

    ``peak_flops``: dense bf16 FLOP/s (no sparsity). ``hbm_bandwidth``: bytes/s.
    ``hbm_capacity``: device memory in bytes, as the driver reports it (the total a framework
    sizes its pools from). ``pcie_bandwidth``: host<->device bytes/s in one direction.
    The efficiencies are shares of those peaks, in (0, 1].
    """

    name: str
    peak_flops: float
    hbm_bandwidth: float
    hbm_capacity: int
    pcie_bandwidth: float
    compute_efficiency: float = 0.6
    memory_efficiency: float = 0.8
    pcie_efficiency: float = 0.8
    # Fixed cost of one block's host<->device copy (a copy call per block), which is why
    # swapping small blocks loses to recomputing them (PagedAttention, section 7.3).
    pcie_latency_s: float = 10e-6
    # Host memory one accelerator may use (KV tiers in host memory are checked against
    # it): a DGX H100 / H200 node's 2 TiB shared by its 8 GPUs.
    host_memory: int = 256 * _GIB

    def block_transfer_s(self, num_bytes: int) -> float:
        """One block of ``num_bytes`` over PCIe, one direction, latency included."""
        return self.pcie_latency_s + num_bytes / self.effective_pcie_bandwidth

    def __post_init__(self) -> None:
        for key in ("peak_flops", "hbm_bandwidth", "hbm_capacity", "pcie_bandwidth"):
            if getattr(self, key) <= 0:
                raise ConfigError(f"hardware.{key} must be > 0, got {getattr(self, key)}")
        for key in ("compute_efficiency", "memory_efficiency", "pcie_efficiency"):
            value = getattr(self, key)
            if not 0.0 < value <= 1.0:
                raise ConfigError(f"hardware.{key} must be in (0, 1], got {value}")

    @property
    def effective_flops(self) -> float:
        """FLOP/s the roofline uses: peak × compute_efficiency."""
        return self.peak_flops * self.compute_efficiency

    @property
    def effective_bandwidth(self) -> float:
        """HBM bytes/s the roofline uses: peak × memory_efficiency."""
        return self.hbm_bandwidth * self.memory_efficiency

    @property
    def effective_pcie_bandwidth(self) -> float:
        """Host<->device bytes/s one direction: peak × pcie_efficiency."""
        return self.pcie_bandwidth * self.pcie_efficiency


HARDWARE_PRESETS: dict[str, HardwareSpec] = {
    spec.name: spec
    for spec in (
        # H100 SXM5 80 GB: 989 TFLOP/s dense bf16, HBM3 3.35 TB/s; the driver reports
        # 81559 MiB. PCIe Gen5 x16: 64 GB/s per direction.
        HardwareSpec(
            name="h100-sxm",
            peak_flops=989e12,
            hbm_bandwidth=3.35e12,
            hbm_capacity=81559 * _MIB,
            pcie_bandwidth=64e9,
        ),
        # H200 141 GB: the H100's compute with HBM3e at 4.8 TB/s; the driver reports
        # 143771 MiB. PCIe Gen5 x16.
        HardwareSpec(
            name="h200",
            peak_flops=989e12,
            hbm_bandwidth=4.8e12,
            hbm_capacity=143771 * _MIB,
            pcie_bandwidth=64e9,
        ),
    )
}


def hardware_preset(name: str) -> HardwareSpec:
    """The preset called ``name``; ConfigError listing the presets if there is none."""
    try:
        return HARDWARE_PRESETS[name]
    except KeyError:
        known = ", ".join(sorted(HARDWARE_PRESETS))
        raise ConfigError(
            f"hardware.name={name!r} is not a known accelerator; known: {known}"
        ) from None


def kv_pool_num_blocks(
    hw: HardwareSpec,
    hw_config: HardwareConfig,
    shape: ModelShape,
    kv_spec: KVSpec,
    weight_bytes: int,
) -> int:
    """Blocks the KV pool gets on one device.

    ``(hbm_capacity × memory_utilization − weight_bytes − reserve_gib GiB) // bytes_per_block``.
    Raises ConfigError with every figure when that leaves no whole block (for example a
    70B model in bf16 on one 80 GB GPU), or when memory_utilization is not in (0, 1] or
    reserve_gib is negative. Pure: reads its arguments only.
    """
    utilization = hw_config.memory_utilization
    if not 0.0 < utilization <= 1.0:
        raise ConfigError(f"hardware.memory_utilization must be in (0, 1], got {utilization}")
    if hw_config.reserve_gib < 0:
        raise ConfigError(f"hardware.reserve_gib must be >= 0, got {hw_config.reserve_gib}")
    usable = int(hw.hbm_capacity * utilization)
    reserve = int(hw_config.reserve_gib * _GIB)
    free = usable - weight_bytes - reserve
    num_blocks = free // kv_spec.bytes_per_block if free > 0 else 0
    if num_blocks <= 0:
        raise ConfigError(
            f"no room for a KV cache: {hw.name} has {hw.hbm_capacity / _GIB:.1f} GiB, "
            f"× memory_utilization {utilization} = {usable / _GIB:.1f} GiB; "
            f"{shape.name} weights take {weight_bytes / _GIB:.1f} GiB and "
            f"reserve_gib {hw_config.reserve_gib} GiB, leaving {free / _GIB:.2f} GiB "
            f"for blocks of {kv_spec.bytes_per_block / _MIB:.2f} MiB. Use a smaller model, "
            f"a larger device, or raise hardware.memory_utilization"
        )
    return num_blocks
