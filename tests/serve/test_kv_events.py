"""KV events over ZMQ (``serve.kv_events``), read the way a router written for vLLM reads
them: a plain SUB socket and msgspec Structs declared here from vLLM's documented layout
(array-like, tagged), in both its first shape (``BlockStored`` of five fields) and its
later one (with ``medium`` and ``lora_name``).

Two replicas (``block_hash`` and ``radix``, each on its own endpoints) serve the same
shared-prefix prompts of token ids in pools small enough to evict. Each replica's cached
blocks rebuilt from its events alone equal the blocks its engine holds, read on the engine
thread; the same tokens and salt are named alike on both, by the documented chain hash
(computed here by its readable twin, ``enginekit.kv.pyref.hashing``), and salts part the
names; a late subscriber replays the stream from sequence 0 through the replay socket and
rebuilds the same state.
"""

from __future__ import annotations

import random
import time
from collections.abc import Iterator
from typing import Any

import httpx
import msgspec
import pytest
import zmq

from enginekit import Engine
from enginekit.app import compose_config
from enginekit.errors import ConfigError
from enginekit.kv.pyref.hashing import hash_block, hash_blocks
from enginekit.serve import BackgroundServer, Server
from enginekit.serve.kv_events import KVEventPublisher

BLOCK_SIZE = 4
WAIT_S = 30.0  # how long a subscriber waits for what it expects before the test fails

# -- vLLM's wire layout, as a subscriber declares it ---------------------------------------


class Batch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    ts: float
    events: list[Any]
    data_parallel_rank: int | None = None


class Event(msgspec.Struct, array_like=True, omit_defaults=True, gc=False, tag=True):
    pass


class BlockStored(Event):
    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None
    lora_name: str | None


class BlockRemoved(Event):
    block_hashes: list[int]
    medium: str | None


class AllBlocksCleared(Event):
    pass


class KVEventBatch(Batch):
    events: list[BlockStored | BlockRemoved | AllBlocksCleared]


class FirstEvent(msgspec.Struct, array_like=True, omit_defaults=True, gc=False, tag=True):
    pass


class FirstBlockStored(FirstEvent, tag="BlockStored"):
    """The first layout's: no medium, no LoRA name."""

    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None


class FirstBlockRemoved(FirstEvent, tag="BlockRemoved"):
    block_hashes: list[int]


class FirstAllBlocksCleared(FirstEvent, tag="AllBlocksCleared"):
    pass


class FirstKVEventBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    ts: float
    events: list[FirstBlockStored | FirstBlockRemoved | FirstAllBlocksCleared]


DECODE = msgspec.msgpack.Decoder(KVEventBatch)
DECODE_FIRST = msgspec.msgpack.Decoder(FirstKVEventBatch)


def salt_key(salt: str | None) -> bytes | None:
    return None if salt is None else salt.encode()


def chain_hash(parent: int, tokens: list[int], salt: str | None) -> int:
    """A block's name as the docs give it (the readable twin of the Rust hash)."""
    return hash_block(parent, tokens, salt_key(salt))


def chain_hashes(tokens: list[int], salt: str | None) -> list[int]:
    """The names of every full block of ``tokens``."""
    return hash_blocks(tokens, BLOCK_SIZE, salt_key(salt))


class View:
    """A router's view of one replica, rebuilt from its batches in sequence order: the
    held names and each name's tokens. Checks the layout on the way: every batch decodes
    in both shapes, every stored block has ``BLOCK_SIZE`` tokens and medium GPU, the first
    batch is a clear, each name is stored once until removed."""

    def __init__(self) -> None:
        self.held: set[int] = set()
        self.tokens_of: dict[int, tuple[int, ...]] = {}  # every name ever stored
        self.parent_of: dict[int, int | None] = {}
        self.next_sequence = 0
        self.num_removed = 0

    def apply(self, sequence: int, payload: bytes) -> None:
        assert sequence == self.next_sequence, (sequence, self.next_sequence)
        batch = DECODE.decode(payload)
        first = DECODE_FIRST.decode(payload)
        assert len(first.events) == len(batch.events)
        assert batch.data_parallel_rank == 0 and batch.ts > 0
        if sequence == 0:
            assert isinstance(batch.events[0], AllBlocksCleared)
        for event in batch.events:
            if isinstance(event, AllBlocksCleared):
                self.held.clear()
            elif isinstance(event, BlockStored):
                assert (event.block_size, event.medium, event.lora_id) == (BLOCK_SIZE, "GPU", None)
                assert len(event.token_ids) == BLOCK_SIZE * len(event.block_hashes)
                parent = event.parent_block_hash
                for i, name in enumerate(event.block_hashes):
                    assert name not in self.held
                    self.held.add(name)
                    tokens = event.token_ids[i * BLOCK_SIZE : (i + 1) * BLOCK_SIZE]
                    self.tokens_of[name] = tuple(tokens)
                    self.parent_of[name] = parent
                    parent = name
            else:
                assert event.medium == "GPU"
                for name in event.block_hashes:
                    self.held.remove(name)
                self.num_removed += len(event.block_hashes)
        self.next_sequence += 1


