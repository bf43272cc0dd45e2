"""``python -m enginekit [+group=plugin ...] [key=value ...]``: run a workload, print the report.

Writes ``report.json`` into Hydra's run (or sweep job) folder.
"""

from __future__ import annotations

import sys
from pathlib import Path

from enginekit.app import CONFIG_NAME, register_configs, rewrite_overrides
from enginekit.errors import EngineKitError


def run_job(cfg: object) -> dict[str, object]:
    """One run on a composed config: build the engine, run the workload, report."""
    from hydra.core.hydra_config import HydraConfig

    from enginekit.engine import Engine
    from enginekit.report import render_report, write_json

    engine = Engine(cfg)  # type: ignore[arg-type]
    engine.add_workload()
    result = engine.run(progress=bool(engine.config.progress))
    header = engine.describe()
    print(render_report(result.summary, header))
    output_dir = Path(HydraConfig.get().runtime.output_dir)
    write_json(result.summary, header, output_dir / "report.json")
    print(f"report: {output_dir / 'report.json'}")
    return result.summary


def main(argv: list[str] | None = None) -> int:
    import hydra

    args = sys.argv[1:] if argv is None else argv
    try:
        problems = register_configs()
        rewritten = rewrite_overrides(args)
    except EngineKitError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for problem in problems:
        print(f"warning: {problem}", file=sys.stderr)

    @hydra.main(version_base=None, config_path=None, config_name=CONFIG_NAME)
    def task(cfg: object) -> None:
        try:
            run_job(cfg)
        except EngineKitError as exc:
            print(f"error: {exc}", file=sys.stderr)
            raise SystemExit(2) from None

    sys.argv = [sys.argv[0], *rewritten]
    task()
    return 0


if __name__ == "__main__":
    sys.exit(main())
