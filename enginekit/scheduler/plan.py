"""StepPlan: the work one ``schedule`` call decides, and what the executor gets of it."""

from __future__ import annotations

from dataclasses import dataclass, field

from enginekit.request import Request
from enginekit.step import Fork, SchedulerOutput


def empty_output(step: int) -> SchedulerOutput:
    """A step with nothing to run (the step counter does not advance)."""
    return SchedulerOutput(
        step=step,
        prefill_seq_ids=[],
        prefill_starts=[],
        prefill_lens=[],
        decode_seq_ids=[],
        decode_context_lens=[],
        sample_seq_ids=[],
        finished_seq_ids=[],
        preempted_seq_ids=[],
        block_copies=[],
    )


@dataclass(slots=True)
class StepPlan:
    """The work one ``schedule`` call has decided so far, and the token budget left."""

    budget: int
    num_batched: int = 0  # decodes of the scheduler's DecodeBatch: all its members
    decodes: list[Request] = field(default_factory=list)  # other decodes (beams, restored)
    prefill_seq_ids: list[int] = field(default_factory=list)
    prefill_starts: list[int] = field(default_factory=list)
    prefill_lens: list[int] = field(default_factory=list)
    prefill_token_ids: list[list[int]] = field(default_factory=list)
    final_prefill_seq_ids: list[int] = field(default_factory=list)  # sampled this step
    forks: list[Fork] = field(default_factory=list)

    @property
    def is_empty(self) -> bool:
        return not self.num_batched and not self.decodes and not self.prefill_seq_ids
