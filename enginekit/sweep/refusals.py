"""Plugin combinations a sweep does not run: those a selected plugin class refuses with
``check_compatible(selected)`` (contiguous allocation with a prefix cache, say).

Such a job is not run: the sweep's task (``enginekit.__main__.run_task``) asks ``refusal``
first and writes its ``report.json`` with status ``refused`` and the plugin's reason,
building nothing and printing nothing. As a second line of defence, the sweep callback
(``SweepSummaryCallback.on_job_end``, in the job's own process, so any launcher gives the
same record) calls ``relabel_refusal``: a job that failed anyway because its plugins refuse
each other has its ``report.json`` rewritten the same way. The sweep's
summary (``enginekit.sweep.table``) leaves refused jobs out of the table and lists the
refused combinations once, grouped by reason. A single run of a refused combination stays
an error (exit code 2).

A plugin that is not installed or fails to import is no refusal: that job fails with the
loader's error, as any other broken job does.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from enginekit.config import PLUGIN_GROUPS
from enginekit.errors import ConfigError, PluginError
from enginekit.plugins import load_plugin
from enginekit.report import STATUS_FAILED, write_json
from enginekit.sweep.jobs import STATUS_REFUSED


def selected_plugins(cfg: Any) -> dict[str, str]:
    """Group -> plugin name of a composed config (only the groups it sets)."""
    return {group: str(cfg[group]["name"]) for group in PLUGIN_GROUPS if group in cfg}


def refusal(selected: Mapping[str, str]) -> str | None:
    """Why a plugin of ``selected`` refuses this combination (the first one to refuse, in
    group order, as the engine would report it), or None when every plugin accepts it or
    one cannot be loaded."""
    try:
        classes = {g: load_plugin(g, selected[g]) for g in PLUGIN_GROUPS if g in selected}
    except PluginError:
        return None
    for plugin_cls in classes.values():
        try:
            plugin_cls.check_compatible(classes)
        except ConfigError as exc:
            return str(exc)
    return None


def relabel_refusal(config: Any) -> bool:
    """For a job's full config (``hydra.runtime.output_dir`` set): if its report.json says
    failed with the reason a plugin refuses its combination for, rewrites it as refused
    (same header, same reason) and returns True. Any other job is left as it is."""
    path = Path(str(config.hydra.runtime.output_dir)) / "report.json"
    reason = refusal(selected_plugins(config))
    if reason is None or not path.is_file():
        return False
    try:
        report = json.loads(path.read_text(encoding="utf-8"))
    except ValueError:
        return False
    if report.get("status") != STATUS_FAILED or report.get("error") != reason:
        return False
    write_json({}, report.get("header") or {}, path, status=STATUS_REFUSED, error=reason)
    return True
