"""Hydra wiring shared by the command line and the Python API.

- ``register_configs`` stores the schema, the primary config and every installed plugin's
  Config in Hydra's ConfigStore (plugin groups never appear in a defaults list, so users
  write ``+allocator=paged``).
- ``rewrite_overrides`` also accepts ``allocator=paged`` (rewritten to ``+allocator=paged``),
  ``experiment=x`` and ``ablation=x`` (to ``+experiment=x``, ``+ablation=x``) and
  ``model=llama-3-70b`` (rewritten to ``model.name=llama-3-70b``), and refuses unknown
  plugins, conf files and keys with the valid choices (a key of a plugin not selected
  with the ``+group=plugin`` that selects it), values their key's type refuses
  (``cache.block_size=abc``), and ``+name=...`` where ``name`` is no plugin group, preset
  or conf group (Hydra would add a key nothing reads). Hydra's flags keep their values
  (``--cfg job``, ``--info config``, ``--package cache``).
- The primary config gives each run a folder of its own (the time to the microsecond)
  and creates the job's log file only when something is logged.
- The primary config registers the sweep-summary callback (``enginekit.sweep.summary``): every
  multirun ends with one table (and plots) of its jobs in the sweep folder; disable it with
  ``~hydra.callbacks.sweep_summary``, its plots with ``hydra.callbacks.sweep_summary.plots=false``.
- ``compose_config`` turns override strings into the same config the command line builds.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import fields, is_dataclass
from pathlib import Path
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig

from enginekit.config import PLUGIN_GROUPS, EngineConfig
from enginekit.errors import ConfigError, EngineKitError
from enginekit.extras import install_hint, missing_extras
from enginekit.plugins import config_keys, load_all_configs

PRESET_GROUPS: tuple[str, ...] = ("model", "hardware", "workload")
# Groups of YAML files under conf/, selected with +group=name (never in a defaults list).
CONF_GROUPS: tuple[str, ...] = ("experiment", "ablation")
# The experiment and ablation files, shipped inside the package (so a wheel has them).
CONF_DIR = Path(__file__).resolve().parent / "conf"
CONFIG_NAME = "enginekit"
JOB_LOGGING = "enginekit"  # hydra/job_logging option of the primary config
SWEEP_CALLBACK = "enginekit.sweep.summary.SweepSummaryCallback"
_GROUP_OVERRIDE = re.compile(r"^(?P<prefix>\+{0,2})(?P<group>[A-Za-z_]\w*)=(?P<value>.*)$")
_KEY_OVERRIDE = re.compile(r"^(?P<prefix>[+~]{0,2})(?P<key>[A-Za-z_][\w.]*)(?P<rest>=.*)?$")


def preset_names() -> dict[str, list[str]]:
    from enginekit.spec.hardware import HARDWARE_PRESETS
    from enginekit.spec.model import MODEL_PRESETS
    from enginekit.workloads import ALL_WORKLOADS

    return {
        "model": sorted(MODEL_PRESETS),
        "hardware": sorted(HARDWARE_PRESETS),
        "workload": sorted(ALL_WORKLOADS),
    }


def conf_names(group: str) -> list[str]:
    """The YAML files of a ``CONF_GROUPS`` group under enginekit/conf/ (sorted stems)."""
    return sorted(f.stem for f in (CONF_DIR / group).glob("*.yaml"))


def _yaml_value(value: Any) -> str:
    """``value`` as a user types it on the command line (null, true, 2.0, [1, 2])."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    return str(value)


def _plugin_key_lines(group: str, options: dict[str, type]) -> list[str]:
    """One line per plugin of ``group`` that adds keys: ``name: group.key=default ...``."""
    lines = []
    for name, config_cls in sorted(options.items()):
        keys = config_keys(config_cls)
        if keys:
            settings = " ".join(f"{group}.{k}={_yaml_value(v)}" for k, v in keys.items())
            lines.append(f"      {name}: {settings}")
    return lines


