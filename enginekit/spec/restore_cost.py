"""RestoreCost: what it costs to bring a preempted sequence back, by swap or by recompute.

Preemption plugins weigh these when choosing a victim and how to preempt it. The figures
come from the hardware spec and model shape, the same numbers the simulator uses.
"""

from __future__ import annotations

from dataclasses import dataclass

from enginekit.spec.hardware import HardwareSpec
from enginekit.spec.kv import KVSpec
from enginekit.spec.model import ModelShape


@dataclass(frozen=True)
class RestoreCost:
    swap_s_per_block: float  # one block over PCIe, one direction, latency included
    prefill_s_per_token: float  # matmul FLOPs of one token at the effective FLOP rate
    attention_s_per_pair: float  # one (query, key) pair over all layers and heads

    @classmethod
    def of(cls, hardware: HardwareSpec, shape: ModelShape, kv_spec: KVSpec) -> RestoreCost:
        flops = hardware.effective_flops
        return cls(
            swap_s_per_block=hardware.block_transfer_s(kv_spec.bytes_per_block),
            prefill_s_per_token=2 * shape.num_matmul_params_per_token / flops,
            attention_s_per_pair=4 * shape.num_layers * shape.num_heads * shape.head_dim / flops,
        )

    def swap_s(self, num_blocks: int) -> float:
        """Swapping out and back in: two transfers of every block."""
        return 2 * num_blocks * self.swap_s_per_block

    def recompute_s(self, num_tokens: int) -> float:
        """Prefilling ``num_tokens`` again from nothing (compute-bound)."""
        pairs = num_tokens * (num_tokens + 1) // 2
        return num_tokens * self.prefill_s_per_token + pairs * self.attention_s_per_pair
