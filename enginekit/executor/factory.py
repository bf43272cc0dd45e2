"""Builds the configured executor, and the model shape the KV cache is sized for."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from omegaconf import DictConfig

from enginekit.errors import ConfigError
from enginekit.executor.base import Executor
from enginekit.extras import require
from enginekit.spec.hardware import HardwareSpec
from enginekit.spec.kv import KVSpec, swap_space_num_blocks
from enginekit.spec.model import MODEL_PRESETS, ModelShape, model_preset

EXECUTORS = ("sim", "torch")


def model_shape(model: DictConfig) -> ModelShape:
    """The shape of ``model`` (the ``model`` config node): from ``model.path``'s config.json
    when set, else the preset ``model.name``; context capped by ``model.max_model_len``."""
    if model.get("path"):
        from enginekit.models.weights import read_hf_config

        path = Path(model.path)
        shape = ModelShape.from_hf_config(read_hf_config(path), name=path.name)
    else:
        shape = model_preset(model.name)
    max_len = model.max_model_len
    if max_len is None:
        return shape
    if max_len > shape.max_model_len:
        longer = longer_context_presets(shape, max_len)
        choices = " or ".join(f"model={name}" for name in longer)
        hint = f"; for this shape with a longer context choose {choices}" if longer else ""
        raise ConfigError(
            f"model.max_model_len={max_len} is more than {shape.name}'s own context of "
            f"{shape.max_model_len} tokens (model.max_model_len must be in [1, "
            f"{shape.max_model_len}]){hint}"
        )
    if max_len < 1:
        raise ConfigError(f"model.max_model_len must be >= 1, got {max_len}")
    return replace(shape, max_model_len=max_len)


def longer_context_presets(shape: ModelShape, max_len: int) -> list[str]:
    """The presets of ``shape``'s sizes (every field but the name and the context) whose
    own context holds ``max_len`` tokens: what a user who asked ``shape`` for more than
    its context may have meant (llama-3.1-8b for llama-3-8b at 128K)."""
    return [
        name
        for name, preset in MODEL_PRESETS.items()
        if preset.max_model_len >= max_len
        and replace(preset, name=shape.name, max_model_len=shape.max_model_len) == shape
    ]


def build_executor(
    cfg: DictConfig,
    shape: ModelShape,
    kv_spec: KVSpec,
    model_bits: int,
    swap_space_gib: float = 0.0,
) -> tuple[Executor, int]:
    """The executor ``cfg.executor`` names, and the number of KV blocks of the pool:
    ``cache.num_blocks`` if set, else the blocks ``cache.memory_gib`` holds if set, else
    what the device's memory holds. The host swap pool has ``swap_space_gib`` GiB (what
    the preemption plugin asks for: ``Preemption.swap_space_gib``), sized by the rule
    the cache manager's swap space follows (``swap_space_num_blocks``). Raises
    MissingExtraError (a ConfigError naming the extra) for ``executor=torch`` without the
    torch extra."""
    if cfg.executor not in EXECUTORS:
        raise ConfigError(
            f"executor={cfg.executor!r} is not available; choose: {', '.join(EXECUTORS)}"
        )
    if cfg.executor == "torch":
        require("executor=torch", extras=["torch"])  # one line naming the extra, from Python too
        from enginekit.executor.torch.factory import build_torch_executor

        return build_torch_executor(cfg, shape, kv_spec, swap_space_gib)
    from enginekit.executor.sim.executor import SimExecutor
    from enginekit.spec.hardware import hardware_preset, kv_pool_num_blocks

    hardware = hardware_preset(cfg.hardware.name)
    weight_bytes = shape.num_params * model_bits // 8
    num_blocks = cfg.cache.num_blocks
    if num_blocks is not None and num_blocks < 1:
        raise ConfigError(f"cache.num_blocks must be >= 1, got {num_blocks}")
    if num_blocks is None and cfg.cache.memory_gib is not None:
        _check_budget_fits(cfg.cache.memory_gib, hardware, shape, weight_bytes)
        num_blocks = _blocks_in_budget(cfg.cache.memory_gib, kv_spec)
    if num_blocks is None:
        num_blocks = kv_pool_num_blocks(hardware, cfg.hardware, shape, kv_spec, weight_bytes)
    executor = SimExecutor(
        shape,
        hardware,
        kv_spec,
        model_bits // 8,
        num_blocks=num_blocks,
        num_host_blocks=swap_space_num_blocks(swap_space_gib, kv_spec.bytes_per_block, num_blocks),
    )
    return executor, num_blocks


def _check_budget_fits(
    memory_gib: float, hardware: HardwareSpec, shape: ModelShape, weight_bytes: int
) -> None:
    """ConfigError, with the figures, when a KV pool of ``memory_gib`` GiB and the weights
    do not fit in the simulated device's memory together."""
    pool_bytes = memory_gib * (1 << 30)
    if pool_bytes + weight_bytes > hardware.hbm_capacity:
        gib = 1 << 30
        raise ConfigError(
            f"cache.memory_gib={memory_gib} does not fit on {hardware.name}: its "
            f"{hardware.hbm_capacity / gib:.1f} GiB hold {shape.name}'s weights "
            f"({weight_bytes / gib:.1f} GiB) and at most "
            f"{(hardware.hbm_capacity - weight_bytes) / gib:.1f} GiB of KV pool"
        )


def _blocks_in_budget(memory_gib: float, kv_spec: KVSpec) -> int:
    """Whole blocks in a KV budget of ``memory_gib`` GiB; ConfigError when none fits."""
    num_blocks = kv_spec.num_blocks_in(int(memory_gib * (1 << 30)))
    if num_blocks < 1:
        raise ConfigError(
            f"cache.memory_gib={memory_gib} holds no block of {kv_spec.bytes_per_block} bytes"
        )
    return num_blocks


def executor_eos_token_id(executor: Executor) -> int | None:
    """The EOS id the scheduler stops on: the model's for executors that run one (an
    ``eos_token_id`` attribute), None for the simulator."""
    eos = getattr(executor, "eos_token_id", None)
    return None if eos is None else int(eos)
