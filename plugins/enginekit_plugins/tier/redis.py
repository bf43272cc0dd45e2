"""``redis``: KV blocks in a Redis server that several engines share.

Each block is one Redis string under ``<namespace>:<key as 16 hex digits>``: the key is the
block's content hash, the same in every process, so an engine finds the blocks another
engine of the same model and KV layout wrote. The server decides what it keeps (its own
``maxmemory`` and LRU policy evict), so ``store`` hands nothing down and ``num_present``
asks the server (one pipelined round trip of EXISTS); ``load`` is one pipelined round trip
of GET. ``tier.redis_gib`` is the room this engine counts the server as having.

A value is a short header (a magic number and the payload's length) then the payload's
bytes: a value that is cut short, or the empty marker an engine that moves no data writes
(the simulator: presence alone is shared; a marker never replaces a block), is a miss,
never bytes put into a block.

The server must answer when the level is built (else ConfigError naming the URL). During a
run a lost, refusing or hanging server is a miss or a dropped write, counted in
``num_failures``, never an exception: the client's socket timeouts are short and it does
not retry, and after a server could not be reached the level answers without asking it
for ``RETRY_AFTER_S`` seconds (each answer then counted as a failure too), so a server
that went away costs a run at most one timeout per that long. A command the server
refuses (a write over its ``maxmemory`` under ``noeviction``) is a failure of its own.

Needs redis-py, the ``tiers`` extra: ``pip install 'enginekit[tiers]'``.
"""

from __future__ import annotations

import struct
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from enginekit.config import TierConfig
from enginekit.errors import ConfigError
from enginekit.interfaces.tier import KVTier, Payload, TierContext

BYTES_PER_GIB = 1 << 30
KEY_MASK = (1 << 64) - 1
MAGIC = b"EKVR"
HEADER = struct.Struct("<4sQ")  # magic, payload length
MARKER = b""  # what an engine that moves no data stores: presence only
CONNECT_TIMEOUT_S = 1.0
SOCKET_TIMEOUT_S = 2.0
RETRY_AFTER_S = 1.0
INSTALL_HINT = "install the tiers extra: pip install 'enginekit[tiers]'"


@dataclass
class RedisTierConfig(TierConfig):
    name: str = "redis"


def redis_key(namespace: str, key: int) -> str:
    """The Redis key of block ``key`` (a 64-bit content hash) in ``namespace``: the same
    in every process."""
    return f"{namespace}:{key & KEY_MASK:016x}"


def encode_value(payload: Payload) -> bytes:
    """The Redis value of ``payload``: the header, then its bytes. Raises TypeError for
    an object without the buffer protocol, ValueError for one that is not contiguous."""
    view = memoryview(payload)
    if not view.c_contiguous:
        raise ValueError("a payload must be a C-contiguous buffer")
    return b"".join((HEADER.pack(MAGIC, view.nbytes), view.cast("B")))


def decode_value(value: bytes) -> memoryview | None:
    """The payload ``value`` holds (a view, no copy), or None for the simulator's marker,
    a value of another writer or one cut short."""
    if len(value) < HEADER.size:
        return None
    magic, length = HEADER.unpack_from(value)
    if magic != MAGIC or len(value) - HEADER.size != length:
        return None
    return memoryview(value)[HEADER.size :]


