"""What a claims scenario returns and how it measures: the rows of the main table
(``ClaimRow``, with a verdict), the tables and notes behind them (``Section``, ``Table``),
and engines and summaries of simulated runs over the defaults (``sim_engine``,
``sim_summary``). The scenarios (``enginekit.claims.prefix``, ``.memory``, ``.swap``) build
on it; ``enginekit.claims.job`` runs them and renders the result.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from enginekit.engine import Engine

VERDICTS = ("yes", "partly", "no")


@dataclass(frozen=True)
class ClaimRow:
    """One claim. ``key`` names it in claims.json; ``claim`` is the claim as users know it;
    ``measured`` says what enginekit measured, figures included; ``verdict`` is one of
    ``VERDICTS``; ``figures`` holds every number behind ``measured``."""

    key: str
    claim: str
    measured: str
    verdict: str
    figures: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.verdict not in VERDICTS:
            raise ValueError(f"claim {self.key}: verdict {self.verdict!r} not in {VERDICTS}")


@dataclass(frozen=True)
class Table:
    """A table behind the verdicts: a title, column names and rows of printed cells."""

    title: str
    header: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...]


@dataclass(frozen=True)
class Section:
    """One scenario: its rows of the main table, then its own tables and notes."""

    title: str
    rows: tuple[ClaimRow, ...]
    tables: tuple[Table, ...] = ()
    notes: tuple[str, ...] = ()


def verdict(holds: Iterable[bool]) -> str:
    """``yes`` if every case holds, ``partly`` if some do, ``no`` if none does."""
    cases = list(holds)
    return "yes" if all(cases) else ("partly" if any(cases) else "no")


def tolerant_verdict(exact: Iterable[bool], near: Iterable[bool]) -> str:
    """``yes`` if every case holds exactly; ``partly`` if some case holds exactly or comes
    within the tolerance its row prints (``near``, one per case); ``no`` otherwise. A case
    that holds only within the tolerance never makes a ``yes``."""
    exact_cases, near_cases = list(exact), list(near)
    if exact_cases and all(exact_cases):
        return "yes"
    return "partly" if any(exact_cases) or any(near_cases) else "no"


def sim_engine(*settings: str) -> Engine:
    """An engine over the defaults with dotted ``key=value`` settings (plugins as
    ``group.name=plugin``, presets as ``model.name=...``), built without Hydra's compose
    so that it also runs inside a Hydra job. No progress bar. Raises as ``Engine``."""
    from omegaconf import DictConfig, OmegaConf

    from enginekit.config import EngineConfig
    from enginekit.engine import Engine

    config = OmegaConf.merge(
        OmegaConf.structured(EngineConfig), OmegaConf.from_dotlist(["progress=false", *settings])
    )
    assert isinstance(config, DictConfig)
    return Engine(config)


def sim_summary(*settings: str) -> dict[str, Any]:
    """The summary of the configured workload run on ``sim_engine(*settings)``."""
    from enginekit.driver import WorkloadDriver

    driver = WorkloadDriver(sim_engine(*settings))
    driver.add_workload()
    return driver.run().summary
