"""Builds the torch executor from the config: model, device, kernels, pool sizes.

Kept apart from ``factory`` so that the simulator never imports torch.
"""

from __future__ import annotations

import os
from dataclasses import replace
from typing import NamedTuple

import torch
from omegaconf import DictConfig

from enginekit.errors import ConfigError
from enginekit.executor.torch.executor import TorchExecutor
from enginekit.kernels.layout import TORCH_DTYPES
from enginekit.kernels.ops import REFERENCE_OPS, PagedOps
from enginekit.kernels.triton.runtime import env_flag
from enginekit.models.llama import LlamaModel
from enginekit.spec.kv import KVSpec, swap_space_num_blocks
from enginekit.spec.model import ModelShape, resolve_dtype

CPU_POOL_CAP_GIB = 1.0  # a CPU pool sized by default holds at most this
CPU_POOL_MEMORY_SHARE = 0.5  # ... and at most this share of the memory available
# Below this hidden size a CPU forward runs on one thread when ``threads=auto``: its
# matmuls are too small to split, and on busy cores the threads' spin-waits cost far more
# than they save (two shared cores: a [16, 896] x [896, 3584] matmul 3x slower on two
# threads than on one, [16, 64] x [64, 256] 15x; the tiny model's 32-request run 8x).
SINGLE_THREAD_MAX_HIDDEN = 2048
_GIB = 1 << 30


class PoolSize(NamedTuple):
    """The device pool's blocks and the rule that chose them (for the run's report)."""

    num_blocks: int
    sized_by: str


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
    if kind == "triton" and device.type != "cuda" and not env_flag("TRITON_INTERPRET"):
        raise ConfigError(
            f"kernels=triton needs a CUDA device (device={device}); on a CPU use "
            "kernels=reference (or auto), or set TRITON_INTERPRET=1 to interpret the kernels"
        )
    if kind == "reference":
        return REFERENCE_OPS
    try:
        from enginekit.kernels.triton.ops import TRITON_OPS
    except ImportError as exc:
        raise ConfigError(f"kernels=triton needs the triton package: {exc}") from None
    return TRITON_OPS


def set_threads(threads: int | str, shape: ModelShape, device: torch.device) -> str:
    """Sets torch's intra-op CPU threads (for the whole process) from ``threads``: a
    number, or ``auto``: one thread on a CPU for models narrower than
    ``SINGLE_THREAD_MAX_HIDDEN``, else torch's setting as it is (by default
    ``OMP_NUM_THREADS`` or the cores). Returns what the report says about it.
    ConfigError for another value."""
    if threads == "auto":
        if device.type == "cpu" and shape.hidden_size < SINGLE_THREAD_MAX_HIDDEN:
            torch.set_num_threads(1)
            return f"1 (auto: hidden size {shape.hidden_size} < {SINGLE_THREAD_MAX_HIDDEN})"
        return f"{torch.get_num_threads()} (auto: torch's setting)"
    try:
        count = int(threads)
    except (TypeError, ValueError):
        count = 0
    if count < 1 or str(count) != str(threads).strip():
        raise ConfigError(f"threads must be auto or an integer >= 1, got {threads!r}")
    torch.set_num_threads(count)
    return str(count)


def load_model(cfg: DictConfig, shape: ModelShape, device: torch.device) -> LlamaModel:
    """``model.path``'s weights, else the tiny model; the arch takes ``shape`` (which may
    cap the context)."""
    dtype = TORCH_DTYPES[resolve_dtype(cfg.model.dtype, shape)]
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


def available_memory_bytes(device: torch.device) -> int | None:
    """Memory a new allocation on ``device`` can take now: CUDA's free memory, or the
    host's available memory (MemAvailable, else free pages), at most what the process's
    cgroup (v2 or v1) has left; None when unknown."""
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    available = _meminfo_available()
    limit = _cgroup_room()
    if available is None or limit is None:
        return available if limit is None else limit
    return min(available, limit)


def _meminfo_available() -> int | None:
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, AttributeError):
        return None


def _cgroup_room() -> int | None:
    """The cgroup's memory limit minus its usage; None without a limit."""
    for limit_file, usage_file in (
        ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
        (
            "/sys/fs/cgroup/memory/memory.limit_in_bytes",
            "/sys/fs/cgroup/memory/memory.usage_in_bytes",
        ),
    ):
        try:
            with open(limit_file, encoding="ascii") as f:
                limit = f.read().strip()
            with open(usage_file, encoding="ascii") as f:
                usage = int(f.read().strip())
        except (OSError, ValueError):
            continue
        if limit == "max" or int(limit) >= 1 << 60:
            return None
        return max(int(limit) - usage, 0)
    return None


