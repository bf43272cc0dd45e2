"""``python -m enginekit.export [key=value ...] --out FILE``: writes a workload as a trace.

Any workload the command line can run (``workload=sharegpt``, ``workload=multiturn``, the
other generators, even ``workload=trace``) is written in the ``jsonl`` trace format of
``enginekit.workloads.trace``, one request a line, so that it can be edited and replayed
with ``python -m enginekit workload=trace workload.path=FILE``. The overrides are the
run's (the model sets the vocabulary and context the workload is made for); later turns
of a session are written with their whole prompt, as the simulator would build it.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from enginekit.errors import EngineKitError


def export_workload(overrides: Sequence[str], out: Path) -> int:
    """Writes the workload of ``overrides`` to ``out`` (folders created); returns how
    many requests. Raises ConfigError as a run of those overrides would, MissingExtraError
    (one) when they need extras that are not installed."""
    from enginekit.app import compose_config
    from enginekit.engine import Engine
    from enginekit.extras import require_config
    from enginekit.tokenizer import Tokenizer
    from enginekit.workloads.sources import open_workload
    from enginekit.workloads.trace import write_jsonl

    config = compose_config(list(overrides))
    require_config(config, "python -m enginekit.export")
    engine = Engine(config)
    workload = open_workload(
        engine.config.workload,
        engine.shape.vocab_size,
        engine.max_model_len,
        lambda: Tokenizer.for_workload(engine.config.model.path),
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("w", encoding="utf-8") as stream:
        return write_jsonl(workload, stream)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m enginekit.export", description=__doc__.splitlines()[0]
    )
    parser.add_argument("overrides", nargs="*", help="key=value, as for python -m enginekit")
    parser.add_argument("--out", type=Path, required=True, help="the JSONL file to write")
    args = parser.parse_args(argv)
    try:
        count = export_workload(args.overrides, args.out)
    except EngineKitError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"wrote {count:,} requests to {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