class Subscriber:
    """A SUB socket on a replica's endpoint, and a DEALER on its replay endpoint for what
    the SUB missed (a SUB joins late: what was sent before its subscription reached the
    publisher is not delivered)."""

    def __init__(self, context: zmq.Context[Any], endpoint: str, replay: str) -> None:
        self.sub = context.socket(zmq.SUB)
        self.sub.setsockopt(zmq.SUBSCRIBE, b"kv")
        self.sub.connect(endpoint)
        self.replay = context.socket(zmq.DEALER)
        self.replay.connect(replay)
        self.view = View()
        self.payloads: dict[int, bytes] = {}  # every batch seen, by sequence number

    def take(self, sequence: int, payload: bytes) -> None:
        if sequence in self.payloads:
            assert self.payloads[sequence] == payload  # replayed: the batch as sent
            return
        if sequence > self.view.next_sequence:
            self.replay_from(self.view.next_sequence, until=sequence)
        self.payloads[sequence] = payload
        self.view.apply(sequence, payload)

    def replay_from(self, first: int, until: int | None = None) -> list[int]:
        """Asks for every kept batch from ``first`` on; applies those before ``until``
        (all if None); returns the sequence numbers answered."""
        self.replay.send_multipart([b"", first.to_bytes(8, "big")])
        answered = []
        while True:
            assert self.replay.poll(int(WAIT_S * 1000)), "no answer to a replay request"
            _, sequence_bytes, payload = self.replay.recv_multipart()
            sequence = int.from_bytes(sequence_bytes, "big", signed=True)
            if sequence == -1:
                assert payload == b""
                return answered
            answered.append(sequence)
            if (until is None or sequence < until) and sequence not in self.payloads:
                self.payloads[sequence] = payload
                self.view.apply(sequence, payload)

    def follow_until(self, num_batches: int) -> None:
        """Reads the SUB socket until the view has applied ``num_batches`` batches (or
        WAIT_S passes)."""
        deadline = time.monotonic() + WAIT_S
        while self.view.next_sequence < num_batches and time.monotonic() < deadline:
            if self.sub.poll(100):
                topic, sequence, payload = self.sub.recv_multipart()
                assert topic == b"kv"
                self.take(int.from_bytes(sequence, "big"), payload)


def cached_names(engine: Engine) -> set[int]:
    """The names of the full blocks the engine's cache holds (on the engine thread)."""
    if engine.config.prefix.name == "radix":
        return set(engine.cache.prefix.full_blocks().values())
    return set(engine.cache.pool.cached_blocks())


def replica(prefix: str) -> Server:
    return Server(
        compose_config([
            "model=tiny", "executor=sim", f"+prefix={prefix}", "progress=false",
            f"cache.block_size={BLOCK_SIZE}", "cache.num_blocks=40", "cache.watermark=0",
            "serve.port=0", "serve.time_scale=1000", "serve.kv_events.enabled=true",
            "serve.kv_events.endpoint=tcp://127.0.0.1:*",
            "serve.kv_events.replay_endpoint=tcp://127.0.0.1:*", "serve.kv_events.topic=kv",
        ])
    )  # fmt: skip


@pytest.fixture(scope="module")
def replicas() -> Iterator[list[tuple[BackgroundServer, Server]]]:
    servers = [replica("block_hash"), replica("radix")]
    running = [BackgroundServer(server) for server in servers]
    for background in running:
        background.start()
    try:
        yield list(zip(running, servers, strict=True))
    finally:
        for background in running:
            background.stop()


SALTS = (None, "tenant-a", "tenant-b")


