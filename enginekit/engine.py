"""Engine: the one place where config, plugins, cache, scheduler and executor meet.

engine = Engine.from_overrides(["+prefix=block_hash", "cache.num_blocks=4096"])
engine.add_request([1, 2, 3], SamplingParams(max_tokens=8))
result = engine.run()

(A configured workload runs through ``enginekit.driver.WorkloadDriver``, which uses this
public API only.)
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import heapq
import itertools
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from omegaconf import DictConfig, OmegaConf

from enginekit.admission import ServingLimits, check_arguments, check_servable
from enginekit.config import PLUGIN_GROUPS, EngineConfig, TierConfig
from enginekit.errors import ConfigError, InvalidRequestError, RequestRejectedError
from enginekit.executor.factory import build_executor, executor_eos_token_id, model_shape
from enginekit.interfaces.backend import Backend
from enginekit.interfaces.eviction import AttentionSpan
from enginekit.interfaces.tier import KVTier, TierContext, check_tier_names, tier_names
from enginekit.kv.backend import make_backend, make_context
from enginekit.kv.manager import KVCacheManager
from enginekit.kv.tiers import TierStack
from enginekit.metrics import RunMetrics
from enginekit.plugins import PluginInfo, complete_plugin_config, find_plugin, load_plugin
from enginekit.request import (
    Request,
    RequestOutput,
    RequestStatus,
    SamplingParams,
    as_priority,
    as_user,
)
from enginekit.scheduler.plan import empty_output
from enginekit.scheduler.scheduler import Scheduler, StepUpdate
from enginekit.spec.hardware import HardwareSpec, hardware_preset
from enginekit.spec.kv import KVSpec, swap_space_num_blocks
from enginekit.spec.model import ModelShape, resolve_dtype
from enginekit.spec.restore_cost import RestoreCost
from enginekit.step import KVUsage, SchedulerOutput
from enginekit.tokenizer import SentencePieceTokenizer, Tokenizer
from enginekit.workloads.ideal import ideal_prefix_hit_tokens

FRAGMENTATION_SAMPLE_STEPS = 16  # external fragmentation is sampled (it scans the pool)
DTYPE_BITS = {"bfloat16": 16, "float16": 16, "float32": 32}


@dataclass(frozen=True)
class RunResult:
    outputs: list[RequestOutput]  # in the order requests were added
    summary: dict[str, Any]


def _as_engine_config(config: EngineConfig | DictConfig | None) -> DictConfig:
    """A DictConfig typed by EngineConfig (so bad keys and types are refused)."""
    schema = OmegaConf.structured(EngineConfig)
    if config is None:
        return schema
    if isinstance(config, EngineConfig):
        return OmegaConf.structured(config)
    merged = OmegaConf.merge(schema, config)
    assert isinstance(merged, DictConfig)
    return merged


class Engine:
    """Serves requests step by step over the configured plugins and executor.

    Time is the executor's: simulated seconds for ``sim``. A request arrives at its
    ``arrival_time`` (default: now) and is scheduled only from then on.

    ``backend``: the cache structures, the Rust ones by default. The tests and benchmarks
    pass their pure-Python reference twins (``make_backend(native=False)``) to run a whole
    engine on them; no configuration selects them.
    """

    def __init__(
        self, config: EngineConfig | DictConfig | None = None, backend: Backend | None = None
    ) -> None:
        cfg = _as_engine_config(config)
        backend = make_backend(native=True) if backend is None else backend
        self.config = cfg
        plugins = {group: complete_plugin_config(group, cfg[group]) for group in PLUGIN_GROUPS}
        selected = {group: plugin_cls for group, (plugin_cls, _) in plugins.items()}
        for plugin_cls in selected.values():
            plugin_cls.check_compatible(selected)
        self.plugin_configs = {group: plugin_cfg for group, (_, plugin_cfg) in plugins.items()}
        self.plugin_infos: dict[str, PluginInfo] = {
            group: find_plugin(group, plugin_cfg.name)
            for group, plugin_cfg in self.plugin_configs.items()
        }
        allocator_cls, allocator_cfg = plugins["allocator"]
        prefix_cls, prefix_cfg = plugins["prefix"]
        quantizer_cls, quantizer_cfg = plugins["quantizer"]
        eviction_cls, eviction_cfg = plugins["eviction"]
        preemption_cls, preemption_cfg = plugins["preemption"]
        queue_cls, queue_cfg = plugins["queue"]
        tier_cfg = plugins["tier"][1]
        assert isinstance(tier_cfg, TierConfig)

        shape = model_shape(cfg.model)
        self.shape = _attending(shape, eviction_cls.attention(eviction_cfg, shape.sliding_window))
        self.max_model_len = self.shape.max_model_len
        model_bits = _dtype_bits(resolve_dtype(cfg.model.dtype, self.shape))
        self.kv_spec = KVSpec.of(
            self.shape,
            bits_per_element=model_bits,
            block_size=cfg.cache.block_size,
            quant=quantizer_cls(quantizer_cfg).kv_quant(self.shape, cfg.cache.block_size),
        )
        if not 0.0 <= cfg.cache.watermark < 1.0:
            raise ConfigError(f"cache.watermark must be in [0, 1), got {cfg.cache.watermark}")

        swap_space_gib = preemption_cls.swap_space_gib(preemption_cfg)
        self.executor, num_blocks = build_executor(
            cfg, self.shape, self.kv_spec, model_bits, swap_space_gib
        )
        attention = AttentionSpan(self.shape.sliding_window, self.shape.attention_sinks)
        context = make_context(backend, num_blocks, self.kv_spec, self.max_model_len, attention)
        hardware = hardware_preset(cfg.hardware.name)
        costs = RestoreCost.of(hardware, self.shape, self.kv_spec)
        block_bytes = self.executor.tier_payload_bytes() or self.kv_spec.bytes_per_block
        tiers = _build_tiers(tier_cfg, cfg, self.kv_spec, block_bytes, backend, hardware, costs)
        if tiers is not None:
            self.executor.attach_tiers([level.bytes_per_s for level in tiers.levels])
        self.cache = KVCacheManager(
            context,
            allocator_cls(allocator_cfg, context),
            prefix_cls(prefix_cfg, context),
            eviction_cls(eviction_cfg, context),
            watermark=cfg.cache.watermark,
            num_swap_blocks=swap_space_num_blocks(
                swap_space_gib, self.kv_spec.bytes_per_block, num_blocks
            ),
            tiers=tiers,
        )
        self.scheduler = Scheduler(
            cfg.scheduler,
            self.cache,
            preemption_cls(preemption_cfg, costs, self.cache),
            eos_token_id=executor_eos_token_id(self.executor),
            export_block_tables=self.executor.needs_block_tables,
            new_seq_id=lambda: next(self._seq_ids),
            native=backend.name == "native",
            queue=queue_cls(queue_cfg, self.cache),
        )
        self.limits = ServingLimits(
            self.max_model_len,
            self.shape.vocab_size,
            cfg.scheduler.max_num_seqs,
            cfg.executor,
            self.executor.supports_forks,
            self.executor.supports_beam_search,
            self.executor.has_distribution,
            self.executor.prepare_structured,
        )
        self.metrics = RunMetrics()
        self.clock = 0.0
        self._pending: list[tuple[float, int, Request]] = []  # heap by arrival time
        self._requests: dict[str, Request] = {}
        self._seq_ids = itertools.count()

    @classmethod
    def from_overrides(
        cls, overrides: Sequence[str] = (), backend: Backend | None = None
    ) -> Engine:
        """An engine built from the same override strings the command line takes (and
        ``backend``, as for the constructor)."""
        from enginekit.app import compose_config

        return cls(compose_config(list(overrides)), backend)

    # -- requests --------------------------------------------------------------------------

    def add_request(
        self,
        prompt_token_ids: Sequence[int] | str,
        sampling: SamplingParams | None = None,
        *,
        request_id: str | None = None,
        arrival_time: float | None = None,
        extra_key: bytes | str | None = None,
        scripted_output_ids: Sequence[int] | None = None,
        priority: int = 0,
        user: str | None = None,
    ) -> str:
        """Queues a request; returns its id. The prompt is a sequence of token ids (ints;
        numpy integer arrays too) or a text, tokenized with the tokenizer of ``model.path``
        (ConfigError for a model without a folder). ``extra_key`` salts the prefix cache
        (requests share cached blocks only with the same salt): bytes, or a str, which
        stands for its UTF-8 bytes. ``priority`` (an int, lower served first) orders the
        queue under ``+queue=priority``; any other queue refuses a priority other than 0
        (InvalidRequestError). ``user`` names the tenant ``+queue=fair`` shares service
        among (default: the salt, else one shared tenant). ``arrival_time`` (seconds;
        default: now) is clamped at 0. Raises, queuing nothing, InvalidRequestError for an
        argument of the wrong type or value (naming it) or sampling that needs a
        next-token distribution the executor lacks (``Executor.has_distribution``),
        RequestRejectedError if the request can never be served: empty, a token outside
        the vocabulary (prompt or script), prompt plus max_tokens beyond the model's
        context, or more blocks than the whole cache. Whatever it accepts, no later step
        raises for it. ``prompt_logprobs`` are computed when the request arrives
        (``Executor.score_prompt``)."""
        if request_id is not None and not isinstance(request_id, str):
            raise InvalidRequestError(
                f"request_id must be a str or None, got {type(request_id).__name__}"
            )
        seq_id = next(self._seq_ids)
        if request_id is None:
            request_id = str(seq_id)
            while request_id in self._requests:  # a caller's own id took this number
                seq_id = next(self._seq_ids)
                request_id = str(seq_id)
        elif request_id in self._requests:
            raise RequestRejectedError(f"request id {request_id!r} is already in use")
        try:
            args = check_arguments(
                request_id,
                self.tokenizer.encode if isinstance(prompt_token_ids, str) else None,
                self.shape.vocab_size,
                prompt_token_ids,
                sampling,
                arrival_time,
                extra_key,
                scripted_output_ids,
            )
            check_servable(
                request_id, args.prompt_token_ids, args.sampling, self.limits, self.cache
            )
        except RequestRejectedError:
            self.metrics.on_request_rejected()
            raise
        try:
            request = Request(
                request_id=request_id,
                seq_id=seq_id,
                prompt_token_ids=args.prompt_token_ids,
                sampling=args.sampling,
                arrival_time=self.clock if args.arrival_time is None else args.arrival_time,
                extra_key=args.extra_key,
                scripted_output_ids=args.scripted_output_ids,
                priority=as_priority(priority),
                user=as_user(user),
            )
        except InvalidRequestError as exc:
            raise InvalidRequestError(f"request {request_id!r}: {exc}") from None
        self.scheduler.queue.check_request(request)
        self._requests[request_id] = request
        heapq.heappush(self._pending, (request.arrival_time, seq_id, request))
        return request_id

    # -- running ---------------------------------------------------------------------------

    def has_unfinished_requests(self) -> bool:
        return bool(self._pending) or self.scheduler.num_unfinished > 0

    @property
    def num_waiting(self) -> int:
        """Requests in the scheduler's queue: arrived (at an earlier step) and not
        running, preempted ones included. The scheduler admits from its front, at most
        ``scheduler.max_num_seqs`` a step."""
        return len(self.scheduler.waiting)

    def kv_usage(self) -> KVUsage:
        """The KV cache's block and slot counts by state now (``KVCacheManager.usage``, given
        the scheduler's count of its running requests' computed tokens). Pure."""
        return self.cache.usage(self.scheduler.num_running_computed_tokens)

    def abort_request(self, request_id: str) -> bool:
        """Ends the request now, with all its samples or beams, wherever it is: not yet
        arrived, waiting, swapped out or running (its blocks are released at once; the
        executor forgets it at the next step). Its output keeps the tokens it has, with
        finish reason ``abort``. Returns False, changing nothing, for a request that has
        already finished. Raises KeyError for an unknown id."""
        root = self._requests[request_id]
        if root.is_group_finished:
            return False
        if any(entry[2] is root for entry in self._pending):
            self._pending = [entry for entry in self._pending if entry[2] is not root]
            heapq.heapify(self._pending)
            root.status = RequestStatus.ABORTED
        else:
            self.scheduler.abort(root)
            self.metrics.on_request_aborted(root.seq_id, self.clock)
        root.finish_time = self.clock
        return True

    def step(self) -> list[RequestOutput]:
        """Runs one step: the requests that have arrived join the queue, the scheduler
        plans the step, the executor runs it, the scheduler applies its tokens, and the
        metrics record it. Returns the requests whose every sample finished in it."""
        self._admit_arrivals()
        scheduled = self.scheduler.schedule()
        if scheduled.is_empty:
            self._write_down()
            self._wait_for_arrivals()
            return []
        output = self.executor.execute(scheduled)
        if scheduled.tier_saves:
            self.cache.complete_tier_saves(output.saved_payloads)
        self.clock += output.step_time_s
        update = self.scheduler.update(scheduled, output)
        finished = self._finish(update)
        self._record(scheduled, output.step_time_s, update)
        if not self.has_unfinished_requests():
            self._write_down()  # what the last requests released
        return finished

    def _write_down(self) -> None:
        """While nothing else runs (an empty step, or no request left): the blocks queued
        to be written down to a KV tier are read out by a step that computes nothing and
        stored, so that they do not wait for a request that may never come (another
        replica may want them now)."""
        if not self.cache.has_queued_tier_saves:
            return
        saves = empty_output(self.metrics.num_steps)._replace(
            tier_saves=self.cache.take_tier_saves()
        )
        output = self.executor.execute(saves)
        self.cache.complete_tier_saves(output.saved_payloads)

    def _admit_arrivals(self) -> None:
        if not self.scheduler.num_unfinished and self._pending:
            self.clock = max(self.clock, self._pending[0][0])  # idle: jump to next arrival
        while self._pending and self._pending[0][0] <= self.clock:
            _, _, request = heapq.heappop(self._pending)
            self.executor.add_sequence(
                request.seq_id,
                request.prompt_token_ids,
                request.sampling,
                request.scripted_output_ids,
            )
            num_top = request.sampling.prompt_logprobs
            if num_top is not None:  # once: a preemption or a prefix hit changes nothing
                request.prompt_logprobs = self.executor.score_prompt(
                    request.prompt_token_ids, num_top
                )
            self.metrics.on_request_added(
                request.seq_id, request.arrival_time, request.num_prompt_tokens, request.tenant
            )
            self.scheduler.add_request(request)

    def _wait_for_arrivals(self) -> None:
        """After an empty step: the clock moves to the next arrival. Raises RuntimeError (a
        bug, not bad input: admission checks rule it out) if nothing will ever arrive
        while requests wait."""
        if self._pending:
            self.clock = max(self.clock, self._pending[0][0])
        elif self.scheduler.num_unfinished:
            raise RuntimeError(
                "scheduler made no progress with requests waiting and nothing running"
            )

    def _finish(self, update: StepUpdate) -> list[RequestOutput]:
        """Stamps the step's first tokens and finished sequences with the clock; returns the
        outputs of the requests (roots) whose every sample has now finished."""
        for request in update.first_tokens:
            request.first_token_time = self.clock
            if request.parent is None:
                self.metrics.on_first_token(request.seq_id, self.clock, request.num_cached_tokens)
        roots: list[Request] = []
        outputs: list[RequestOutput] = []
        for request in update.finished:
            request.finish_time = self.clock
            root = request.parent or request
            if root.is_group_finished and root not in roots:
                roots.append(root)
                output = RequestOutput.of(root)
                outputs.append(output)
                num_outputs = sum(map(len, output.samples))
                self.metrics.on_request_finished(root.seq_id, self.clock, num_outputs)
        return outputs

    def _record(self, scheduled: SchedulerOutput, step_time_s: float, update: StepUpdate) -> None:
        """Feeds the step to the metrics: the scheduler's stats and the cache's usage."""
        scheduler = self.scheduler
        self.metrics.on_scheduler_stats(update.stats)
        self.metrics.on_step(
            self.clock,
            step_time_s,
            sum(scheduled.prefill_lens),
            len(scheduled.decode_seq_ids),
            len(scheduler.running),
            len(scheduler.waiting),  # arrived and not running: none of self._pending
            self.kv_usage(),
        )
        if self.metrics.num_steps % FRAGMENTATION_SAMPLE_STEPS == 1:
            unusable = self.cache.allocator.num_unusable_free_blocks()
            if unusable is not None:
                self.metrics.on_fragmentation(unusable)

    def run(self, progress: bool = False) -> RunResult:
        """Steps until every request has finished."""
        bar = None
        if progress:
            from tqdm import tqdm

            bar = tqdm(total=len(self._requests), unit="req", desc="enginekit", leave=False)
        while self.has_unfinished_requests():
            finished = self.step()
            if bar is not None and finished:
                bar.update(len(finished))
        if bar is not None:
            bar.close()
        return RunResult(self.outputs(), self.summary())

    # -- results ---------------------------------------------------------------------------

    @functools.cached_property
    def tokenizer(self) -> Tokenizer | SentencePieceTokenizer:
        """The model's tokenizer (``Tokenizer.of_model``: ``model.path``'s, or the shipped
        SentencePiece vocabulary for ``tiny``), loaded on first use. ConfigError if none."""
        return Tokenizer.of_model(self.config.model.path, self.shape.vocab_size)

    def decode(self, token_ids: Sequence[int]) -> str:
        """Text of ``token_ids`` (e.g. ``output(request_id).output_token_ids``)."""
        return self.tokenizer.decode(list(token_ids))

    def outputs(self) -> list[RequestOutput]:
        return [RequestOutput.of(r) for r in self._requests.values()]

    def output(self, request_id: str) -> RequestOutput:
        return RequestOutput.of(self._requests[request_id])

    def summary(self, *, ideal_hit_tokens: int | None = None) -> dict[str, Any]:
        """The run's metrics. The ideal hit count is at the prefix cache's own granularity:
        tokens for a token-granular cache (radix), whole blocks otherwise; computed over
        the requests the engine still holds, unless the caller, who saw every request
        (released ones too), passes ``ideal_hit_tokens`` at that granularity. A run with KV
        tiers adds ``metric_keys.ADDED_WITH_TIERS``: the hits by source (the device's are
        the prefix-cache hits less the tokens loaded from the levels) and each level's
        counters."""
        token_granular = self.cache.prefix.token_granular
        if ideal_hit_tokens is None:
            ideal_hit_tokens = self.ideal_prefix_hit_tokens(1 if token_granular else None)
        summary = self.metrics.summary(
            self.kv_spec.bytes_per_block, ideal_hit_tokens=ideal_hit_tokens
        )
        summary["prefix_cache_ideal_granularity"] = "token" if token_granular else "block"
        tiers = self.cache.tiers
        if tiers is not None:  # what each level below the pool did (metric_keys)
            from enginekit import metric_keys as mk

            stats = self.cache.tier_stats()
            block_size = self.kv_spec.block_size
            loaded = {s.name: s.num_hit_blocks * block_size for s in stats}
            device = self.metrics.prefix_cache_hits - sum(loaded.values())
            summary[mk.KV_TIER_HITS_BY_SOURCE.key] = {"device": device, **loaded}
            for key, attribute in (
                (mk.KV_TIER_LOADED_BYTES, "num_loaded_bytes"),
                (mk.KV_TIER_WRITTEN_BYTES, "num_written_bytes"),
                (mk.KV_TIER_LOAD_TIME_S, "load_time_s"),
                (mk.KV_TIER_EVICTED_BLOCKS, "num_evicted_blocks"),
                (mk.KV_TIER_FAILURES, "num_failures"),
            ):
                summary[key.key] = {s.name: getattr(s, attribute) for s in stats}
            summary[mk.KV_TIER_LOADS_AVOIDED_BLOCKS.key] = tiers.num_avoided_blocks
            summary[mk.KV_TIER_BLOCKS.key] = {s.name: s.num_blocks for s in stats}
            summary[mk.KV_TIER_CAPACITY_BLOCKS.key] = {s.name: s.capacity_blocks for s in stats}
        return summary

    def describe(self) -> dict[str, Any]:
        """Where and with what the run happens: plugins, model, KV layout, executor."""
        info: dict[str, Any] = {
            group: f"{i.name} ({i.distribution} {i.version})"
            for group, i in self.plugin_infos.items()
        }
        info.update(
            model=self.shape.name,
            max_model_len=self.max_model_len,
            block_size=self.kv_spec.block_size,
            kv_bytes_per_token=self.kv_spec.bytes_per_token,
            executor=self.config.executor,
        )
        if self.cache.tiers is not None:
            info.update(
                tier_levels=", ".join(self.cache.tiers.names),
                tier_write_policy=self.cache.tiers.write_policy,
            )
        info.update(self.executor.describe())
        return info

    def check_integrity(self) -> None:
        """Raises KVCacheError if any cache structure is inconsistent, RuntimeError if the
        scheduler's running requests are."""
        self.cache.check_integrity()
        self.scheduler.preemption.check_integrity()
        self.scheduler.check_integrity()

    def ideal_prefix_hit_tokens(self, block_size: int | None = None) -> int:
        """Hits a perfect, unbounded prefix cache of ``block_size`` granularity (default:
        the cache's) would get on the requests added so far, each seeing the prompts and
        outputs of every request that arrived before it."""
        return ideal_prefix_hit_tokens(
            list(self._requests.values()),
            block_size or self.kv_spec.block_size,
            include_outputs=True,
        )

    # -- long-running callers --------------------------------------------------------------

    def finish_request(self, request_id: str) -> bool:
        """Ends the request now as finished with reason ``stop``, with all its samples: for a
        stop condition the engine does not see (a caller that matches stop strings in the
        text). Unlike ``abort_request`` it counts as finished: its tokens and latencies
        enter the summary. Its blocks are released at once, published ones staying cached;
        the samples that had already finished keep their reasons. A request that has not
        yet arrived is aborted instead (it has no tokens to count). Returns False, changing
        nothing, for a request that has already finished. Raises KeyError for an unknown
        id."""
        root = self._requests[request_id]
        if root.is_group_finished:
            return False
        if any(entry[2] is root for entry in self._pending):
            return self.abort_request(request_id)
        for request in self.scheduler.abort(root):
            request.status = RequestStatus.FINISHED_STOPPED
            request.finish_time = self.clock
        root.finish_time = self.clock
        num_outputs = sum(map(len, RequestOutput.of(root).samples))
        self.metrics.on_request_finished(root.seq_id, self.clock, num_outputs)
        return True

    def release_request(self, request_id: str) -> RequestOutput:
        """Forgets a finished request and returns its final output, so that a caller that
        serves for a long time (the HTTP server) keeps only live requests in memory. Its
        metrics stay counted in ``summary()``; ``outputs()``, ``output()`` and
        ``ideal_prefix_hit_tokens`` no longer see it. Raises KeyError for an unknown id,
        InvalidRequestError (changing nothing) for a request still live."""
        root = self._requests[request_id]
        if not root.is_group_finished:
            raise InvalidRequestError(
                f"request {request_id!r} has not finished: abort or finish it first"
            )
        del self._requests[request_id]
        return RequestOutput.of(root)


