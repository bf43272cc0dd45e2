"""How the Triton attention kernels are launched: tile sizes, warps and pipeline stages
per model dtype, head size and cache kind (``LaunchConfig``), and how many programs a
decode step splits each sequence's keys across (``num_decode_splits``).

The configurations are chosen so that every one compiles for sm_90 without register
spills (head_dim 64/128, GQA 1/4/8, pages 16/32/64, every cache kind, half precision and
float32). Decode splits until the GPU has ``PROGRAMS_PER_SM`` programs per SM, keeping
each split at least ``MIN_SPLIT_TOKENS`` keys. Plain Python: no Triton needed.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

MIN_SPLIT_TOKENS = 256  # a decode split covers at least this many keys
PROGRAMS_PER_SM = 4  # decode splits until the grid has this many programs per SM
DEFAULT_NUM_SMS = 132  # an H100/H200, for split choices off a GPU (the interpreter)


class LaunchConfig(NamedTuple):
    """How an attention kernel is launched: keys per tile (``block_n``), query rows per
    program (``rows``: prefill tokens × padded group heads, at least), warps, stages."""

    block_n: int
    rows: int
    num_warps: int
    num_stages: int


def decode_config(dtype: torch.dtype, head_dim: int, kind: str) -> LaunchConfig:
    """Half-precision models: 64-key tiles, 4 warps (8 for int4's dequantization), 3
    stages at head_dim <= 64, else 2. float32 models (IEEE dots without tensor cores):
    32-key tiles on 8 warps, 16 for a quantized cache. ``rows``: the group's heads are
    padded to at least this many."""
    if dtype == torch.float32:
        return LaunchConfig(32 if kind == "none" else 16, 16, 8, 2)
    return LaunchConfig(64, 16, 8 if kind == "int4" else 4, 3 if head_dim <= 64 else 2)


def prefill_config(dtype: torch.dtype, head_dim: int, kind: str) -> LaunchConfig:
    """Half-precision models: 64 query rows × 64-key tiles, 8 warps above head_dim 64;
    float32 models 32 × 32 on 8 warps, 16 rows and one stage for a quantized cache."""
    if dtype == torch.float32:
        return LaunchConfig(32, 32, 8, 2) if kind == "none" else LaunchConfig(32, 16, 8, 1)
    return LaunchConfig(64, 64, 8 if head_dim > 64 else 4, 2)


def prefill_query_tile(config: LaunchConfig, num_heads: int, num_kv_heads: int) -> int:
    """Query tokens per prefill tile: ``config.rows`` rows of (token, head of the group
    padded to a power of 2), at least one token."""
    group_pad = 1 << (num_heads // num_kv_heads - 1).bit_length()
    return max(1, config.rows // group_pad)


def num_decode_splits(
    num_seqs: int, num_kv_heads: int, max_keys: int, num_sms: int = DEFAULT_NUM_SMS
) -> int:
    """Splits per (sequence, kv head) for a decode step: enough for PROGRAMS_PER_SM
    programs on each of ``num_sms`` SMs, no more than leaves every split at least
    MIN_SPLIT_TOKENS of the ``max_keys`` any sequence attends, and at least 1."""
    wanted = -(-PROGRAMS_PER_SM * num_sms // max(num_seqs * num_kv_heads, 1))
    return max(1, min(wanted, max_keys // MIN_SPLIT_TOKENS))


def device_num_sms(device: torch.device) -> int:
    """The device's SM count; DEFAULT_NUM_SMS off a GPU."""
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return DEFAULT_NUM_SMS
