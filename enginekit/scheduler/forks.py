"""Forks: the samples of parallel sampling and the beams of beam search, and the ledger of
sequences that running requests will still fork.

A request with ``n > 1`` forks its other samples when its prompt is computed; a beam search
forks and prunes beams at every step, in lockstep, on the executor's candidates. Forked
sequences share their parent's blocks (the cache manager copies a partly filled block
before a second writer writes into it). Admission keeps room under ``max_num_seqs`` for
what a request will fork (``num_owed``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from enginekit.interfaces.scheduler_cache import SchedulerCache
from enginekit.request import Request, RequestStatus
from enginekit.step import Fork


def num_sequences_to_fork(request: Request) -> int:
    """Sequences ``request`` will fork once running: n - 1 samples, beam_width - 1 beams."""
    if request.parent is not None or request.children:
        return 0
    return max(request.sampling.n if request.needs_fork else 1, request.sampling.beam_width) - 1


class Forker:
    """Creates forked sequences and owns the ledger of what running requests still owe
    (seq_id -> sequences, and their total), and the beam forks made after a step that the
    executor learns of at the next one."""

    def __init__(self, cache: SchedulerCache, new_seq_id: Callable[[], int]) -> None:
        self._cache = cache
        self._new_seq_id = new_seq_id
        self._owed: dict[int, int] = {}
        self.num_owed = 0
        self._pending_forks: list[Fork] = []

    def owe(self, request: Request, num_sequences: int) -> None:
        """The admitted ``request`` will fork ``num_sequences`` sequences."""
        if num_sequences:
            self._owed[request.seq_id] = num_sequences
            self.num_owed += num_sequences

    def settle(self, request: Request) -> None:
        """``request`` forked what it owed, or left the running list before it could."""
        self.num_owed -= self._owed.pop(request.seq_id, 0)

    def fork_samples(self, parent: Request) -> list[Request]:
        """The other n - 1 samples of ``parent``, whose prompt is being computed in full
        this step: each shares its blocks, runs, and is sampled from its logits."""
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
            self._cache.fork(parent, child)
            child.status = RequestStatus.RUNNING
            parent.add_child(child)
            children.append(child)
        self.settle(parent)
        return children

    def fork_beam(self, root: Request, beam: Request) -> Request:
        """A new running beam of ``root``'s request: a copy of ``beam``'s tokens, sharing
        its blocks (forked in the executor at the next step: ``take_pending_forks``)."""
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
        self._cache.fork(beam, child)
        child.status = RequestStatus.RUNNING
        root.add_child(child)
        self._pending_forks.append(Fork(beam.seq_id, child.seq_id, len(root.children)))
        return child

    def take_pending_forks(self) -> list[Fork]:
        """The beam forks made since the last call; clears them."""
        forks, self._pending_forks = self._pending_forks, []
        return forks