def _build_tiers(
    tier_cfg: TierConfig,
    cfg: DictConfig,
    kv_spec: KVSpec,
    block_bytes: int,
    backend: Backend,
    hardware: HardwareSpec,
    costs: RestoreCost,
) -> TierStack | None:
    """The KV tier levels ``tier_cfg`` asks for (None for ``none``), built through the
    plugin registry, each checked as it is built (room, folder, server: ConfigError);
    ``block_bytes``: one block's payload, as the executor reads it out."""
    names = tier_names(tier_cfg)
    check_tier_names(names)
    if not names:
        return None
    moves_data = cfg.executor != "sim"
    identity = "|".join(
        str(part)
        for part in (
            cfg.model.name,
            cfg.model.path,
            cfg.model.seed,
            cfg.model.dtype,
            kv_spec,
        )
    )
    digest = hashlib.blake2b(identity.encode(), digest_size=8).hexdigest()
    context = TierContext(
        block_bytes=block_bytes,
        namespace=f"enginekit-{digest}",
        moves_data=moves_data,
        link_bytes_per_s=hardware.effective_pcie_bandwidth,
        host_memory_bytes=_available_memory() if moves_data else hardware.host_memory,
    )
    levels: list[KVTier] = []
    try:
        for name in names:
            levels.append(load_plugin("tier", name)(tier_cfg, context))
    except BaseException:
        for level in levels:
            level.close()
        raise
    return TierStack(
        levels,
        names,
        backend,
        kv_spec.block_size,
        block_bytes,
        tier_cfg.write_policy,
        costs if tier_cfg.load_or_recompute else None,
    )


def _available_memory() -> int:
    """Bytes of memory this machine has available now."""
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def _attending(shape: ModelShape, attention: AttentionSpan) -> ModelShape:
    """The shape the executors run: with the attention window and sinks the eviction policy
    asked for (``Eviction.attention``; a window on a model without one makes its attention
    windowed: an approximation)."""
    if (attention.window, attention.sinks) == (shape.sliding_window, shape.attention_sinks):
        return shape
    return dataclasses.replace(
        shape, sliding_window=attention.window, attention_sinks=attention.sinks
    )


def _dtype_bits(dtype: str) -> int:
    try:
        return DTYPE_BITS[dtype]
    except KeyError:
        raise ConfigError(
            f"model.dtype={dtype!r} is not supported; choose: {', '.join(DTYPE_BITS)}"
        ) from None