def _check_fits(num_bytes: int, what: str, device: torch.device) -> None:
    available = available_memory_bytes(device)
    if available is not None and num_bytes > available:
        raise ConfigError(
            f"{what} needs {num_bytes / _GIB:.2f} GiB for the KV pool on {device}, but only "
            f"{available / _GIB:.2f} GiB is available: lower it, or leave cache.num_blocks "
            "and cache.memory_gib unset to size the pool from what the run can use"
        )


def pool_size(
    cfg: DictConfig, shape: ModelShape, device: torch.device, block_bytes: int
) -> PoolSize:
    """The device pool's blocks: ``cache.num_blocks``, else ``cache.memory_gib``'s worth
    (either checked against the memory available, ConfigError when it does not fit), else
    on CUDA the free memory × ``hardware.memory_utilization`` - ``hardware.reserve_gib``,
    and on a CPU what the run can ever hold (``scheduler.max_num_seqs`` sequences of
    ``max_model_len`` tokens), at most ``CPU_POOL_CAP_GIB`` and ``CPU_POOL_MEMORY_SHARE``
    of the available memory."""
    num_blocks = cfg.cache.num_blocks
    if num_blocks is not None:
        if num_blocks < 1:
            raise ConfigError(f"cache.num_blocks must be >= 1, got {num_blocks}")
        _check_fits(num_blocks * block_bytes, f"cache.num_blocks={num_blocks}", device)
        return PoolSize(int(num_blocks), "cache.num_blocks")
    if cfg.cache.memory_gib is not None:
        budget = cfg.cache.memory_gib * _GIB
        num_blocks = int(budget // block_bytes)
        if num_blocks < 1:
            raise ConfigError(f"cache.memory_gib={cfg.cache.memory_gib} holds no KV block")
        _check_fits(num_blocks * block_bytes, f"cache.memory_gib={cfg.cache.memory_gib}", device)
        return PoolSize(num_blocks, "cache.memory_gib")
    if device.type == "cuda":
        free = available_memory_bytes(device) or 0
        budget = free * cfg.hardware.memory_utilization - cfg.hardware.reserve_gib * _GIB
        num_blocks = int(budget // block_bytes)
        if num_blocks < 1:
            raise ConfigError(f"the KV pool budget of {budget / _GIB:.3f} GiB holds no block")
        return PoolSize(num_blocks, "free device memory")
    block_size = cfg.cache.block_size
    blocks_per_seq = -(-shape.max_model_len // block_size)
    needed = cfg.scheduler.max_num_seqs * blocks_per_seq
    cap, cap_rule = int(CPU_POOL_CAP_GIB * _GIB) // block_bytes, f"{CPU_POOL_CAP_GIB:g} GiB cap"
    available = available_memory_bytes(device)
    if available is not None and int(available * CPU_POOL_MEMORY_SHARE) // block_bytes < cap:
        cap = int(available * CPU_POOL_MEMORY_SHARE) // block_bytes
        cap_rule = f"{CPU_POOL_MEMORY_SHARE:.0%} of the available memory"
    if needed <= cap:
        return PoolSize(needed, "scheduler.max_num_seqs x max_model_len")
    if cap < 1:
        raise ConfigError(f"no KV block of {block_bytes} bytes fits in the memory available")
    return PoolSize(cap, cap_rule)


def build_torch_executor(
    cfg: DictConfig,
    shape: ModelShape,
    kv_spec: KVSpec,
    swap_space_gib: float = 0.0,
) -> tuple[TorchExecutor, int]:
    """The torch executor and its number of device KV blocks, in ``kv_spec.quant``'s
    storage format, with a host swap pool of ``swap_space_gib`` GiB (sized as the swap
    bookkeeping sizes its own: ``swap_space_num_blocks``). Raises ConfigError for a
    missing device, kernels the device cannot run, missing weights or a pool that does
    not fit."""
    device = _device(cfg.device)
    threads = set_threads(cfg.threads, shape, device)
    ops = _ops(cfg.kernels, device)
    model = load_model(cfg, shape, device)
    block_bytes = kv_spec.bytes_per_block  # made for the model dtype: what a pool allocates
    size = pool_size(cfg, shape, device, block_bytes)
    try:
        executor = TorchExecutor(
            model,
            kv_spec,
            size.num_blocks,
            ops,
            num_host_blocks=swap_space_num_blocks(swap_space_gib, block_bytes, size.num_blocks),
            base_seed=cfg.model.seed,
            model_path=cfg.model.path or None,
        )
    except torch.OutOfMemoryError:
        raise ConfigError(
            f"the KV pool of {size.num_blocks} blocks ({size.num_blocks * block_bytes / _GIB:.2f}"
            f" GiB, by {size.sized_by}) does not fit in the memory of {device}"
        ) from None
    executor.build_notes.update(kv_pool_sized_by=size.sized_by, threads=threads)
    return executor, size.num_blocks
