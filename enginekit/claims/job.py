"""The literature's claims about the KV cache, replayed on enginekit and set against what it
measures.

``python -m enginekit +experiment=claims`` (or ``python -m enginekit.claims [--quick]
[--out DIR]``) runs every scenario, prints one table "claim | enginekit measured |
holds?" followed by the tables and notes behind each verdict, and writes the same as
``claims.md`` and ``claims.json`` into the run folder. The scenarios are fixed (Llama-3-8B
on a simulated H200 unless a row says otherwise), so overrides of the engine's keys do
not change them; ``--quick`` runs the simulated workloads with fewer requests (the exact
figures are the same, the load-dependent ones noisier).

Verdicts: ``yes`` (the figure is within the claim), ``partly`` (part of it holds, it
holds only under conditions the row names, or it comes only within a tolerance the row
prints) and ``no``. A row whose verdict reads a vague word of the claim ("about") or
allows a tolerance says the bound it used. Every figure behind a row is in
its ``figures`` (claims.json), by name.

The scenarios live in ``enginekit.claims.prefix`` (prefix-cache hit and TTFT),
``enginekit.claims.memory`` (paging, GQA and quantized bytes, per-token bytes),
``enginekit.claims.swap`` (swap against recompute) and ``enginekit.claims.sharegpt``
(PagedAttention's ShareGPT utilisation and sharing figures, on ShareGPT itself), which
needs the ``data`` extra: both commands refuse to run without it (``run_claims`` itself
leaves that section's rows out).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

# VERDICTS belongs to this module's interface too: the verdicts claims.json holds.
from enginekit.claims.scenario import VERDICTS as VERDICTS
from enginekit.claims.scenario import ClaimRow, Section

CLAIMS_EXTRAS = ("data",)  # the ShareGPT section's data set and vocabulary
JSON_NAME = "claims.json"
MARKDOWN_NAME = "claims.md"


def run_claims(quick: bool = False) -> list[Section]:
    """Runs every scenario (seconds; ``quick``: fewer simulated requests). Pure apart from
    the time it takes: nothing is printed or written."""
    from enginekit.claims.memory import bytes_section, paging_section
    from enginekit.claims.prefix import prefix_section
    from enginekit.claims.sharegpt import sharegpt_section
    from enginekit.claims.swap import swap_section

    return [
        prefix_section(quick),
        paging_section(quick),
        bytes_section(),
        swap_section(quick),
        sharegpt_section(quick),
    ]


def rows_by_key(sections: Sequence[Section]) -> dict[str, ClaimRow]:
    """Every row of ``sections`` by its key."""
    return {row.key: row for section in sections for row in section.rows}


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A GitHub markdown table (pipes in cells escaped)."""
    lines = ["| " + " | ".join(map(_cell, header)) + " |", "|" + " --- |" * len(header)]
    lines += ["| " + " | ".join(map(_cell, row)) + " |" for row in rows]
    return "\n".join(lines)


def render_markdown(sections: Sequence[Section], heading_level: int = 3) -> str:
    """The main table, then each section's tables and notes, as markdown; each section
    under a heading of ``heading_level``."""
    h = "#" * heading_level
    rows = [(r.claim, r.measured, r.verdict) for s in sections for r in s.rows]
    parts = [markdown_table(("claim", "enginekit measured", "holds?"), rows)]
    for section in sections:
        parts.append(f"{h} {section.title}")
        for table in section.tables:
            parts.append(f"**{table.title}**\n\n{markdown_table(table.header, table.rows)}")
        if section.notes:
            parts.append("\n".join(f"- {note}" for note in section.notes))
    return "\n\n".join(parts) + "\n"


def to_json(sections: Sequence[Section], quick: bool) -> dict[str, Any]:
    """claims.json: ``quick``, every row by key (claim, measured, verdict, figures) and the
    sections with their tables and notes."""
    return {
        "quick": quick,
        "claims": {row.key: asdict(row) for row in rows_by_key(sections).values()},
        "sections": [asdict(section) for section in sections],
    }


def write_claims(sections: Sequence[Section], folder: Path, quick: bool) -> tuple[Path, Path]:
    """Writes claims.md and claims.json into ``folder`` (created if missing); returns both
    paths."""
    folder.mkdir(parents=True, exist_ok=True)
    md_path, json_path = folder / MARKDOWN_NAME, folder / JSON_NAME
    md_path.write_text(f"# Claims\n\n{render_markdown(sections, heading_level=2)}")
    json_path.write_text(json.dumps(to_json(sections, quick), indent=2) + "\n")
    return md_path, json_path


def run_claims_job(folder: Path, quick: bool = False) -> dict[str, Any]:
    """The ``+experiment=claims`` job: runs the claims, prints them, writes claims.md and
    claims.json into ``folder``; returns claims.json's content."""
    sections = run_claims(quick)
    print(render_markdown(sections), end="")
    md_path, _ = write_claims(sections, folder, quick)
    print(f"claims: {md_path}")
    return to_json(sections, quick)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m enginekit.claims``. Without ``CLAIMS_EXTRAS`` installed it prints
    ``error: ...`` naming them (after the usage, for ``--help``) and returns 2."""
    import sys

    from enginekit.extras import MissingExtraError, require

    parser = argparse.ArgumentParser(
        prog="python -m enginekit.claims", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--quick", action="store_true", help="fewer simulated requests")
    parser.add_argument("--out", type=Path, help="folder for claims.md and claims.json")
    args_given = sys.argv[1:] if argv is None else list(argv)
    try:
        require("python -m enginekit.claims", extras=CLAIMS_EXTRAS)
    except MissingExtraError as exc:
        if any(a in ("-h", "--help") for a in args_given):
            parser.print_help()
        print(f"error: {exc}", file=sys.stderr)
        return 2
    args = parser.parse_args(argv)
    sections = run_claims(args.quick)
    print(render_markdown(sections), end="")
    if args.out is not None:
        md_path, _ = write_claims(sections, args.out, args.quick)
        print(f"claims: {md_path}")
    return 0
