"""KV tiers: levels of storage below device memory (host memory, local disk, a shared
store) that keep the KV of blocks the device pool gave up, named by their content.

A block's *key* is the name its content has in every process: the 64-bit chain hash of
its tokens, its parent block's key and the request's prefix-cache salt (``hash_blocks``
of the backend, XXH64 with a fixed seed), so two engines that computed the same tokens
agree on it. A *payload* is a block's bytes as the executor read them (every layer's keys
and values, quantization scales included), an object with the buffer protocol; in the
simulator, which moves no data, it is None. A level stores payloads by key and evicts its
least recently used keys when full; the cache manager decides what is written down, when,
and what is loaded back (``enginekit.kv.tiers``).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections import OrderedDict
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, ClassVar, NamedTuple

from enginekit.config import TierConfig
from enginekit.errors import ConfigError, KVCacheError
from enginekit.interfaces.base import Plugin, plugin_name
from enginekit.interfaces.eviction import Eviction

Payload = Any  # a block's bytes (buffer protocol), or None where no data moves


class TierContext(NamedTuple):
    """What the engine hands a level at construction.

    ``block_bytes``: one block's payload size; ``namespace``: a name for the model and the
    KV layout (shape, dtype, quantization, block size) that a shared level prefixes its
    keys with, so engines of different models never read each other's blocks;
    ``moves_data``: False in the simulator, whose payloads are None (a level then keeps
    only its index); ``link_bytes_per_s``: the host link's speed (a level that goes through
    host memory moves no faster); ``host_memory_bytes``: the memory of the host the level
    lives on (the simulated node's, or this machine's available memory).
    """

    block_bytes: int
    namespace: str
    moves_data: bool
    link_bytes_per_s: float
    host_memory_bytes: int


class LruIndex:
    """Keys in least-recently-used order with a payload each, at most ``capacity``.
    A helper for levels that keep their own index (host, disk)."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._entries: OrderedDict[int, Payload] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: int) -> bool:
        return key in self._entries

    def __iter__(self) -> Iterator[int]:
        return iter(self._entries)

    def num_leading(self, keys: Sequence[int]) -> int:
        """How many of ``keys``, from the first, are held (``KVTier.num_present`` of a
        level whose index this is)."""
        entries = self._entries
        for i, key in enumerate(keys):
            if key not in entries:
                return i
        return len(keys)

    def get(self, key: int) -> Payload:
        """The key's payload, marking it most recently used; KeyError if absent."""
        payload = self._entries[key]
        self._entries.move_to_end(key)
        return payload

    def put(self, key: int, payload: Payload) -> Sequence[tuple[int, Payload]]:
        """Stores (or refreshes) ``key``; returns the (key, payload) pairs evicted, least
        recently used first, to keep at most ``capacity``."""
        entries = self._entries
        if key in entries:
            entries.move_to_end(key)
        entries[key] = payload
        if len(entries) <= self.capacity:
            return ()
        evicted = []
        while len(entries) > self.capacity:
            evicted.append(entries.popitem(last=False))
        return evicted

    def touch(self, key: int) -> None:
        """Marks ``key``, if held, most recently used."""
        if key in self._entries:
            self._entries.move_to_end(key)

    def pop(self, key: int) -> Payload:
        """Removes ``key``; returns its payload (None if absent)."""
        return self._entries.pop(key, None)

    def check_integrity(self) -> None:
        if len(self._entries) > self.capacity:
            raise KVCacheError(
                f"a tier index holds {len(self._entries)} blocks, more than its capacity "
                f"{self.capacity}"
            )


