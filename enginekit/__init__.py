"""enginekit: an LLM inference engine built around the KV cache.

The public API::

    from enginekit import Engine, SamplingParams

    engine = Engine.from_overrides(["+prefix=block_hash", "cache.num_blocks=4096"])
    engine.add_request([1, 2, 3], SamplingParams(max_tokens=8))
    result = engine.run()  # result.outputs, result.summary

    # a configured workload (workload.*), multi-turn sessions included:
    from enginekit.driver import WorkloadDriver

    driver = WorkloadDriver(Engine.from_overrides(["workload.num_requests=100"]))
    driver.add_workload()
    result = driver.run()
"""

from typing import TYPE_CHECKING, Any

from enginekit.errors import (
    ConfigError,
    EngineKitError,
    InvalidRequestError,
    KVCacheError,
    OutOfBlocksError,
    PluginError,
    RequestRejectedError,
)
from enginekit.request import RequestOutput, SamplingParams

if TYPE_CHECKING:
    from enginekit.config import EngineConfig
    from enginekit.engine import Engine, RunResult

_LAZY = {
    "Engine": "enginekit.engine",
    "RunResult": "enginekit.engine",
    "EngineConfig": "enginekit.config",
}


def __getattr__(name: str) -> Any:
    """Engine and friends load on first use, so ``python -m enginekit.plugins`` does not
    import the registry module twice."""
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'enginekit' has no attribute {name!r}")


__all__ = [
    "ConfigError",
    "Engine",
    "EngineConfig",
    "EngineKitError",
    "InvalidRequestError",
    "KVCacheError",
    "OutOfBlocksError",
    "PluginError",
    "RequestOutput",
    "RequestRejectedError",
    "RunResult",
    "SamplingParams",
]