def help_text(plugin_configs: dict[str, dict[str, type]], problems: list[str]) -> str:
    """The text of ``--help``: every installed plugin in the form a user types, with the
    keys each plugin's Config adds and their defaults."""
    lines = [
        "enginekit: an LLM inference engine built around the KV cache.",
        "",
        "Usage:  python -m enginekit [+group=plugin ...] [key=value ...]",
        "        python -m enginekit -m +allocator=paged +prefix=none,block_hash   (a sweep)",
        "        python -m enginekit -m +ablation=prefix   (a ready-made sweep: table + plots)",
        "",
        "Plugins: +group=plugin, one per group, the default marked *; under a group, the",
        "keys a plugin adds with their defaults (group.key=value, with that plugin selected):",
    ]
    from enginekit.config import DEFAULT_PLUGINS

    for group in PLUGIN_GROUPS:
        options = plugin_configs[group]
        names = [n + ("*" if n == DEFAULT_PLUGINS[group] else "") for n in sorted(options)]
        lines.append(f"  +{group}=" + " | ".join(names))
        lines += _plugin_key_lines(group, options)
    lines += ["", "Presets:"]
    defaults = EngineConfig()
    for group, names in preset_names().items():
        default = getattr(defaults, group).name
        marked = [n + ("*" if n == default else "") for n in names]
        lines.append(f"  {group}=" + " | ".join(marked))
    experiments = conf_names("experiment")
    if experiments:
        lines += ["", "Experiments (whole runs):", "  +experiment=" + " | ".join(experiments)]
    ablations = conf_names("ablation")
    if ablations:
        lines += [
            "",
            "Ablations (sweeps; each ends with summary.md, summary.csv and plots):",
            "  -m +ablation=" + " | ".join(ablations),
            "  rebuild a sweep's table and plots: python -m enginekit.sweep <sweep folder>",
            "  jobs in parallel (the launchers extra): hydra/launcher=joblib (this machine),"
            " hydra/launcher=slurm (a SLURM cluster)",
        ]
        if missing_extras(["launchers"]):
            lines.append(f"  not installed here; {install_hint(['launchers'])}")
    if problems:
        lines += ["", "Plugins that failed to load (skipped):"] + [f"  {p}" for p in problems]
    lines += [
        "",
        "The configuration this command would run with (override any key as key=value):",
        "",
        "CONFIG_PLACEHOLDER",
        "List the plugins with their distributions and versions: python -m enginekit.plugins",
    ]
    # Hydra substitutes $NAME in the template: a $ of ours is written $$.
    return "\n".join(lines).replace("$", "$$").replace("CONFIG_PLACEHOLDER", "$CONFIG")


def _job_logging() -> dict[str, Any]:
    """Hydra's default job logging (console, and ``<job name>.log`` in the run folder),
    except that the log file is created at the first record only: a run that logs
    nothing leaves no empty file."""
    fmt = "[%(asctime)s][%(name)s][%(levelname)s] - %(message)s"
    return {
        "version": 1,
        "formatters": {"simple": {"format": fmt}},
        "handlers": {
            "console": {
                "class": "logging.StreamHandler",
                "formatter": "simple",
                "stream": "ext://sys.stdout",
            },
            "file": {
                "class": "logging.FileHandler",
                "formatter": "simple",
                "filename": "${hydra.runtime.output_dir}/${hydra.job.name}.log",
                "delay": True,
            },
        },
        "root": {"level": "INFO", "handlers": ["console", "file"]},
        "disable_existing_loggers": False,
    }


def register_configs() -> list[str]:
    """Stores schema, primary config and plugin configs in the ConfigStore. Returns the
    problems of plugins that could not be loaded (they are skipped)."""
    configs, problems = load_all_configs()
    store = ConfigStore.instance()
    store.store(name="enginekit_schema", node=EngineConfig)
    for group, options in configs.items():
        for name, config_cls in options.items():
            store.store(group=group, name=name, node=config_cls)
    store.store(group="hydra/job_logging", name=JOB_LOGGING, node=_job_logging())
    hydra: dict[str, Any] = {
        "help": {"template": help_text(configs, problems)},
        "callbacks": {"sweep_summary": {"_target_": SWEEP_CALLBACK, "plots": True}},
        # Microseconds: two runs started in the same second get folders of their own.
        "run": {"dir": "outputs/${now:%Y-%m-%d}/${now:%H-%M-%S.%f}"},
        "sweep": {"dir": "multirun/${now:%Y-%m-%d}/${now:%H-%M-%S.%f}"},
    }
    hydra["searchpath"] = ["pkg://enginekit.conf"]
    defaults = ["enginekit_schema", "_self_", {"override hydra/job_logging": JOB_LOGGING}]
    primary = {"defaults": defaults, "hydra": hydra}
    store.store(name=CONFIG_NAME, node=primary)
    return problems


