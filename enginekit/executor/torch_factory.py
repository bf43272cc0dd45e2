"""Builds the torch executor from the config: model, device, kernels, pool sizes.

Kept apart from ``factory`` so that the simulator never imports torch.
"""

from __future__ import annotations

from dataclasses import replace

import torch
from omegaconf import DictConfig

from enginekit.errors import ConfigError
from enginekit.executor.model_runner import TorchExecutor
from enginekit.interfaces.quantizer import Quantizer
from enginekit.kernels.layout import TORCH_DTYPES
from enginekit.kernels.ops import PagedOps, make_ops
from enginekit.kv.spec import KVSpec
from enginekit.models.llama import LlamaModel
from enginekit.models.shapes import ModelShape

CPU_DEFAULT_POOL_GIB = 1.0
_GIB = 1 << 30


def _device(name: str) -> torch.device:
    try:
        device = torch.device(name)
    except RuntimeError:
        raise ConfigError(f"device={name!r} is not a torch device") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"device={name!r}: CUDA is not available on this machine")
    if device.type not in ("cpu", "cuda"):
        raise ConfigError(f"device={name!r}: only cpu and cuda are supported")
    return device


def _ops(kind: str, device: torch.device) -> PagedOps:
    if kind == "auto":
        kind = "triton" if device.type == "cuda" else "reference"
    if kind not in ("triton", "reference"):
        raise ConfigError(f"kernels={kind!r}: choose auto, triton or reference")
    return make_ops(kind)


def load_model(cfg: DictConfig, shape: ModelShape, device: torch.device) -> LlamaModel:
    """``model.path``'s weights, else the tiny model; the arch takes ``shape`` (which may
    cap the context)."""
    dtype = TORCH_DTYPES[cfg.model.dtype]
    if cfg.model.path:
        from enginekit.models.weights import load_hf_folder

        arch, weights = load_hf_folder(cfg.model.path, dtype, device)
    elif cfg.model.name == "tiny":
        from enginekit.models.tiny import load_tiny

        arch, weights = load_tiny(cfg.model.seed, dtype, device)
    else:
        raise ConfigError(
            f"executor=torch needs weights: set model.path=<Hugging Face folder> or "
            f"model=tiny (model {cfg.model.name!r} is a shape without weights)"
        )
    return LlamaModel(replace(arch, shape=shape), weights, dtype, device)


def _num_blocks(cfg: DictConfig, device: torch.device, block_bytes: int) -> int:
    num_blocks = cfg.cache.num_blocks
    if num_blocks is not None:
        if num_blocks < 1:
            raise ConfigError(f"cache.num_blocks must be >= 1, got {num_blocks}")
        return int(num_blocks)
    if cfg.cache.memory_gib is not None:
        budget = cfg.cache.memory_gib * _GIB
    elif device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        budget = free * cfg.hardware.memory_utilization - cfg.hardware.reserve_gib * _GIB
    else:
        budget = CPU_DEFAULT_POOL_GIB * _GIB
    num_blocks = int(budget // block_bytes)
    if num_blocks < 1:
        raise ConfigError(f"the KV pool budget of {budget / _GIB:.3f} GiB holds no block")
    return num_blocks


def _num_host_blocks(cfg: DictConfig, block_bytes: int) -> int:
    gib = cfg.cache.swap_gib
    if gib is None:
        gib = cfg.preemption.get("swap_space_gib") or 0.0
    if gib < 0:
        raise ConfigError(f"cache.swap_gib must be >= 0, got {gib}")
    return int(gib * _GIB) // block_bytes


def build_torch_executor(
    cfg: DictConfig,
    shape: ModelShape,
    kv_spec: KVSpec,
    quantizer: Quantizer | None = None,
) -> tuple[TorchExecutor, int]:
    """The torch executor and its number of device KV blocks, in ``kv_spec.quant``'s
    storage format. Raises ConfigError for a missing device or missing weights."""
    device = _device(cfg.device)
    if cfg.threads is not None:
        if cfg.threads < 1:
            raise ConfigError(f"threads must be >= 1, got {cfg.threads}")
        torch.set_num_threads(cfg.threads)
    ops = _ops(cfg.kernels, device)
    model = load_model(cfg, shape, device)
    block_bytes = kv_spec.bytes_per_block  # made for the model dtype: what a pool allocates
    num_blocks = _num_blocks(cfg, device, block_bytes)
    executor = TorchExecutor(
        model,
        kv_spec,
        num_blocks,
        ops,
        num_host_blocks=_num_host_blocks(cfg, block_bytes),
        base_seed=cfg.model.seed,
        fp8_scale_source=quantizer.scale_source() if quantizer else "auto",
        fp8_margin=quantizer.calibration_margin() if quantizer else 2.0,
    )
    return executor, num_blocks
