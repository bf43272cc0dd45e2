"""enginekit: an LLM inference engine built around the KV cache.

The public API::

    from enginekit import Engine, SamplingParams

    engine = Engine.from_overrides(["+prefix=block_hash", "workload.num_requests=100"])
    engine.add_workload()  # or engine.add_request(token_ids, SamplingParams(...))
    result = engine.run()  # result.outputs, result.summary
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