class KVTier(Plugin, ABC):
    """One level below device memory. ``capacity_blocks`` bounds what it holds;
    ``bytes_per_s`` is how fast a block moves between it and the device (loads and
    writes). Construction checks what can be checked before a run (room, a writable
    folder, a reachable server) and raises ConfigError with the reason.

    Every method is safe to call with a key the level does not hold. A level that fails at
    run time (a lost server, a corrupt file) answers as a miss and counts the failure in
    ``num_failures``: the block is computed again, never read wrong."""

    Config: ClassVar[type[TierConfig]] = TierConfig
    # Whether other processes may write this level's keys (a shared server): the manager
    # then asks it (``num_present``) instead of trusting what it wrote itself.
    is_shared: ClassVar[bool] = False

    def __init__(self, config: TierConfig, context: TierContext) -> None:
        self.config = config
        self.context = context
        self.num_failures = 0

    @classmethod
    def check_compatible(cls, selected: Mapping[str, type[Plugin]]) -> None:
        """A tier keeps whole prompts' blocks by their prefix: an eviction policy that
        gives blocks back out of a window (it overrides ``ranges_out_of_window``) leaves
        no such prefix."""
        eviction = selected.get("eviction")
        if (
            eviction is not None
            and getattr(eviction, "ranges_out_of_window", None) is not Eviction.ranges_out_of_window
        ):
            raise ConfigError(
                f"+tier={plugin_name(cls)} keeps whole prompts' blocks, but "
                f"+eviction={plugin_name(eviction)} releases blocks out of a window; "
                "use +tier=none with it"
            )

    @property
    @abstractmethod
    def capacity_blocks(self) -> int:
        """Blocks the level holds at most."""

    @property
    @abstractmethod
    def bytes_per_s(self) -> float:
        """Bytes per second a load or a write of this level moves."""

    @abstractmethod
    def num_blocks(self) -> int:
        """Blocks held now (a shared level: an estimate, or those this process wrote)."""

    @abstractmethod
    def num_present(self, keys: Sequence[int]) -> int:
        """How many of ``keys``, from the first, the level holds (stops at the first it
        does not). Pure, but a shared level asks its server."""

    @abstractmethod
    def load(self, keys: Sequence[int]) -> list[Payload]:
        """The payloads of the leading ``keys`` the level can return intact, in order,
        stopping at the first it cannot (absent, corrupt, unreachable); marks them recently
        used. A level that moves no data returns None for each."""

    @abstractmethod
    def store(self, key: int, payload: Payload) -> Sequence[tuple[int, Payload]]:
        """Keeps ``payload`` under ``key`` (refreshing a key it holds); returns the (key,
        payload) pairs it evicted to make room, for the next level down (a level that
        cannot return what it evicts returns none). A write that fails is dropped (counted
        in ``num_failures``)."""

    def discard(self, keys: Sequence[int]) -> None:  # noqa: B027 - optional hook
        """Drops ``keys`` (their blocks were loaded back to the device, which will write
        them down again when it evicts them: the levels then hold what the device does not,
        and a level's room goes to other blocks). Default: keeps them."""

    def touch(self, key: int) -> None:  # noqa: B027 - optional hook
        """``key``, which the level holds, was just used again (the device evicted a block
        it had loaded from here): it becomes the most recently used. Default: nothing."""

    def check_integrity(self) -> None:  # noqa: B027 - optional hook
        """Raises KVCacheError if the level's own index is inconsistent."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Releases what the level holds open (connections, files)."""


class TierLevelStats(NamedTuple):
    """What one level did over a run."""

    name: str
    num_blocks: int  # held at the end
    capacity_blocks: int
    num_hit_blocks: int  # prompt blocks admission found here (and loaded)
    num_loaded_bytes: int
    num_written_blocks: int
    num_written_bytes: int
    num_evicted_blocks: int  # dropped to make room (handed down to the next level, if any)
    num_failures: int  # loads or writes that failed (each a miss, computed again)
    load_time_s: float  # the link time of its loads (bytes / bytes_per_s)


def tier_names(config: TierConfig) -> list[str]:
    """The level names a tier config asks for, fastest first: ``levels``, or the selected
    plugin's name alone; empty for ``none``."""
    names = list(config.levels) if config.levels else [config.name]
    return [] if names == ["none"] else names


def check_tier_names(names: Sequence[str]) -> None:
    """Raises ConfigError if ``names`` repeats a level or mixes ``none`` with levels."""
    if "none" in names and len(names) > 1:
        raise ConfigError(f"tier.levels {list(names)} mixes 'none' with levels")
    repeated = sorted({n for n in names if list(names).count(n) > 1})
    if repeated:
        raise ConfigError(f"tier.levels {list(names)} names {repeated[0]!r} twice")
