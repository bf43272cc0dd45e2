"""Continuous batching with chunked prefill, prefix-aware admission and preemption.

Each step spends a token budget: first one token for every decoding sequence, then chunks
of running prefills, then waiting requests while their uncached prompt fits the cache with
a watermark to spare: preempted ones first, in the order they went back, then new ones in
the order the queue plugin gives (``enginekit.interfaces.queue``; arrival order by
default), stopping at the first that does not fit. A prefill's blocks come with each
chunk, out of the blocks admission promised it (so a prefill never waits for memory). When
decodes cannot grow, the preemption plugin frees a victim and the scheduler requeues it at
the front.

Progress: a step with work queued is never empty. Where promises fall short (a sliding
window released a block another request still holds) the cache manager tops them up,
evicting cached blocks, and admission leaves the shortfall alone; where running requests
still block one another (prefills short of a block each, beams waiting for a sibling that
cannot come back), victims are preempted until something runs. Admission takes no
watermark while nothing runs, so a request ``add_request`` accepted (it fits the empty
pool) is always admitted eventually.
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, NamedTuple

from enginekit.config import SchedulerConfig
from enginekit.errors import ConfigError
from enginekit.interfaces.preemption import PreemptionMode
from enginekit.interfaces.scheduler_cache import Admission, SchedulerCache
from enginekit.interfaces.structures import IntBatch
from enginekit.metrics import PreemptionEvent, PrefixQuery, SchedulerStats
from enginekit.request import Request, RequestStatus, TokenLogprob
from enginekit.scheduler.beams import choose_continuations
from enginekit.scheduler.decode_batch import DecodeBatch
from enginekit.scheduler.decode_ops import decode_ops
from enginekit.scheduler.forks import Forker, num_sequences_to_fork
from enginekit.scheduler.plan import StepPlan, empty_output
from enginekit.step import Fork, ModelOutput, SchedulerOutput

if TYPE_CHECKING:
    from enginekit.interfaces import Preemption
    from enginekit.interfaces.queue import WaitingQueue


class StepUpdate(NamedTuple):
    """What changed when a step's tokens were applied, and what the scheduler did since
    the previous update (``stats``: admissions' prefix lookups, preemptions, swaps)."""

    finished: list[Request]
    first_tokens: list[Request]  # requests that got their first output token
    stats: SchedulerStats


class Scheduler:
    """Owns the waiting queue, the running list and the requests' states (status, computed
    tokens), and the running requests' computed tokens together
    (``num_running_computed_tokens``, what the cache manager's ``usage`` takes), kept at
    every change so that reading it costs nothing per request. ``running`` is in priority
    order (first admitted first). ``waiting`` holds the preempted requests first (a
    preempted request goes back to its front), then the fresh ones (never admitted) in
    arrival order; the queue plugin orders the fresh ones for admission. Preemption is the
    plugin's decision (which victim, swap or recompute) and this class's act.

    The running requests are split in two: those that decode and are not beams sit in a
    ``DecodeBatch`` (joined once a token of theirs is appended and only that one is left to
    compute), whose steps run as whole-batch operations; the rest (prefills, beams, and
    requests restored mid-decode until their next token is appended) are handled one by
    one. Between steps the two together hold exactly the running requests
    (``check_integrity``)."""

    def __init__(
        self,
        config: SchedulerConfig,
        cache: SchedulerCache,
        preemption: Preemption,
        eos_token_id: int | None = None,
        export_block_tables: bool = False,
        new_seq_id: Callable[[], int] | None = None,
        native: bool = True,
        queue: WaitingQueue | None = None,
    ) -> None:
        """``queue``: the order of fresh waiting requests (None: first come, first served,
        the ``WaitingQueue`` interface's defaults)."""
        if config.max_num_seqs < 1:
            raise ConfigError(f"scheduler.max_num_seqs must be >= 1, got {config.max_num_seqs}")
        if config.max_num_batched_tokens < config.max_num_seqs:
            raise ConfigError(
                "scheduler.max_num_batched_tokens "
                f"({config.max_num_batched_tokens}) must be >= scheduler.max_num_seqs "
                f"({config.max_num_seqs}) so every running sequence can decode each step"
            )
        self.config = config
        self.cache = cache
        self.preemption = preemption
        if queue is None:
            from enginekit.config import QueueConfig
            from enginekit.interfaces.queue import WaitingQueue

            queue = WaitingQueue(QueueConfig(name="fcfs"), cache)
        self.queue = queue
        self._counts_service = queue.counts_service
        self.eos_token_id = eos_token_id
        self.export_block_tables = export_block_tables
        self._forker = Forker(cache, new_seq_id or itertools.count(1 << 62).__next__)
        self._stats = SchedulerStats()
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self._num_running_computed = 0  # sum of num_computed_tokens over ``running``
        # native: the decode batch's per-step passes in Rust, else their Python spec
        self._batch = DecodeBatch(eos_token_id, cache.block_size, decode_ops(native))
        self._unbatched: list[Request] = []  # running requests not in the batch, in order
        # (batch version, members) the last step scheduled, checked by update
        self._scheduled_batch: tuple[int, int] | None = None
        # read once: an attribute of a config node costs tens of microseconds to read
        self._max_num_batched_tokens = config.max_num_batched_tokens
        self._max_num_seqs = config.max_num_seqs
        self._by_seq_id: dict[int, Request] = {}
        self._finished_seq_ids: list[int] = []
        self._preempted_seq_ids: list[int] = []
        self._num_steps = 0

    # -- queue -----------------------------------------------------------------------------

    def add_request(self, request: Request) -> None:
        """Queues an arrived request behind the others."""
        self.waiting.append(request)
        self._by_seq_id[request.seq_id] = request
        self.queue.on_arrived(request)

    @property
    def num_unfinished(self) -> int:
        return len(self.waiting) + len(self.running)

    @property
    def num_running_computed_tokens(self) -> int:
        """The running requests' ``num_computed_tokens``, added up: the tokens their block
        tables hold (``KVCacheManager.usage`` takes it). O(1)."""
        return self._num_running_computed

    def abort(self, root: Request) -> list[Request]:
        """Ends ``root``'s request now, with every sample or beam it forked: running ones
        give their blocks back, swapped-out ones their host blocks, waiting ones leave the
        queue; each is marked ABORTED (the executor forgets it at the next step). Returns
        the sequences aborted (none if the request had finished)."""
        group = [r for r in (root, *root.children) if not r.is_finished]
        if not group:
            return []
        members = set(map(id, group))
        for request in group:
            self._forker.settle(request)
            if request.status is RequestStatus.WAITING and not request.num_preemptions:
                self.queue.on_left(request)
            if request.status is RequestStatus.RUNNING:
                self._num_running_computed -= request.num_computed_tokens
            self.cache.release(request)
            request.status = RequestStatus.ABORTED
            self._by_seq_id.pop(request.seq_id, None)
            self._finished_seq_ids.append(request.seq_id)
        self.running = [r for r in self.running if id(r) not in members]
        self._unbatched = [r for r in self._unbatched if id(r) not in members]
        self._batch.remove(group)
        self.waiting = deque(r for r in self.waiting if id(r) not in members)
        return group

    # -- schedule --------------------------------------------------------------------------

    def schedule(self) -> SchedulerOutput:
        """Decides the next step's work and reserves its KV. Mutates the queues, the
        requests' ``num_computed_tokens`` (advanced by what is scheduled) and the cache.

        Never returns an empty step while a running request is stuck: when nothing could be
        scheduled (prefills whose promised blocks are held by one another, beams waiting
        for a sibling that cannot be brought back), the preemption plugin's victims are
        preempted until something runs. An empty step (nothing arrived yet) hands the
        executor nothing: its block operations and finished or preempted sequences wait for
        the next step that runs."""
        plan = StepPlan(self._max_num_batched_tokens)
        decodes, prefills = self._reserve_decodes()
        plan.num_batched = len(self._batch)
        plan.decodes = decodes
        plan.budget -= plan.num_batched + len(decodes)
        self._schedule_prefills(plan, prefills)
        self._admit_waiting(plan)
        num_unblocking = len(self.running)
        while plan.is_empty and self.running:
            if num_unblocking == 0:
                raise RuntimeError(  # a bug: a pool with every running request preempted fits
                    f"scheduler stuck after preempting every running request: "
                    f"{len(self.waiting)} waiting, {len(self.running)} running"
                )
            num_unblocking -= 1
            self._preempt(self.preemption.choose_victim(self.running))
            self._schedule_prefills(plan, self._running_prefills())
            self._admit_waiting(plan)
        if plan.is_empty:
            return empty_output(self._num_steps)
        return self._output(plan)

    def _running_prefills(self) -> list[Request]:
        return [r for r in self._unbatched if r.is_prefilling]

    def _schedule_prefills(self, plan: StepPlan, prefills: list[Request]) -> None:
        """A chunk of each of ``prefills`` that its promise and the budget allow, in order."""
        for request in prefills:
            if plan.budget <= 0:
                break
            self._schedule_chunk(plan, request)

    def _schedule_chunk(self, plan: StepPlan, request: Request) -> None:
        start = request.num_computed_tokens
        num_new = self.cache.reserve_prefill(request, min(request.num_tokens - start, plan.budget))
        if num_new == 0:
            return  # its promised blocks fell short (see KVCacheManager.reserve_prefill)
        plan.budget -= num_new
        plan.prefill_seq_ids.append(request.seq_id)
        plan.prefill_starts.append(start)
        plan.prefill_lens.append(num_new)
        plan.prefill_token_ids.append(request.token_ids[start : start + num_new])
        request.num_computed_tokens = start + num_new
        self._num_running_computed += num_new
        if self._counts_service:
            self.queue.on_served(request, num_new, 0)
        if start + num_new == request.num_tokens:
            plan.final_prefill_seq_ids.append(request.seq_id)
            if request.needs_fork:
                for k, child in enumerate(self._forker.fork_samples(request), start=1):
                    self._add_running(child)
                    plan.forks.append(Fork(request.seq_id, child.seq_id, k))
                    plan.final_prefill_seq_ids.append(child.seq_id)

    def _admit_waiting(self, plan: StepPlan) -> None:
        """Admits waiting requests while the budget, ``max_num_seqs`` and the cache allow,
        and schedules a first chunk of each (a swapped-out decode decodes): the preempted
        ones first, in order, then the fresh ones in the queue plugin's order; the first
        that does not fit stops admission. The preempted beams of one request are
        admitted together or not at all."""
        if not self._admit_preempted(plan):
            return
        max_num_seqs = self._max_num_seqs
        admitted: list[Request] = []
        for request in self.queue.order(self.waiting):
            if plan.budget <= 0 or len(self.running) >= max_num_seqs:
                break
            owed = num_sequences_to_fork(request)
            if len(self.running) + self._forker.num_owed + owed + 1 > max_num_seqs:
                break  # its samples or beams would not fit among the running sequences
            admission = self.cache.admit(request, not plan.is_empty)
            if admission is None:
                break
            admitted.append(request)
            self.queue.on_admitted(request)
            self._start(request, admission, plan, owed)
        if admitted:
            self._take_admitted(admitted)

    def _take_admitted(self, admitted: list[Request]) -> None:
        """Removes the fresh requests just admitted from ``waiting`` (only fresh ones are
        left there): the queue's head in arrival order (first come, first served), else
        wherever they are."""
        waiting = self.waiting
        if all(waiting[i] is request for i, request in enumerate(admitted)):
            for _ in admitted:
                waiting.popleft()
            return
        gone = set(map(id, admitted))
        self.waiting = deque(r for r in waiting if id(r) not in gone)

    def _admit_preempted(self, plan: StepPlan) -> bool:
        """Admits the preempted requests at the front of ``waiting`` in order, as
        ``_admit_waiting`` says; True if none is left waiting (fresh ones may follow)."""
        max_num_seqs = self._max_num_seqs
        while self.waiting and self.waiting[0].num_preemptions:
            if plan.budget <= 0 or len(self.running) >= max_num_seqs:
                return False
            request = self.waiting[0]
            if request.is_beam:
                group = self._waiting_beam_group(request)
                if len(group) > 1:
                    if len(self.running) + len(group) > max_num_seqs:
                        return False
                    admissions = self.cache.admit_together(group, not plan.is_empty)
                    if admissions is None:
                        return False
                    for beam, how in zip(group, admissions, strict=True):
                        self.waiting.popleft()
                        self._start(beam, how, plan)
                    continue
            owed = num_sequences_to_fork(request)
            if len(self.running) + self._forker.num_owed + owed + 1 > max_num_seqs:
                return False  # its samples or beams would not fit among the running sequences
            admission = self.cache.admit(request, not plan.is_empty)
            if admission is None:
                return False
            self.waiting.popleft()
            self._start(request, admission, plan, owed)
        return True

    def _start(self, request: Request, admission: Admission, plan: StepPlan, owed: int = 0) -> None:
        """``request``, just admitted (its caller takes it out of ``waiting``), runs, owing
        ``owed`` forked sequences: its first chunk is scheduled while the budget lasts (a
        request swapped out mid-decode decodes; a beam restored with its step done waits
        for its siblings); past the budget, it runs from the next step on."""
        self._count_admission(request, admission)
        request.status = RequestStatus.RUNNING
        self.running.append(request)
        self._num_running_computed += request.num_computed_tokens  # hit or restored
        self._unbatched.append(request)
        self._forker.owe(request, owed)
        if plan.budget <= 0:
            return
        if not admission.restored or request.is_prefilling:
            self._schedule_chunk(plan, request)
        elif request.num_tokens_to_compute:
            plan.decodes.append(request)  # swapped out mid-decode: it decodes on
            plan.budget -= 1

    def _count_admission(self, request: Request, admission: Admission) -> None:
        """Records what ``request``'s admission took from the cache: host blocks swapped
        back in, or its prefix lookup (and, at a first admission, its cached tokens)."""
        if admission.restored:
            self._stats.num_blocks_swapped_in += admission.num_blocks_swapped_in
            return
        if request.num_preemptions == 0:
            request.num_cached_tokens = admission.num_matched_tokens
        self._stats.prefix_queries.append(
            PrefixQuery(
                request.num_tokens, admission.num_matched_tokens, request.num_preemptions > 0
            )
        )

    def _waiting_beam_group(self, beam: Request) -> list[Request]:
        """Every waiting beam of the request that ``beam`` (the head of the queue) belongs
        to, ``beam`` first; moves them to the front of the queue in that order, so the group
        is admitted together rather than split by requests queued between its beams."""
        root = beam.parent or beam
        siblings = [r for r in self.waiting if r is not beam and (r.parent or r) is root]
        if siblings:
            others = [r for r in self.waiting if r is not beam and (r.parent or r) is not root]
            self.waiting = deque([beam, *siblings, *others])
        return [beam, *siblings]

    def _output(self, plan: StepPlan) -> SchedulerOutput:
        """The step's SchedulerOutput: the plan, the decodes' context lengths (the decodes'
        computed tokens advance to them) and the block operations queued since the last
        step that ran."""
        batch = self._batch
        decode_seq_ids = batch.seq_ids
        decode_context_lens: list[int] = []
        decode_token_ids = batch.last_token_ids
        if len(batch) != plan.num_batched:
            raise RuntimeError("the decode batch changed while the step was planned")
        # Decodes whose token fills a block, and their computed tokens: the cache may
        # publish those blocks.
        filled_requests: list[Request] = []
        filled_lens: list[int] = []
        if plan.num_batched:
            decode_context_lens, filled = batch.mark_scheduled()
            self._num_running_computed += plan.num_batched  # one token each (DecodeBatch)
            if filled:
                members = batch.requests
                filled_requests = [members[i] for i in filled]
                filled_lens = [decode_context_lens[i] for i in filled]
            self._scheduled_batch = (batch.version, plan.num_batched)
        decodes = plan.decodes
        if decodes:
            block_size = self.cache.block_size
            context_lens = [len(r.token_ids) for r in decodes]
            for request, num_computed in zip(decodes, context_lens, strict=True):
                self._num_running_computed += num_computed - request.num_computed_tokens
                request.num_computed_tokens = num_computed
                if num_computed % block_size == 0:
                    filled_requests.append(request)
                    filled_lens.append(num_computed)
            decode_seq_ids = decode_seq_ids + [r.seq_id for r in decodes]
            decode_context_lens = decode_context_lens + context_lens
            decode_token_ids = decode_token_ids + [r.token_ids[-1] for r in decodes]
        final_prefills = plan.final_prefill_seq_ids
        forks = self._forker.take_pending_forks() + plan.forks
        finished, self._finished_seq_ids = self._finished_seq_ids, []
        preempted, self._preempted_seq_ids = self._preempted_seq_ids, []
        self._num_steps += 1
        prefill_seq_ids = plan.prefill_seq_ids
        copies, swap_outs, swap_ins, block_tables, tier_saves, tier_loads = (
            self.cache.take_step_blocks(
                filled_requests,
                filled_lens,
                prefill_seq_ids + decode_seq_ids if self.export_block_tables else None,
            )
        )
        # Positional, in the fields' order: a call by keyword costs twice as much, every step.
        return SchedulerOutput(
            self._num_steps,  # step
            prefill_seq_ids,
            plan.prefill_starts,
            plan.prefill_lens,
            decode_seq_ids,
            decode_context_lens,
            # sample_seq_ids (the decodes' list itself when no prefill samples: never mutated)
            decode_seq_ids + final_prefills if final_prefills else decode_seq_ids,
            finished,  # finished_seq_ids
            preempted,  # preempted_seq_ids
            copies,  # block_copies
            swap_outs,
            swap_ins,
            block_tables,
            forks,
            plan.prefill_token_ids,
            decode_token_ids,
            tier_saves,
            tier_loads,
        )

    def _append(
        self,
        request: Request,
        token_id: int,
        finished: list[Request],
        first_tokens: list[Request],
    ) -> None:
        """Appends ``token_id`` to ``request`` and finishes it as ``Request.stop_status``
        says: on a stop token, EOS or max_tokens (collected into ``finished``)."""
        request.token_ids.append(token_id)
        if request.parent is None and request.num_output_tokens == 1:
            first_tokens.append(request)
        status = request.stop_status(token_id, self.eos_token_id)
        if status is not None:
            request.status = status
            finished.append(request)

    def _reserve_decodes(self) -> tuple[list[Request], list[Request]]:
        """Reserves one more token slot (and a copy of a block shared with forked samples)
        for every decoding request (one token left to compute, past its prompt),
        preempting the preemption plugin's victims until the rest fit. Returns (the decodes
        that run beside the batch's, the running requests still prefilling), in priority
        order."""
        decodes: list[Request] = []
        prefills: list[Request] = []
        joining: list[Request] = []
        for request in self._unbatched:
            num_left = len(request.token_ids) - request.num_computed_tokens
            if num_left == 1 and request.num_output_tokens > 0:
                # A beam, or a request left one token short of its outputs by a prefill
                # chunk the cache could not give (it decodes from now on: into the batch)
                (decodes if request.is_beam else joining).append(request)
            elif num_left > 0:
                prefills.append(request)
            # else: a beam whose step is done, waiting for a preempted sibling's
        batch = self._batch
        if joining:
            self._join_batch(joining)
        while decodes or batch.requests:
            if decodes:
                seq_ids: IntBatch = batch.seq_ids + [r.seq_id for r in decodes]
                num_tokens: IntBatch = batch.num_tokens() + [len(r.token_ids) for r in decodes]
            else:  # the common case: the batch's own arrays, read by Rust in one pass
                seq_ids, num_tokens = batch.seq_id_array, batch.num_token_array
            if self.cache.grow(
                seq_ids, num_tokens, batch.requests + decodes if decodes else batch.requests
            ):
                break
            self._preempt(self.preemption.choose_victim(self.running))
            decodes = [r for r in decodes if r.status is RequestStatus.RUNNING]
            prefills = [r for r in prefills if r.status is RequestStatus.RUNNING]
        return decodes, prefills

    def _join_batch(self, requests: list[Request]) -> None:
        """``requests`` (running, not beams) decode from now on: they move into the batch."""
        self._batch.add(requests)
        members = set(map(id, requests))
        self._unbatched = [r for r in self._unbatched if id(r) not in members]

    def _preempt(self, victim: Request) -> None:
        """Preempts ``victim`` as the plugin decides and requeues it at the front. A beam is
        preempted with every running beam of its request: beams advance in lockstep, so
        one left behind would hold the others' blocks while they wait for it."""
        group = [victim]
        if victim.is_beam:
            root = victim.parent or victim
            group = [r for r in self.running if (r.parent or r) is root]
        for request in reversed(group):  # lowest priority first: requeued in order
            self._forker.settle(request)
            self._num_running_computed -= request.num_computed_tokens
            self._stats.preemptions.append(self._preempt_one(request))
            request.status = RequestStatus.WAITING
            request.num_preemptions += 1
            self.running.remove(request)
            if request in self._unbatched:
                self._unbatched.remove(request)
            else:
                self._batch.remove([request])
            self.waiting.appendleft(request)
            self._preempted_seq_ids.append(request.seq_id)

    def _preempt_one(self, request: Request) -> PreemptionEvent:
        """Takes the request's blocks: swapped out if the plugin says so and the swap
        space has room (its computed tokens stay), else released (it computes everything
        again)."""
        mode = self.preemption.mode(request)
        num_swapped = self.cache.release(request, swap_out=mode is PreemptionMode.SWAP)
        if num_swapped is not None:
            self._stats.num_blocks_swapped_out += num_swapped
            return PreemptionEvent("swap", 0)
        num_dropped_tokens = request.num_computed_tokens
        request.num_computed_tokens = 0
        kind = "recompute_fallback" if mode is PreemptionMode.SWAP else "recompute"
        return PreemptionEvent(kind, num_dropped_tokens)

    # -- forks and beams -----------------------------------------------------------------

    def _add_running(self, child: Request) -> None:
        """A forked sequence joins the running list (behind its elders)."""
        self._by_seq_id[child.seq_id] = child
        self.running.append(child)
        self._num_running_computed += child.num_computed_tokens  # its parent's
        self._unbatched.append(child)

    def _advance_beams(
        self, root: Request, finished: list[Request], first_tokens: list[Request]
    ) -> None:
        """One beam-search step, once every live beam of ``root``'s request has its
        candidates: keeps the beam_width best continuations (``choose_continuations``). A
        beam with none is pruned (its blocks released); a beam with k forks k - 1 new
        beams that share its blocks, then takes the best one itself."""
        live = [r for r in (root, *root.unfinished_children()) if not r.is_finished]
        if any(r.candidates is None for r in live):
            return  # a beam was preempted before its step: wait for it
        self._forker.settle(root)  # its first step forks its beams
        chosen = choose_continuations(live, root.sampling.beam_width)
        for b, beam in enumerate(live):
            beam.candidates = None
            continuations = chosen.get(b)
            if not continuations:
                beam.status = RequestStatus.PRUNED
                finished.append(beam)
                continue
            for token, logprob in continuations[1:]:
                child = self._forker.fork_beam(root, beam)
                self._add_running(child)
                child.cumulative_logprob = beam.cumulative_logprob + logprob
                self._append(child, token, finished, first_tokens)
            token, logprob = continuations[0]
            beam.cumulative_logprob += logprob
            self._append(beam, token, finished, first_tokens)

    # -- update ----------------------------------------------------------------------------

    def _take_scheduled_batch(self) -> int:
        """How many of the step's samples, first in order, are the decode batch's; raises
        RuntimeError if the batch changed since the step was scheduled (its tokens would
        go to the wrong requests)."""
        scheduled, self._scheduled_batch = self._scheduled_batch, None
        if scheduled is None:
            return 0
        version, num_batched = scheduled
        if version != self._batch.version:
            raise RuntimeError("the decode batch changed between schedule() and update()")
        return num_batched

    def update(self, scheduled: SchedulerOutput, output: ModelOutput) -> StepUpdate:
        """Appends each sampled token (beams: chooses the best continuations) and, for a
        request that asked, its logprob entry; finishes requests that stop and releases
        their blocks. Mutates requests, queues and the cache."""
        by_seq_id = self._by_seq_id
        token_ids = output.next_token_ids
        sample_seq_ids = scheduled.sample_seq_ids
        if len(token_ids) != len(sample_seq_ids):
            raise ValueError(
                f"the executor returned {len(token_ids)} tokens for "
                f"{len(sample_seq_ids)} sampled sequences"
            )
        num_batched = self._take_scheduled_batch()
        if output.logprobs is not None:
            self._record_logprobs(sample_seq_ids, output.logprobs)
        if self._counts_service:
            for seq_id in sample_seq_ids:  # one output token (or beam step) each
                self.queue.on_served(by_seq_id[seq_id], 0, 1)
        finished = self._batch.append(token_ids[:num_batched]) if num_batched else []
        first_tokens: list[Request] = []
        beam_groups: list[Request] = []
        joining: list[Request] = []  # requests that decode from now on: into the batch
        candidates = output.candidates
        for i in range(num_batched, len(sample_seq_ids)):
            request = by_seq_id[sample_seq_ids[i]]
            if request.is_beam:
                assert candidates is not None, "the executor returned no beam candidates"
                request.candidates = candidates[i]
                root = request.parent or request
                if root not in beam_groups:
                    beam_groups.append(root)
            else:
                self._append(request, token_ids[i], finished, first_tokens)
                if not request.is_finished:
                    joining.append(request)
        for root in beam_groups:
            self._advance_beams(root, finished, first_tokens)
        if joining:
            self._join_batch(joining)
        if finished:
            for request in finished:
                self._forker.settle(request)
                self._num_running_computed -= request.num_computed_tokens
                del by_seq_id[request.seq_id]
                self._finished_seq_ids.append(request.seq_id)
            gone = set(map(id, finished))
            self.running = [r for r in self.running if id(r) not in gone]
            self._unbatched = [r for r in self._unbatched if id(r) not in gone]
        self.cache.finish_step(finished, self.running)
        stats, self._stats = self._stats, SchedulerStats()
        return StepUpdate(finished, first_tokens, stats)

    def _record_logprobs(
        self, sample_seq_ids: list[int], logprobs: Sequence[TokenLogprob | None]
    ) -> None:
        """Each sampled request that asked for logprobs gets its new token's entry (the
        token itself is appended by the same update)."""
        if len(logprobs) != len(sample_seq_ids):
            raise ValueError(
                f"the executor returned {len(logprobs)} logprobs for "
                f"{len(sample_seq_ids)} sampled sequences"
            )
        by_seq_id = self._by_seq_id
        for seq_id, entry in zip(sample_seq_ids, logprobs, strict=True):
            if entry is not None:
                recorded = by_seq_id[seq_id].output_logprobs
                if recorded is not None:
                    recorded.append(entry)

    # -- checks ----------------------------------------------------------------------------

    def check_integrity(self) -> None:
        """Raises RuntimeError unless, between steps, the decode batch and the requests
        outside it together hold exactly the running requests, each once, every batch
        member decodes, and ``num_running_computed_tokens`` is the running requests' sum."""
        self._batch.check()
        self.queue.check_integrity()
        num_computed = sum(r.num_computed_tokens for r in self.running)
        if num_computed != self._num_running_computed:
            raise RuntimeError(
                f"the running requests have {num_computed} computed tokens, but the "
                f"scheduler counts {self._num_running_computed}"
            )
        running = list(map(id, self.running))
        split = [*map(id, self._batch.requests), *map(id, self._unbatched)]
        if len(running) != len(set(running)) or sorted(running) != sorted(split):
            raise RuntimeError(
                f"{len(self.running)} running requests, but the decode batch holds "
                f"{len(self._batch)} and {len(self._unbatched)} are outside it"
            )