def workload() -> list[tuple[list[int], str | None]]:
    """Forty prompts of token ids sharing three heads, under three salts (the last three
    the same tokens under each)."""
    rng = random.Random(3)
    heads = [rng.choices(range(3, 200), k=20) for _ in range(3)]
    prompts = []
    for i in range(37):
        prompt = rng.choice(heads)[: rng.choice((4, 12, 20))] + rng.choices(range(3, 200), k=6)
        prompts.append((prompt, SALTS[i % 2]))
    same = list(range(50, 67))  # four full blocks and a token
    return prompts + [(same, salt) for salt in SALTS]


def complete(url: str, model: str, prompt: list[int], salt: str | None) -> None:
    body: dict[str, Any] = {"model": model, "prompt": prompt, "max_tokens": 1}
    if salt is not None:
        body["cache_salt"] = salt
    response = httpx.post(f"{url}/v1/completions", json=body, timeout=WAIT_S)
    assert response.status_code == 200, response.text


def test_replicas_publish_their_cached_blocks_in_vllms_format(replicas):
    context: zmq.Context[Any] = zmq.Context()
    try:
        subscribers = []
        for _, server in replicas:
            kv_events = server.kv_events
            assert kv_events is not None and kv_events.replay_endpoint is not None
            subscribers.append(Subscriber(context, kv_events.endpoint, kv_events.replay_endpoint))
        prompts = workload()
        for prompt, salt in prompts:
            for background, server in replicas:
                complete(background.url, server.model_name, prompt, salt)
        views = []
        for (_, server), subscriber in zip(replicas, subscribers, strict=True):
            assert server.loop is not None and server.kv_events is not None
            publisher = server.kv_events
            # On the engine thread: the cached blocks, and how many batches carry the
            # events that led there.
            held, num_batches = server.loop.call(
                lambda engine, publisher=publisher: (cached_names(engine), publisher.num_batches)
            ).result(WAIT_S)
            subscriber.follow_until(num_batches)
            assert subscriber.view.next_sequence == num_batches
            assert subscriber.view.held == held
            assert subscriber.view.num_removed > 0  # the pool evicted
            views.append(subscriber.view)

            # A late subscriber replays from 0 and rebuilds the same state, byte for byte.
            late = Subscriber(context, publisher.endpoint, publisher.replay_endpoint)
            answered = late.replay_from(0)
            assert answered == list(range(num_batches))
            assert late.payloads == subscriber.payloads
            assert late.view.held == held

        # Every full block of every prompt was stored, named from its tokens and salt, on
        # both replicas (block_hash and radix) alike.
        tokens_of: dict[int, tuple[int, ...]] = {}
        parent_of: dict[int, int | None] = {}
        for prompt, salt in prompts:
            names = chain_hashes(prompt, salt)
            for i, name in enumerate(names):
                tokens_of[name] = tuple(prompt[i * BLOCK_SIZE : (i + 1) * BLOCK_SIZE])
                parent_of[name] = names[i - 1] if i else None
        for view in views:
            assert view.tokens_of == tokens_of
            assert view.parent_of == parent_of
        # The same tokens under three salts: three chains, no name in two, all stored.
        same = {name for salt in SALTS for name in chain_hashes(list(range(50, 67)), salt)}
        assert len(same) == 12
        for view in views:
            assert same <= view.tokens_of.keys()
    finally:
        context.destroy(linger=0)


def test_the_config_is_checked_by_name():
    with pytest.raises(ConfigError, match="did you mean 'serve.kv_events.enabled'"):
        compose_config(["serve.kv_events.enabeld=true"])
    with pytest.raises(ConfigError, match="serve.kv_events.buffer_steps must be >= 1"):
        Server(compose_config(["model=tiny", "serve.kv_events.enabled=true",
                               "serve.kv_events.buffer_steps=0"]))  # fmt: skip
    with pytest.raises(ConfigError, match="serve.kv_events.endpoint must be a ZMQ endpoint"):
        Server(compose_config(["model=tiny", "serve.kv_events.enabled=true",
                               "serve.kv_events.endpoint=localhost"]))  # fmt: skip


def test_an_endpoint_in_use_is_refused_by_name():
    engine = Engine.from_overrides(["model=tiny", "progress=false"])
    config = compose_config(["serve.kv_events.endpoint=tcp://*:*"]).serve.kv_events
    first = KVEventPublisher(engine, config)
    try:
        port = first.endpoint.rsplit(":", 1)[1]
        taken = compose_config([f"serve.kv_events.endpoint=tcp://*:{port}"]).serve.kv_events
        with pytest.raises(ConfigError, match="serve.kv_events.endpoint"):
            KVEventPublisher(Engine.from_overrides(["model=tiny", "progress=false"]), taken)
    finally:
        first.close()