def _check_plugin_value(group: str, value: str) -> None:
    """Loads every plugin the value names, so an unknown, broken or doubly registered one
    is refused before Hydra runs (with the installed names, the import error or both
    distributions)."""
    from enginekit.plugins import load_plugin

    for name in _sweep_values(value):
        load_plugin(group, name)


def _check_conf_value(group: str, value: str) -> None:
    """Refuses a name that no YAML file of ``group`` under enginekit/conf/ has."""
    names = conf_names(group)
    for name in _sweep_values(value):
        if name not in names:
            close = difflib.get_close_matches(name, names, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise ConfigError(
                f"unknown {group} {name!r}; available: {', '.join(names) or 'none'}{hint}"
            )


def _sweep_values(value: str) -> list[str]:
    """The options of a simple value or comma sweep (``a,b``); [] for anything fancier."""
    if re.fullmatch(r"[\w\-.]+(,[\w\-.]+)*", value):
        return value.split(",")
    return []


def _flag_values() -> dict[str, list[str] | None]:
    """Hydra's flags that take a value as the next argument (``--cfg job``, ``-p cache``):
    flag -> the values it accepts, or None for any value. A flag whose value is optional
    (``--info [config]``) takes the next argument only if it is one of its choices.
    Read from Hydra's own argument parser, so the list follows the installed Hydra."""
    from hydra._internal.utils import get_args_parser

    flags: dict[str, list[str] | None] = {}
    for action in get_args_parser()._actions:
        if action.option_strings and action.nargs in (None, "?"):
            choices = None if action.choices is None else [str(c) for c in action.choices]
            if action.nargs == "?" and choices is None:
                continue  # an optional value that could be anything: never taken
            for flag in action.option_strings:
                flags[flag] = choices
    return flags


def _is_override(args: list[str]) -> list[bool]:
    """For each of ``args``, whether it is an override: flags and their values are not."""
    flags = _flag_values()
    mask: list[bool] = []
    value_of: str | None = None  # the flag the next argument may be the value of
    for arg in args:
        if value_of is not None:
            choices = flags[value_of]
            value_of = None
            if choices is None or arg in choices:
                mask.append(False)
                continue
        if arg in flags:
            value_of = arg
        mask.append(not arg.startswith("-"))
    return mask


def rewrite_overrides(overrides: list[str]) -> list[str]:
    """Normalises user overrides (see the module docstring) and refuses unknown plugins,
    groups and keys. Flags (``-m``, ``--help``, ``--cfg job``, ...) and ``hydra.*`` /
    ``hydra/...`` pass untouched."""
    rewritten: list[tuple[str, bool]] = []
    selected: dict[str, str] = {}
    for arg, is_override in zip(overrides, _is_override(overrides), strict=True):
        rewritten.append((_rewrite(arg, selected) if is_override else arg, is_override))
    for arg, is_override in rewritten:
        if is_override:
            _check_key(arg, selected)
    return [arg for arg, _ in rewritten]


def _rewrite(arg: str, selected: dict[str, str]) -> str:
    """One override in the form Hydra takes; records a single plugin choice in ``selected``."""
    group_match = _GROUP_OVERRIDE.match(arg)
    if group_match and group_match["group"] in PLUGIN_GROUPS:
        group, value = group_match["group"], group_match["value"]
        if group_match["prefix"] == "++":
            raise ConfigError(f"{arg}: write +{group}={value} to choose a {group} plugin")
        _check_plugin_value(group, value)
        values = _sweep_values(value)
        if len(values) == 1:
            selected[group] = values[0]
        return f"+{group}={value}"
    if group_match and group_match["group"] in CONF_GROUPS:
        group, value = group_match["group"], group_match["value"]
        _check_conf_value(group, value)
        return f"+{group}={value}"
    if group_match and group_match["group"] in PRESET_GROUPS:
        return f"{group_match['group']}.name={group_match['value']}"
    return arg


def _refuse_unknown_group(arg: str, name: str) -> None:
    """Raises ConfigError for ``+name=...`` where ``name`` is no group: Hydra would add
    ``name`` as a new key that nothing reads, and run the defaults."""
    keys = [f.name for f in fields(EngineConfig)]
    if name in keys:
        raise ConfigError(f"{arg}: {name} is a key, not a group; write {arg.lstrip('+')}")
    groups = [*PLUGIN_GROUPS, *PRESET_GROUPS, *CONF_GROUPS]
    close = difflib.get_close_matches(name, groups, n=1)
    hint = f"; did you mean '+{close[0]}'?" if close else ""
    raise ConfigError(
        f"unknown group {name!r} in {arg}: +group=name chooses a plugin "
        f"({', '.join(PLUGIN_GROUPS)}), a preset ({', '.join(PRESET_GROUPS)}) or a conf file "
        f"({', '.join(CONF_GROUPS)}){hint}"
    )


REMOVED_KEYS: dict[str, str] = {
    "cache.swap_gib": "the host swap pool is sized by preemption.swap_space_gib alone "
    "(with +preemption=swap)",
}
"""Keys the schema no longer has -> what replaces them, for the refusal's message."""


def _check_key(arg: str, selected: dict[str, str]) -> None:
    """Raises ConfigError if ``arg`` sets a key the schema (or the selected plugin's
    Config) does not have, naming the valid keys and the closest one (or, for a removed
    key, what replaced it; for a key of another plugin of the group, that plugin), or a
    value the key's type refuses (``_check_value``)."""
    if arg.startswith("-") or arg.lstrip("+~").startswith("hydra"):
        return
    removed = REMOVED_KEYS.get(arg.lstrip("+~").split("=", 1)[0])
    if removed is not None:
        raise ConfigError(f"{arg}: this key was removed: {removed}")
    if arg.startswith("+"):
        key = arg.lstrip("+").split("=", 1)[0]
        if not re.fullmatch(r"[A-Za-z_]\w*(\.\w+)+", key):  # a group, not a dotted key
            if key not in (*PLUGIN_GROUPS, *CONF_GROUPS):
                _refuse_unknown_group(arg, key)
            return
    match = _KEY_OVERRIDE.match(arg)
    if match is None:
        return
    path = match["key"].split(".")
    if path[0] in PLUGIN_GROUPS and len(path) == 1:
        return
    node: Any = EngineConfig
    for depth, part in enumerate(path):
        if depth == 1 and path[0] in PLUGIN_GROUPS:
            node = _plugin_config_class(path[0], selected)
        if not is_dataclass(node):
            return  # a value below a leaf: let OmegaConf report it
        valid = [f.name for f in fields(node)]
        if part not in valid:
            if depth == 1 and path[0] in PLUGIN_GROUPS:
                _refuse_plugin_key(path[0], part, valid, selected)  # raises
            where = ".".join(path[:depth]) or "the config"
            close = difflib.get_close_matches(part, valid, n=1)
            hint = f"; did you mean {'.'.join([*path[:depth], close[0]])!r}?" if close else ""
            raise ConfigError(
                f"unknown key {'.'.join(path)!r}: {where} has {', '.join(valid)}{hint}"
            )
        if depth == len(path) - 1 and match["rest"] and not arg.startswith("~"):
            _check_value(arg, node, part, match["key"])
        node = {f.name: f.type for f in fields(node)}[part]
        node = _resolve_type(node)


def _refuse_plugin_key(group: str, key: str, valid: list[str], selected: dict[str, str]) -> None:
    """Raises ConfigError for ``group.key`` that the selected plugin's Config lacks. When
    another installed plugin of the group has ``key``, or has the closest match to it and
    the selected plugin has none close, the message names that plugin and the
    ``+group=plugin`` that selects it; otherwise it lists the selected plugin's keys and
    the keys the group's other plugins add, each with its ``+group=plugin``."""
    from enginekit.config import DEFAULT_PLUGINS
    from enginekit.plugins import load_plugin, plugin_names

    current = selected.get(group, DEFAULT_PLUGINS[group])
    owners: dict[str, list[str]] = {}  # key -> the other plugins whose Config has it
    for name in plugin_names(group):
        if name == current:
            continue
        try:
            config_cls = load_plugin(group, name).Config
        except EngineKitError:
            continue  # a broken plugin is reported when it is selected
        for other_key in config_keys(config_cls):
            owners.setdefault(other_key, []).append(name)

    def selecting(other_key: str) -> str:
        return " or ".join(f"+{group}={name}" for name in owners[other_key])

    unknown = f"unknown key '{group}.{key}'"
    if key in owners:
        names = owners[key]
        raise ConfigError(
            f"{group}.{key} is a key of the {group} plugin{'s' * (len(names) > 1)} "
            f"{', '.join(names)}, not of the selected {group} {current!r}: add "
            f"{selecting(key)} to set it"
        )
    own_close = difflib.get_close_matches(key, valid, n=1)
    close = [] if own_close else difflib.get_close_matches(key, list(owners), n=1)
    if close:
        raise ConfigError(
            f"{unknown}; did you mean '{group}.{close[0]}'? It is a key of "
            f"{', '.join(owners[close[0]])}, not of the selected {group} {current!r}: add "
            f"{selecting(close[0])} to set it"
        )
    if own_close:
        hint = f"; did you mean '{group}.{own_close[0]}'?"
    else:
        others = ", ".join(f"{group}.{k} ({selecting(k)})" for k in sorted(owners))
        hint = f"; other {group} plugins add {others}" if others else ""
    raise ConfigError(f"{unknown}: the selected {group} {current!r} has {', '.join(valid)}{hint}")


def _check_value(arg: str, parent: Any, field_name: str, key: str) -> None:
    """Raises ConfigError, naming the key and the value, if a value ``arg`` sets (each
    option of a comma sweep) cannot be stored in the field ``field_name`` of the config
    dataclass ``parent`` (``cache.block_size=abc``). Interpolations, ranges and intervals
    pass; a line Hydra cannot parse is left to Hydra."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.core.override_parser.types import ChoiceSweep, Sweep
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    try:
        value = OverridesParser.create().parse_override(arg).value()
        node = OmegaConf.structured(parent)
    except Exception:  # Hydra's syntax errors are Hydra's to report
        return
    if isinstance(value, ChoiceSweep):
        values = list(value.list)
    elif isinstance(value, Sweep):
        return
    else:
        values = [value]
    for option in values:
        if isinstance(option, str) and "${" in option:
            continue
        try:
            setattr(node, field_name, option)
        except OmegaConfBaseException:
            takes = _VALUE_KINDS.get(type(node._get_node(field_name)).__name__, "another value")
            shown = repr(option) if isinstance(option, str) else _yaml_value(option)
            raise ConfigError(f"{arg}: {key} takes {takes}, not {shown}") from None


_VALUE_KINDS = {
    "IntegerNode": "an integer",
    "FloatNode": "a number",
    "BooleanNode": "true or false",
    "StringNode": "a string",
}
"""What a field of each OmegaConf node type takes, as a refusal says it."""


def _resolve_type(annotation: Any) -> Any:
    import enginekit.config as config_module

    if isinstance(annotation, str):
        return getattr(config_module, annotation, None)
    return annotation


def _plugin_config_class(group: str, selected: dict[str, str]) -> Any:
    from enginekit.config import DEFAULT_PLUGINS
    from enginekit.plugins import load_plugin

    return load_plugin(group, selected.get(group, DEFAULT_PLUGINS[group])).Config


def compose_config(overrides: list[str]) -> DictConfig:
    """The config the command line would build from ``overrides`` (no sweeps)."""
    from hydra import compose, initialize
    from hydra.errors import HydraException

    register_configs()
    rewritten = rewrite_overrides(overrides)
    try:
        with initialize(version_base=None, config_path=None):
            return compose(config_name=CONFIG_NAME, overrides=rewritten)
    except HydraException as exc:
        raise ConfigError(str(exc).strip()) from None
