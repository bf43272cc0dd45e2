"""Beam search's choice: which continuations of which beams survive a step. Pure."""

from __future__ import annotations

from collections.abc import Sequence

from enginekit.request import Request


def choose_continuations(
    live: Sequence[Request], beam_width: int
) -> dict[int, list[tuple[int, float]]]:
    """Index in ``live`` -> the (token, logprob) continuations its beam keeps, best first:
    of every beam's candidates, the ``beam_width`` of highest total log-probability
    (ties: earlier beam, then likelier candidate). A beam absent from the result is
    pruned. Needs every beam's ``candidates``."""
    options = sorted(
        (
            (beam.cumulative_logprob + logprob, b, c, token, logprob)
            for b, beam in enumerate(live)
            for c, (token, logprob) in enumerate(beam.candidates or ())
        ),
        key=lambda o: (-o[0], o[1], o[2]),
    )[:beam_width]
    chosen: dict[int, list[tuple[int, float]]] = {}
    for _, b, _, token, logprob in options:
        chosen.setdefault(b, []).append((token, logprob))
    return chosen
