"""Prefill promises: free blocks set aside at admission for the chunks a prefill has left.

Blocks come to a prefilling sequence with each chunk, not all at admission. So that a prefill
admitted never waits for memory (and admission cannot deadlock), admission promises it the
most blocks it will hold at once (its *peak*: its whole prompt, or with a sliding window the
window's bound) and the cache manager keeps that many free blocks out of everyone else's
reach, as vLLM's watermark keeps blocks out of admission's reach. A sequence's promise is
``peak - held`` (the blocks it may still take), shrinks as chunks take blocks and grows back
as a sliding window releases blocks; it ends with the prefill.
"""

from __future__ import annotations

from collections.abc import Iterator

from enginekit.errors import KVCacheError


class PrefillPromises:
    """seq_id -> (peak, promised blocks) of every sequence still prefilling, in admission
    order, and their total. Holds no pool references: the cache manager keeps
    ``pool.num_free_blocks >= total`` (``check`` verifies it)."""

    def __init__(self) -> None:
        self._peaks: dict[int, int] = {}
        self._promised: dict[int, int] = {}
        self.total = 0

    def __contains__(self, seq_id: int) -> bool:
        return seq_id in self._peaks

    def __iter__(self) -> Iterator[int]:
        return iter(self._peaks)

    def __len__(self) -> int:
        return len(self._peaks)

    def peak(self, seq_id: int) -> int:
        return self._peaks[seq_id]

    def promised(self, seq_id: int) -> int:
        """The sequence's promised blocks; 0 for one that is not prefilling."""
        return self._promised.get(seq_id, 0)

    def set(self, seq_id: int, peak: int, num_promised: int) -> None:
        """Records (or replaces) the sequence's peak and promise."""
        self.total += num_promised - self._promised.get(seq_id, 0)
        self._peaks[seq_id] = peak
        self._promised[seq_id] = num_promised

    def drop(self, seq_id: int) -> None:
        """The sequence no longer prefills (or holds blocks): its promise ends."""
        self.total -= self._promised.pop(seq_id, 0)
        self._peaks.pop(seq_id, None)

    def check(self, num_free_blocks: int, held: dict[int, int]) -> None:
        """Raises KVCacheError unless every promised sequence holds a table (``held``: its
        blocks, holes excluded), promises at most ``peak - held`` and at least 0, the total
        is their sum and the free blocks cover it."""
        for seq_id, peak in self._peaks.items():
            if seq_id not in held:
                raise KVCacheError(f"sequence {seq_id} has a prefill promise but no table")
            promised = self._promised[seq_id]
            if not 0 <= promised <= max(0, peak - held[seq_id]):
                raise KVCacheError(
                    f"sequence {seq_id} is promised {promised} blocks, outside "
                    f"[0, peak {peak} - held {held[seq_id]}]"
                )
        if self.total != sum(self._promised.values()):
            raise KVCacheError(
                f"prefill promises total {self.total}, their sum {sum(self._promised.values())}"
            )
        if num_free_blocks < self.total:
            raise KVCacheError(
                f"{self.total} blocks are promised to prefills but only {num_free_blocks} are free"
            )
