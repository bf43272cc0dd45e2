"""One abstract base class per plugin group. A plugin subclasses one of them and carries a
``Config`` dataclass that subclasses the group's base config (enginekit.config)."""

from enginekit.interfaces.allocator import Allocator
from enginekit.interfaces.eviction import Eviction
from enginekit.interfaces.preemption import Preemption, PreemptionResult
from enginekit.interfaces.prefix import PrefixCache, PrefixMatch
from enginekit.interfaces.quantizer import Quantizer

GROUP_INTERFACES: dict[str, type] = {
    "allocator": Allocator,
    "prefix": PrefixCache,
    "quantizer": Quantizer,
    "eviction": Eviction,
    "preemption": Preemption,
}

__all__ = [
    "GROUP_INTERFACES",
    "Allocator",
    "Eviction",
    "PrefixCache",
    "PrefixMatch",
    "Preemption",
    "PreemptionResult",
    "Quantizer",
]
