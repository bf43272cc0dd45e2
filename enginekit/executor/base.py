"""Executor: runs the steps the scheduler plans (the step contract is ``enginekit.step``)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import ClassVar

from enginekit.errors import InvalidRequestError
from enginekit.request import SamplingParams, TokenLogprob
from enginekit.step import ModelOutput, SchedulerOutput


class Executor(ABC):
    """Runs steps. Holds per-sequence state between add_sequence and the step whose
    SchedulerOutput lists the sequence in finished_seq_ids."""

    needs_block_tables: ClassVar[bool] = False  # ask the scheduler for block_tables
    supports_forks: ClassVar[bool] = False  # can run parallel sampling (SchedulerOutput.forks)
    supports_beam_search: ClassVar[bool] = False  # returns ModelOutput.candidates
    # computes a model's next-token distribution: the sampling fields that need one
    # (``SamplingParams.distribution_fields``: logprobs, prompt logprobs, penalties, min_p,
    # structured outputs)
    has_distribution: ClassVar[bool] = False

    @abstractmethod
    def add_sequence(
        self,
        seq_id: int,
        prompt_token_ids: Sequence[int],
        sampling: SamplingParams,
        scripted_output_ids: Sequence[int] | None = None,
    ) -> None:
        """Registers a sequence before it is first scheduled. Mutates executor state."""

    @abstractmethod
    def execute(self, scheduled: SchedulerOutput) -> ModelOutput:
        """Runs one step and returns one token per sample_seq_ids entry. Forgets the
        sequences in finished_seq_ids first."""

    def prepare_structured(self, sampling: SamplingParams) -> None:
        """Readies ``sampling.structured`` for a request being added (compiles its
        grammar); raises InvalidRequestError, naming the field, when this executor cannot
        constrain its output so. Default: refuses (no distribution to constrain)."""
        kind = "" if sampling.structured is None else f".{sampling.structured.kind}"
        raise InvalidRequestError(
            f"sampling.structured{kind} needs the model's next-token distribution; the "
            f"{type(self).__name__} has none"
        )

    def score_prompt(self, token_ids: Sequence[int], num_top: int) -> list[TokenLogprob | None]:
        """Every prompt token's TokenLogprob given the tokens before it (None for the
        first), each with its ``num_top`` most likely alternatives: ``prompt_logprobs``.
        Only for an executor that ``has_distribution``; raises NotImplementedError
        otherwise."""
        raise NotImplementedError(f"{type(self).__name__} has no next-token distribution")

    def attach_tiers(self, link_bytes_per_s: Sequence[float]) -> None:  # noqa: B027
        """The run has KV tiers whose level ``i`` moves ``link_bytes_per_s[i]`` bytes per
        second to or from the device (``SchedulerOutput.tier_saves`` / ``tier_loads``
        name levels by that index). An executor that models transfer time keeps them;
        one that moves real data measures its own. Default: nothing."""

    def tier_payload_bytes(self) -> int | None:
        """Bytes of one block as read out for a KV tier (``ModelOutput.saved_payloads``),
        or None where no data moves (the block's KV bytes are what a tier is sized by)."""
        return None

    def describe(self) -> dict[str, object]:
        """What the report prints about where the run happened (device, model, ...)."""
        return {}
