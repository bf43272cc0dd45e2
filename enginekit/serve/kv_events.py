"""KV events over ZMQ in vLLM's wire format (``serve.kv_events``), for cache-aware routers.

After every engine step (and every batch of aborts and finishes) that changed the prefix
cache's full blocks, the engine loop hands the cache's KV events
(``KVCacheManager.take_kv_events``) to a ``KVEventPublisher``, which puts them on a queue
and returns: a thread of its own encodes and sends them, so the loop never waits on ZMQ.

The wire format is vLLM's (``vllm.distributed.kv_events``), so a subscriber written for it
decodes enginekit's stream unchanged:

- a PUB socket sends one message of three frames per batch: the topic (``topic``, UTF-8),
  the batch's sequence number (8 bytes, big-endian, 0 for the first batch, one more for
  each next one) and the batch, MessagePack;
- a batch is an array ``[ts, events, data_parallel_rank]`` (``ts``: Unix time of the
  step, float; ``data_parallel_rank``: 0); each event an array whose first item is its
  tag: ``["BlockStored", block_hashes, parent_block_hash, token_ids, block_size, lora_id,
  medium, lora_name]``, ``["BlockRemoved", block_hashes, medium]`` or
  ``["AllBlocksCleared"]`` (msgspec Structs with ``array_like=True`` and ``tag=True``);
- a block hash is the block's chain hash, an unsigned 64-bit int: XXH64 (seed 0) over its
  parent's hash (8 bytes little-endian; the first block's parent is ``0x656e67696e656b69``),
  ``0x00`` or ``0x01`` + the salt's length (4 bytes little-endian) + the salt (vLLM's
  ``cache_salt``, UTF-8), and its token ids (4 bytes little-endian each)
  (``enginekit.kv.pyref.hashing``). It depends on the tokens from the sequence's start and
  the salt alone, so every replica, whichever prefix cache it runs (``block_hash`` or
  ``radix``), names the same blocks alike. ``token_ids`` are the stored blocks' tokens,
  ``block_size`` each; ``lora_id`` and ``lora_name`` are nil; ``medium`` is ``"GPU"``;
- the first batch holds ``AllBlocksCleared``: the replica starts with an empty cache;
- with ``replay_endpoint``, a ROUTER socket keeps the last ``buffer_steps`` batches: a
  request of one frame (after the ROUTER's identity and empty delimiter), a sequence number
  as 8 bytes big-endian, is answered with every kept batch from that number on, each as
  ``[sequence number, batch]`` frames, then the end marker ``[-1 as 8 signed bytes, b""]``.

Each stored block's hash appears once until it is removed, so a subscriber that adds the
stored hashes and drops the removed ones (all of them at ``AllBlocksCleared``) holds the
blocks the replica's cache holds.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Sequence
from typing import Any

import msgspec
import zmq
from omegaconf import DictConfig

from enginekit.engine import Engine
from enginekit.errors import ConfigError
from enginekit.interfaces.kv_events import CacheCleared, KVEvent, RemovedBlocks, StoredBlocks

_log = logging.getLogger("enginekit.serve")

MEDIUM = "GPU"  # the device pool, as vLLM names it
END_OF_REPLAY = (-1).to_bytes(8, "big", signed=True)
POLL_S = 0.05  # how long the sender waits on its queue before it looks at replay requests
CLOSE_TIMEOUT_S = 5.0


class EventBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    """One message's payload: the events of one engine step."""

    ts: float
    events: list[Any]
    data_parallel_rank: int | None = None


class KVCacheEvent(msgspec.Struct, array_like=True, omit_defaults=True, gc=False, tag=True):
    """An event: an array tagged with its class name."""


class BlockStored(KVCacheEvent, tag="BlockStored"):
    """Consecutive full blocks of one sequence entered the cache."""

    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None
    lora_name: str | None


class BlockRemoved(KVCacheEvent, tag="BlockRemoved"):
    """Full blocks left the cache."""

    block_hashes: list[int]
    medium: str | None


class AllBlocksCleared(KVCacheEvent, tag="AllBlocksCleared"):
    """The cache holds nothing."""


class KVEventBatch(EventBatch):
    events: list[BlockStored | BlockRemoved | AllBlocksCleared]


def wire_events(
    events: Sequence[KVEvent], block_size: int
) -> list[BlockStored | BlockRemoved | AllBlocksCleared]:
    """The engine's KV events as the wire format's."""
    wired: list[BlockStored | BlockRemoved | AllBlocksCleared] = []
    for event in events:
        if isinstance(event, StoredBlocks):
            wired.append(
                BlockStored(
                    event.block_hashes,
                    event.parent_hash,
                    event.token_ids,
                    block_size,
                    None,
                    MEDIUM,
                    None,
                )
            )
        elif isinstance(event, RemovedBlocks):
            wired.append(BlockRemoved(event.block_hashes, MEDIUM))
        else:
            assert isinstance(event, CacheCleared)
            wired.append(AllBlocksCleared())
    return wired


def check_kv_events_config(config: DictConfig) -> None:
    """Raises ConfigError naming the first ``serve.kv_events.*`` key out of range."""
    prefix = "serve.kv_events"
    for key in ("endpoint", "replay_endpoint"):
        value = config[key]
        if (value is not None or key == "endpoint") and "://" not in str(value or ""):
            raise ConfigError(
                f"{prefix}.{key} must be a ZMQ endpoint such as tcp://*:5557, got {value!r}"
            )
    if config.buffer_steps < 1:
        raise ConfigError(f"{prefix}.buffer_steps must be >= 1, got {config.buffer_steps}")
    if config.hwm < 0:
        raise ConfigError(f"{prefix}.hwm must be >= 0, got {config.hwm}")


