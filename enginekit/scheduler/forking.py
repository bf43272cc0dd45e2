"""Forking: the samples of parallel sampling and the beams of beam search.

A request with ``n > 1`` forks its other samples when its prompt is computed; a beam search
forks and prunes beams at every step, in lockstep, on the executor's candidates. Forked
sequences share their parent's blocks (the KV manager copies a partly filled block before
a second writer writes into it). Admission keeps room under ``max_num_seqs`` for what a
request will fork.
"""

from __future__ import annotations

import dataclasses
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING

from enginekit.config import SchedulerConfig
from enginekit.request import Request, RequestStatus
from enginekit.step import Fork

if TYPE_CHECKING:
    from enginekit.kv.manager import KVCacheManager


class ForkingMixin:
    """The Scheduler's forking half; it uses the scheduler's queues and cache."""

    config: SchedulerConfig
    kv: KVCacheManager
    running: list[Request]
    waiting: deque[Request]
    _by_seq_id: dict[int, Request]
    _new_seq_id: Callable[[], int]
    _pending_forks: list[Fork]
    _owed: dict[int, int]
    _num_owed: int
    _append: Callable[[Request, int, list[Request], list[Request]], None]

    def _advance_beams(
        self, root: Request, finished: list[Request], first_tokens: list[Request]
    ) -> None:
        """One beam-search step, once every live beam of ``root``'s request has its
        candidates: keeps the beam_width continuations of highest total log-probability
        (ties: earlier beam, then likelier candidate). A beam with none is pruned (its
        blocks released); a beam with k forks k - 1 new beams that share its blocks, then
        takes the best one itself."""
        live = [r for r in (root, *root.unfinished_children()) if not r.is_finished]
        if any(r.candidates is None for r in live):
            return  # a beam was preempted before its step: wait for it
        self._settle_owed(root)  # its first step forks its beams
        options = sorted(
            (
                (beam.cumulative_logprob + logprob, b, c, token, logprob)
                for b, beam in enumerate(live)
                for c, (token, logprob) in enumerate(beam.candidates or ())
            ),
            key=lambda o: (-o[0], o[1], o[2]),
        )[: root.sampling.beam_width]
        chosen: dict[int, list[tuple[int, float]]] = {}
        for _, b, _, token, logprob in options:
            chosen.setdefault(b, []).append((token, logprob))
        for b, beam in enumerate(live):
            beam.candidates = None
            continuations = chosen.get(b)
            if not continuations:
                beam.status = RequestStatus.PRUNED
                finished.append(beam)
                continue
            for token, logprob in continuations[1:]:
                child = self._new_beam(root, beam)
                child.cumulative_logprob = beam.cumulative_logprob + logprob
                self._append(child, token, finished, first_tokens)
            token, logprob = continuations[0]
            beam.cumulative_logprob += logprob
            self._append(beam, token, finished, first_tokens)

    def _new_beam(self, root: Request, beam: Request) -> Request:
        """A new running beam of ``root``'s request: a copy of ``beam``'s tokens, sharing
        its blocks (forked in the executor at the next step)."""
        child = Request(
            request_id=f"{root.request_id}#{len(root.children) + 1}",
            seq_id=self._new_seq_id(),
            prompt_token_ids=root.prompt_token_ids,
            sampling=beam.sampling,
            arrival_time=root.arrival_time,
            extra_key=root.extra_key,
            parent=root,
        )
        child.token_ids = list(beam.token_ids)
        self.kv.fork(beam, child)
        child.status = RequestStatus.RUNNING
        root.add_child(child)
        self._by_seq_id[child.seq_id] = child
        self.running.append(child)
        self._pending_forks.append(Fork(beam.seq_id, child.seq_id, len(root.children)))
        return child

    def _fork(self, parent: Request) -> list[Request]:
        """Creates the other n - 1 samples of ``parent``, whose prompt is being computed
        in full this step: each shares its blocks and is sampled from its logits."""
        children = []
        seed = parent.sampling.seed
        for k in range(1, parent.sampling.n):
            child = Request(
                request_id=f"{parent.request_id}#{k}",
                seq_id=self._new_seq_id(),
                prompt_token_ids=parent.prompt_token_ids,
                sampling=dataclasses.replace(
                    parent.sampling, n=1, seed=None if seed is None else seed + k
                ),
                arrival_time=parent.arrival_time,
                extra_key=parent.extra_key,
                parent=parent,
            )
            self.kv.fork(parent, child)
            child.status = RequestStatus.RUNNING
            parent.add_child(child)
            self._by_seq_id[child.seq_id] = child
            self.running.append(child)
            children.append(child)
        self._settle_owed(parent)
        return children

    @staticmethod
    def _num_sequences_owed(request: Request) -> int:
        """Sequences ``request`` will fork once running: n - 1 samples, beam_width - 1 beams."""
        if request.parent is not None or request.children:
            return 0
        return max(request.sampling.n if request.needs_fork else 1, request.sampling.beam_width) - 1

    def _settle_owed(self, request: Request) -> None:
        """``request`` forked what it owed, or left the running list before it could."""
        self._num_owed -= self._owed.pop(request.seq_id, 0)

    def _beams_fit(self, request: Request) -> bool:
        """For a preempted beam: whether the blocks to bring back every waiting beam of its
        request fit now (they are admitted together, or a beam admitted alone could hold
        blocks while it waits for the others). Counted without prefix hits: from above."""
        root = request.parent or request
        group = [r for r in self.waiting if (r.parent or r) is root]
        if len(group) < 2:
            return True
        if len(self.running) + len(group) > self.config.max_num_seqs:
            return False
        needed = sum(self.kv.num_blocks_to_admit_alone(r) for r in group)
        return needed + self.kv.admission_watermark() <= self.kv.num_reclaimable_blocks()
