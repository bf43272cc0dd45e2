"""The exceptions enginekit raises on purpose.

The Rust core (``enginekit._native``) raises these same classes, so callers catch one
hierarchy whichever backend (native or pure-Python reference) runs underneath.
"""

from __future__ import annotations


class EngineKitError(Exception):
    """Base of every deliberate enginekit error."""


class KVCacheError(EngineKitError):
    """A bookkeeping call that the cache structures refuse (unknown id, double free, ...).

    The structure is left exactly as it was before the call.
    """


class OutOfBlocksError(KVCacheError):
    """More blocks were asked for than the pool can hand out without eviction."""


class ConfigError(EngineKitError, ValueError):
    """A configuration value is invalid; the message names the key and what is valid."""


class PluginError(EngineKitError, LookupError):
    """A plugin cannot be found, loaded or built; the message lists what is installed."""


class RequestRejectedError(EngineKitError, ValueError):
    """A request can never be served (too long for the model or the whole cache)."""


class InvalidRequestError(RequestRejectedError):
    """A request is malformed: a field of the wrong type or out of range (a float token id,
    ``max_tokens="8"``, a NaN arrival time). The message names the field and the value.
    Raised where the request is built (``SamplingParams(...)``, ``Engine.add_request``),
    never later by a step."""
