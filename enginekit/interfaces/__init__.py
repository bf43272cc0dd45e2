"""The plugin contract: one abstract base class per plugin group, the KV context they work
on, the capability protocols other plugins ask for, and the plain values they exchange;
and the door between the scheduler and the cache (``SchedulerCache``).

A plugin package imports this package, ``enginekit.config``, ``enginekit.errors`` and
``enginekit.request``, and nothing else of enginekit. A plugin subclasses one group's base
class and carries a ``Config`` dataclass that subclasses the group's base config
(``enginekit.config``).
"""

from enginekit.interfaces.allocator import Allocator
from enginekit.interfaces.backend import Backend
from enginekit.interfaces.base import Plugin, plugin_name
from enginekit.interfaces.cache_view import CacheView
from enginekit.interfaces.capabilities import HoleAllocator, WindowedEviction
from enginekit.interfaces.context import KVContext
from enginekit.interfaces.eviction import AttentionSpan, BlockRange, Eviction
from enginekit.interfaces.hash_chains import HashChains
from enginekit.interfaces.preemption import Preemption, PreemptionMode
from enginekit.interfaces.prefix import NO_MATCH, PrefixCache, PrefixMatch
from enginekit.interfaces.quantizer import Quantizer
from enginekit.interfaces.queue import PrefixProbe, WaitingQueue
from enginekit.interfaces.scheduler_cache import Admission, SchedulerCache, StepBlocks
from enginekit.interfaces.structures import (
    Access,
    AccessKind,
    BlockPool,
    BlockTables,
    HashBatch,
    InsertResult,
    IntBatch,
    IntList,
    LruRoom,
    RadixMatch,
    RadixNode,
    RadixTree,
)
from enginekit.interfaces.tier import (
    KVTier,
    LruIndex,
    Payload,
    TierContext,
    TierLevelStats,
)
from enginekit.spec.kv import KVSpec
from enginekit.spec.model import ModelShape
from enginekit.spec.quant import FP8_SCALE_SOURCES, KVQuant
from enginekit.spec.restore_cost import RestoreCost

GROUP_INTERFACES: dict[str, type[Plugin]] = {
    "allocator": Allocator,
    "prefix": PrefixCache,
    "quantizer": Quantizer,
    "eviction": Eviction,
    "preemption": Preemption,
    "tier": KVTier,
    "queue": WaitingQueue,
}

__all__ = [
    "Access",
    "AccessKind",
    "Admission",
    "FP8_SCALE_SOURCES",
    "GROUP_INTERFACES",
    "NO_MATCH",
    "Allocator",
    "AttentionSpan",
    "Backend",
    "BlockPool",
    "BlockRange",
    "BlockTables",
    "CacheView",
    "Eviction",
    "HashChains",
    "HoleAllocator",
    "InsertResult",
    "HashBatch",
    "IntBatch",
    "IntList",
    "KVContext",
    "KVTier",
    "LruIndex",
    "Payload",
    "TierContext",
    "TierLevelStats",
    "KVQuant",
    "KVSpec",
    "LruRoom",
    "ModelShape",
    "Plugin",
    "Preemption",
    "PreemptionMode",
    "PrefixCache",
    "PrefixMatch",
    "PrefixProbe",
    "Quantizer",
    "RadixMatch",
    "RadixNode",
    "RadixTree",
    "RestoreCost",
    "SchedulerCache",
    "StepBlocks",
    "WaitingQueue",
    "WindowedEviction",
    "plugin_name",
]