class RedisTier(KVTier):
    """Blocks in the Redis server at ``tier.redis_url``, shared by every engine that uses
    it. ``capacity_blocks``: ``tier.redis_gib`` of blocks; ``bytes_per_s``:
    ``tier.redis_gb_per_s``, at most the host link's. Refused up front (ConfigError):
    redis-py missing, a bad URL, a server that does not answer, a size or speed <= 0."""

    Config = RedisTierConfig
    is_shared = True

    def __init__(self, config: TierConfig, context: TierContext) -> None:
        super().__init__(config, context)
        if config.redis_gib <= 0:
            raise ConfigError(f"tier.redis_gib must be > 0, got {config.redis_gib}")
        if config.redis_gb_per_s <= 0:
            raise ConfigError(f"tier.redis_gb_per_s must be > 0, got {config.redis_gb_per_s}")
        capacity = int(config.redis_gib * BYTES_PER_GIB) // context.block_bytes
        if capacity < 1:
            raise ConfigError(
                f"tier.redis_gib={config.redis_gib:g} holds no block of {context.block_bytes} bytes"
            )
        self._capacity = capacity
        try:
            import redis
            from redis.backoff import NoBackoff
            from redis.retry import Retry
        except ImportError:
            raise ConfigError(f"+tier=redis: redis is not installed; {INSTALL_HINT}") from None
        self._errors: tuple[type[BaseException], ...] = (redis.RedisError, OSError)
        # a server gone (refused, lost, hanging), not one that refused a command
        self._unreachable: tuple[type[BaseException], ...] = (
            redis.ConnectionError,
            redis.TimeoutError,
            OSError,
        )
        url = config.redis_url
        try:
            self._client: Any = redis.Redis.from_url(
                url,
                socket_connect_timeout=CONNECT_TIMEOUT_S,
                socket_timeout=SOCKET_TIMEOUT_S,
                retry=Retry(NoBackoff(), 0),
                retry_on_timeout=False,
            )
            self._client.ping()
        except (ValueError, *self._errors) as exc:
            raise ConfigError(
                f"tier.redis_url={url}: cannot reach the Redis server ({exc})"
            ) from None
        self._num_stored = 0
        self._down_until = 0.0

    @property
    def capacity_blocks(self) -> int:
        return self._capacity

    @property
    def bytes_per_s(self) -> float:
        return min(self.config.redis_gb_per_s * 1e9, self.context.link_bytes_per_s)

    def num_blocks(self) -> int:
        """The blocks this engine stored, up to the capacity (the server evicts on its own
        and other engines store too: an estimate)."""
        return min(self._num_stored, self._capacity)

    def num_present(self, keys: Sequence[int]) -> int:
        if not keys:
            return 0
        answers = self._pipelined("exists", keys)
        if answers is None:
            return 0
        for i, present in enumerate(answers):
            if not present:
                return i
        return len(keys)

    def load(self, keys: Sequence[int]) -> list[Payload]:
        if not keys:
            return []
        values = self._pipelined("get", keys)
        if values is None:
            return []
        payloads: list[Payload] = []
        for value in values:
            if value is None:
                break
            if not self.context.moves_data:
                payloads.append(None)
                continue
            payload = decode_value(value)
            if payload is None:  # a marker of the simulator, or a value cut short
                break
            payloads.append(payload)
        return payloads

    def store(self, key: int, payload: Payload) -> list[tuple[int, Payload]]:
        if self.context.moves_data:
            if payload is None:
                self.num_failures += 1
                return []
            try:
                value = encode_value(payload)
            except (TypeError, ValueError):
                self.num_failures += 1
                return []
        else:
            value = MARKER
        if self._is_down():
            return []
        try:
            # a marker never replaces a block an engine that moves data stored
            self._client.set(redis_key(self.context.namespace, key), value, nx=value == MARKER)
        except self._errors as exc:
            self._failed(exc)
            return []
        self._num_stored += 1
        return []

    def close(self) -> None:
        self._client.close()

    # -- the server -------------------------------------------------------------------------

    def _pipelined(self, command: str, keys: Sequence[int]) -> list[Any] | None:
        """One round trip of ``command`` for each key; None (a failure counted) if the
        server cannot be asked."""
        if self._is_down():
            return None
        namespace = self.context.namespace
        try:
            pipe = self._client.pipeline(transaction=False)
            for key in keys:
                getattr(pipe, command)(redis_key(namespace, key))
            answers: list[Any] = pipe.execute()
        except self._errors as exc:
            self._failed(exc)
            return None
        return answers

    def _is_down(self) -> bool:
        """Whether a recent failure keeps the server from being asked (counted)."""
        if self._down_until and time.monotonic() < self._down_until:
            self.num_failures += 1
            return True
        return False

    def _failed(self, exc: BaseException) -> None:
        """Counts a failure; a server that cannot be reached is left alone for a while."""
        self.num_failures += 1
        if isinstance(exc, self._unreachable):
            self._down_until = time.monotonic() + RETRY_AFTER_S
