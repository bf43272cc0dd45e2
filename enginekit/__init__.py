"""enginekit: an LLM inference engine built around the KV cache.

The public API::

    from enginekit import Engine, SamplingParams

    engine = Engine.from_overrides(["+prefix=block_hash", "workload.num_requests=100"])
    engine.add_workload()  # or engine.add_request(token_ids, SamplingParams(...))
    result = engine.run()  # result.outputs, result.summary
"""

from enginekit.config import EngineConfig
from enginekit.engine import Engine, RunResult
from enginekit.errors import (
    ConfigError,
    EngineKitError,
    KVCacheError,
    OutOfBlocksError,
    PluginError,
    RequestRejectedError,
)
from enginekit.request import RequestOutput, SamplingParams

__all__ = [
    "ConfigError",
    "Engine",
    "EngineConfig",
    "EngineKitError",
    "KVCacheError",
    "OutOfBlocksError",
    "PluginError",
    "RequestOutput",
    "RequestRejectedError",
    "RunResult",
    "SamplingParams",
]