def _binds(endpoint: str) -> bool:
    """Whether the PUB socket binds ``endpoint`` (a wildcard, ipc, inproc) or connects to
    it (a subscriber or proxy that binds)."""
    return "*" in endpoint or "::" in endpoint or endpoint.startswith(("ipc://", "inproc://"))


class KVEventPublisher:
    """Publishes an engine's KV events (see the module docstring).

    Built on an engine that has served nothing yet: it starts the cache's KV events
    (``KVCacheManager.record_kv_events``) and binds (or connects) its sockets at once, so a
    bad endpoint fails before serving (ConfigError naming the key). ``endpoint`` and
    ``replay_endpoint`` are then the addresses taken (a port given as ``*`` resolved).
    ``after_engine`` is the engine loop's hook; ``num_batches`` counts the batches it has
    queued (the next one's sequence number); ``close`` stops the sender, sending what is
    queued first.
    """

    def __init__(self, engine: Engine, config: DictConfig) -> None:
        check_kv_events_config(config)
        self._block_size = engine.kv_spec.block_size
        self._topic = str(config.topic).encode("utf-8")
        self._buffer: deque[tuple[int, bytes]] = deque(maxlen=int(config.buffer_steps))
        self.num_batches = 0
        self._queue: queue.SimpleQueue[tuple[float, list[KVEvent]] | None] = queue.SimpleQueue()
        self._context = zmq.Context()
        self._pub = self._context.socket(zmq.PUB)
        self._pub.setsockopt(zmq.SNDHWM, int(config.hwm))
        self._pub.setsockopt(zmq.LINGER, 0)
        self._replay: zmq.Socket[bytes] | None = None
        try:
            self.endpoint = self._open(self._pub, "endpoint", str(config.endpoint))
            self.replay_endpoint: str | None = None
            if config.replay_endpoint is not None:
                self._replay = self._context.socket(zmq.ROUTER)
                self._replay.setsockopt(zmq.LINGER, 0)
                self.replay_endpoint = self._open(
                    self._replay, "replay_endpoint", str(config.replay_endpoint), bind=True
                )
            engine.cache.record_kv_events(True)  # KVCacheError unless the cache is empty
        except BaseException:
            self._context.destroy(linger=0)
            raise
        self._thread = threading.Thread(target=self._send_all, name="enginekit-kv-events")
        self._thread.daemon = True
        self._thread.start()
        self.after_engine(engine)  # the first batch: the cache starts empty

    @staticmethod
    def _open(socket: zmq.Socket[bytes], key: str, endpoint: str, bind: bool = False) -> str:
        """Binds (or connects) ``socket``; returns the address taken."""
        try:
            if bind or _binds(endpoint):
                socket.bind(endpoint)
                return str(socket.getsockopt_string(zmq.LAST_ENDPOINT))
            socket.connect(endpoint)
            return endpoint
        except zmq.ZMQError as exc:
            raise ConfigError(f"serve.kv_events.{key} {endpoint!r}: {exc}") from None

    # -- the engine loop's thread ----------------------------------------------------------

    def after_engine(self, engine: Engine) -> None:
        """Takes the engine's KV events and queues them as one batch, if there are any.
        Never blocks."""
        events = engine.cache.take_kv_events()
        if events:
            self._queue.put((time.time(), events))
            self.num_batches += 1

    def close(self, timeout_s: float = CLOSE_TIMEOUT_S) -> None:
        """Sends what is queued, then closes the sockets (within ``timeout_s``)."""
        self._queue.put(None)
        self._thread.join(timeout_s)
        if self._thread.is_alive():
            _log.warning("the KV event sender did not stop within %.1f s", timeout_s)
            return
        self._context.term()

    # -- the sender's thread ---------------------------------------------------------------

    def _send_all(self) -> None:
        """Sends each queued batch with the next sequence number, keeps it for replays, and
        answers replay requests, until ``close``. Owns the sockets."""
        encoder = msgspec.msgpack.Encoder()
        sequence = 0
        try:
            while True:
                try:
                    item = self._queue.get(timeout=POLL_S)
                except queue.Empty:
                    self._answer_replays()
                    continue
                self._answer_replays()
                if item is None:
                    break
                ts, events = item
                batch = KVEventBatch(ts, wire_events(events, self._block_size), 0)
                payload = encoder.encode(batch)
                self._pub.send_multipart((self._topic, sequence.to_bytes(8, "big"), payload))
                self._buffer.append((sequence, payload))
                sequence += 1
        except Exception:  # a bug: log it, and let the engine run without events
            _log.exception("the KV event sender failed")
        finally:
            self._pub.close()
            if self._replay is not None:
                self._replay.close()

    def _answer_replays(self) -> None:
        """Answers every waiting replay request from the kept batches."""
        replay = self._replay
        if replay is None:
            return
        while replay.poll(0):
            frames = replay.recv_multipart()
            if len(frames) != 3 or len(frames[2]) != 8:
                _log.warning("a KV event replay request of %d frames was ignored", len(frames))
                continue
            client, delimiter, start = frames
            first = int.from_bytes(start, "big")
            for sequence, payload in list(self._buffer):
                if sequence >= first:
                    replay.send_multipart((client, delimiter, sequence.to_bytes(8, "big"), payload))
            replay.send_multipart((client, delimiter, END_OF_REPLAY, b""))
