"""DecodeBatch: the running requests that decode one token per step, held as aligned
arrays so that a step costs a few whole-batch operations rather than Python work per
sequence.

In steady serving nearly every running request decodes, and every step does the same for
each of them: grow its block table by one slot, report its context length and its last
token to the executor, mark its computed tokens, append the sampled token and check its
stop conditions. The batch keeps what that work reads side by side (seq ids, token counts,
token limits, last tokens, each request's own ``token_ids`` list), so that the scheduler
hands whole lists to the cache manager (one call into Rust per step for the tables), and
the per-member passes (``decode_ops``: one call each, in Rust on native runs) take them
whole.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from enginekit.request import Request, RequestStatus
from enginekit.scheduler.decode_ops import PYTHON_DECODE_OPS, DecodeOps

_INT_TABLE_STEP = 1024  # ints the batch's table grows by past the count that needs them


class DecodeBatch:
    """The scheduler's decoding requests that are not beams, in the order they joined.

    Owns their membership and order, and for each member, at the same index: its seq id,
    its number of tokens (kept equal to ``len(request.token_ids)``: the batch appends the
    tokens it is given), the number of tokens it stops at (prompt + ``max_tokens``), its
    last token, whether EOS stops it, and the indices of members with stop token ids of
    their own. A member has exactly one token to compute at the start of every step.

    The lists it exposes (``requests``, ``seq_ids``, ``last_token_ids``) are replaced,
    never mutated, when the batch changes, so a caller may keep one as a snapshot.
    """

    def __init__(
        self, eos_token_id: int | None, block_size: int, ops: DecodeOps = PYTHON_DECODE_OPS
    ) -> None:
        self._eos_token_id = eos_token_id
        self._block_size = block_size
        self._ops = ops
        # Tokens each member has left to compute: 1 between steps, 0 while a scheduled
        # step runs. Shared with the members, whose num_computed_tokens it gives.
        self._left = [1]
        self.requests: list[Request] = []
        self.seq_ids: list[int] = []
        self.last_token_ids: list[int] = []
        self._token_lists: list[list[int]] = []
        self.seq_id_array = np.zeros(0, dtype=np.int64)  # ``seq_ids`` for batch calls
        self._num_tokens = np.zeros(0, dtype=np.int64)
        self._max_num_tokens = np.zeros(0, dtype=np.int64)
        self._stops_at_eos = np.zeros(0, dtype=np.uint8)  # 1 where EOS stops the member
        self._stop_indices: list[int] = []  # members with stop_token_ids
        # Item n is the int n, for n up to at least ``_most_tokens``: a step's marks share
        # these objects rather than make an int per member (about 36 bytes an entry, 4.7 MB
        # for a member of 131,072 tokens). ``_most_tokens`` bounds every member's number of
        # tokens from above.
        self._ints: list[int] = []
        self._most_tokens = 0
        # Bumped by every change of membership: the scheduler checks that the batch it
        # scheduled is the one its tokens come back for.
        self.version = 0

    def __len__(self) -> int:
        return len(self.requests)

    # -- membership ------------------------------------------------------------------------

    def add(self, requests: Sequence[Request]) -> None:
        """Appends ``requests`` (running, not beams, past their prompt, one token to
        compute) behind the members."""
        if not requests:
            return
        first = len(self.requests)
        self._stop_indices = self._stop_indices + [
            first + k for k, r in enumerate(requests) if r.sampling.stop_token_ids
        ]
        self.requests = self.requests + list(requests)
        for request in requests:
            request.follow_decode_batch(self._left)
        self.seq_ids = self.seq_ids + [r.seq_id for r in requests]
        self.last_token_ids = self.last_token_ids + [r.token_ids[-1] for r in requests]
        self._token_lists = self._token_lists + [r.token_ids for r in requests]
        self.seq_id_array = np.array(self.seq_ids, dtype=np.int64)
        num_tokens = [len(r.token_ids) for r in requests]
        self._num_tokens = np.concatenate((self._num_tokens, np.array(num_tokens, dtype=np.int64)))
        self._most_tokens = max(self._most_tokens, *num_tokens)
        self._max_num_tokens = np.concatenate(
            (
                self._max_num_tokens,
                np.array(
                    [r.num_prompt_tokens + r.sampling.max_tokens for r in requests],
                    dtype=np.int64,
                ),
            )
        )
        self._stops_at_eos = np.concatenate(
            (
                self._stops_at_eos,
                np.array([not r.sampling.ignore_eos for r in requests], dtype=np.uint8),
            )
        )
        self._changed()

    def remove(self, requests: Sequence[Request]) -> None:
        """Drops those of ``requests`` that are members; the others keep their order."""
        gone = set(map(id, requests))
        keep = [i for i, r in enumerate(self.requests) if id(r) not in gone]
        if len(keep) < len(self.requests):
            self._keep(keep, [r for r in self.requests if id(r) in gone])

    def _keep(self, indices: list[int], leaving: list[Request]) -> None:
        """Keeps the members at ``indices`` (ascending), in order; ``leaving`` are the
        others, whose computed counts are stored again."""
        for request in leaving:
            request.follow_decode_batch(None)
        requests, token_lists = self.requests, self._token_lists
        seq_ids, last = self.seq_ids, self.last_token_ids
        self.requests = [requests[i] for i in indices]
        self._token_lists = [token_lists[i] for i in indices]
        self.seq_ids = [seq_ids[i] for i in indices]
        self.last_token_ids = [last[i] for i in indices]
        index = np.array(indices, dtype=np.int64)
        self.seq_id_array = self.seq_id_array[index]
        self._num_tokens = self._num_tokens[index]
        self._max_num_tokens = self._max_num_tokens[index]
        self._stops_at_eos = self._stops_at_eos[index]
        if self._stop_indices:
            self._stop_indices = [
                i for i, r in enumerate(self.requests) if r.sampling.stop_token_ids
            ]
        self._changed()

    def _changed(self) -> None:
        """After a change of membership (the indices of members change)."""
        self.version += 1

    # -- a step ----------------------------------------------------------------------------

    @property
    def num_token_array(self) -> npt.NDArray[np.int64]:
        """Each member's number of tokens, its one to compute included (read-only: the
        batch's own array)."""
        return self._num_tokens

    def num_tokens(self) -> list[int]:
        """``num_token_array`` as a new list. Pure."""
        return self._num_tokens.tolist()  # type: ignore[no-any-return]

    def mark_scheduled(self) -> tuple[list[int], list[int]]:
        """Every member's tokens are computed by the step being scheduled: each member's
        ``num_computed_tokens`` becomes its number of tokens (one flip for all). Returns
        (those numbers as a new list: the step's context lengths; the indices of the
        members whose last block the step fills, ascending)."""
        ints = self._ints
        if self._most_tokens >= len(ints):  # grown past the table: extend it, amortized
            ints.extend(range(len(ints), self._most_tokens + _INT_TABLE_STEP))
        lens = self._ops.context_lens(self._num_tokens, self._block_size, ints)
        self._left[0] = 0
        return lens

    def append(self, token_ids: list[int]) -> list[Request]:
        """Appends ``token_ids[i]`` to member i (``token_ids``: one per member, owned by
        the batch from now on) and finishes the members it stops, as
        ``Request.stop_status`` says: on one of their stop token ids or EOS
        (FINISHED_STOPPED), else on reaching max_tokens (FINISHED_LENGTH). Returns the
        finished members, in batch order, with their status set and removed from the
        batch."""
        if len(token_ids) != len(self.requests):
            raise ValueError(f"{len(token_ids)} tokens for a batch of {len(self.requests)} decodes")
        at_eos, at_length = self._ops.append_tokens(
            self._token_lists,
            token_ids,
            self._num_tokens,
            self._max_num_tokens,
            self._stops_at_eos,
            self._eos_token_id,
        )
        self._left[0] = 1  # each member's new token is left to compute
        self.last_token_ids = token_ids
        self._most_tokens += 1
        if not at_eos and not at_length and not self._stop_indices:
            return []  # the common step: nobody stops
        candidates = self._may_stop(token_ids, at_eos, at_length)
        if not candidates:
            return []
        finished = []
        finished_indices = set()
        eos = self._eos_token_id
        for i in sorted(candidates):
            request = self.requests[i]
            status = request.stop_status(token_ids[i], eos)
            if status is not None:
                request.status = status
                finished.append(request)
                finished_indices.add(i)
        if finished:
            self._keep(
                [i for i in range(len(self.requests)) if i not in finished_indices], finished
            )
        return finished

    def _may_stop(self, token_ids: list[int], at_eos: list[int], at_length: list[int]) -> set[int]:
        """Indices of the members the step's tokens may stop: the pass's EOS and length
        finds, and the members whose new token is one of their own stop token ids."""
        candidates = set(at_eos)
        candidates.update(at_length)
        for i in self._stop_indices:
            if token_ids[i] in self.requests[i].sampling.stop_token_ids:
                candidates.add(i)
        return candidates

    # -- checks ----------------------------------------------------------------------------

    def check(self) -> None:
        """Raises RuntimeError unless every aligned field agrees with its member and every
        member is a running non-beam request with one token to compute."""
        n = len(self.requests)
        sizes = [len(self.seq_ids), len(self.last_token_ids), len(self._token_lists)]
        arrays = (self.seq_id_array, self._num_tokens, self._max_num_tokens, self._stops_at_eos)
        sizes += [len(a) for a in arrays]
        if any(size != n for size in sizes):
            raise RuntimeError(f"decode batch of {n} has fields of sizes {sizes}")
        if self.seq_id_array.tolist() != self.seq_ids:
            raise RuntimeError("the decode batch's seq id array disagrees with its seq ids")
        if len(set(map(id, self.requests))) != n:
            raise RuntimeError("a request is in the decode batch twice")
        for i, r in enumerate(self.requests):
            expected = (
                r.seq_id,
                len(r.token_ids),
                r.token_ids[-1],
                r.num_prompt_tokens + r.sampling.max_tokens,
                not r.sampling.ignore_eos,
            )
            held = (
                self.seq_ids[i],
                int(self._num_tokens[i]),
                self.last_token_ids[i],
                int(self._max_num_tokens[i]),
                bool(self._stops_at_eos[i]),
            )
            if held != expected or self._token_lists[i] is not r.token_ids:
                raise RuntimeError(f"decode batch entry {i} {held} disagrees with {r}")
            if r.status is not RequestStatus.RUNNING or r.is_beam or r.num_tokens_to_compute != 1:
                raise RuntimeError(f"{r.request_id!r} cannot be in the decode batch: {r.status}")
            if not r.counted_by_decode_batch(self._left):
                raise RuntimeError(f"{r.request_id!r} keeps a computed count of its own")
        if any(len(r.token_ids) > self._most_tokens for r in self.requests):
            raise RuntimeError("a decode batch member has more tokens than the batch's bound")
        if self._ints != list(range(len(self._ints))):
            raise RuntimeError("the decode batch's table of ints is not 0, 1, 2, ...")
        stop_indices = [i for i, r in enumerate(self.requests) if r.sampling.stop_token_ids]
        if self._stop_indices != stop_indices:
            raise RuntimeError("the decode batch's stop-id index is stale")
