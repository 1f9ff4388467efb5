"""Loading a config: TOML file or dict merged onto the default chain, plugins, snapshots.

A ``chainrun.toml`` overrides the built-in default *key by key* (a deep merge), so
pointing the default chain at another OpenAI-compatible server takes only::

    [providers.local]
    base_url = "http://127.0.0.1:8080/v1"

A step table whose ``kind`` differs from the default step of the same name replaces it
whole (the default's keys belong to another kind); a step's ``json_schema`` and ``when``
replace the default's whole (``when = {}``: the step runs on every turn).
A default step's ``when`` that a file keeps while its ``order`` leaves out the step
that serves the labels it skips (a config written before the default chain had the
``policy`` step, listing ``order`` without it) is an error: those labels would reach
neither step (:func:`route_without_step`).
``plugins = ["shop_steps"]`` imports those modules before the config is validated, so
the kinds they register can be named in ``[steps.NAME] kind``. Every mistake is one
:class:`~chainrun.errors.ConfigError` naming the field path and the bad value, before
anything is written.
"""

from __future__ import annotations

import copy
import importlib
import importlib.util
import json
import re
import sys
import tomllib
import traceback
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from chainrun.config.chain import DEFAULT_KIND, ChainConfig
from chainrun.config.defaults import DEFAULT_CHAIN
from chainrun.errors import ConfigError
from chainrun.steps.config import route_problem


def deep_merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    """Merge ``override`` onto ``base`` key by key (tables recursively, other values replaced).

    Returns a new dict; neither input is changed.
    """
    out = copy.deepcopy(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def format_validation_error(source: str, err: ValidationError) -> str:
    """The first error of ``err`` as one line: ``SOURCE: PATH: what (got VALUE)``."""
    first = err.errors()[0]
    path = ".".join(str(p) for p in first["loc"])
    msg = first["msg"].removeprefix("Value error, ")
    if first["type"] == "extra_forbidden" and msg.startswith("Extra inputs"):
        msg = "unknown field"
    elif first["type"] == "missing":
        msg = "required (it has no default)"
    value = first.get("input")
    shown = "" if isinstance(value, dict) or first["type"] == "missing" else f" (got {value!r})"
    if "(got" in msg or "got " in msg or repr(value) in msg:
        shown = ""
    return f"{source}: {path + ': ' if path else ''}{msg}{shown}"


def load_plugins(names: Any, source: str, *, folder: Path | None = None) -> None:
    """Import the modules a config names in ``plugins`` (so the step kinds they register
    exist before the config is validated). An entry ``"module:function"`` also calls
    ``module.function()`` (an entry point's object reference). Modules are looked up on
    ``sys.path``, then in ``folder`` (the config file's folder; the current folder for a
    stored config), which is added to the end of ``sys.path``.

    Raises:
        ConfigError: ``plugins`` is not a list of names, or one does not import (one line
            naming it and the import's error), or its function is missing or fails.
    """
    if names is None or names == []:
        return
    if not isinstance(names, list) or not all(isinstance(n, str) and n.strip() for n in names):
        raise ConfigError(
            f"{source}: plugins: expected a list of module names (or module:function), "
            f"got {names!r}"
        )
    where = str((folder or Path.cwd()).resolve())
    if where not in sys.path:
        sys.path.append(where)
    for entry in names:
        module_name, _, function = entry.strip().partition(":")
        try:
            module = importlib.import_module(module_name)
        except Exception as e:  # a plugin's own error (SyntaxError, a duplicate kind...)
            raise ConfigError(f"{source}: plugins: {_import_problem(module_name, e, where)}"
                              ) from None  # fmt: skip
        if not function:
            continue
        hook = getattr(module, function, None)
        if not callable(hook):
            raise ConfigError(
                f"{source}: plugins: {entry!r}: module {module_name!r} has no function "
                f"{function!r}"
            )
        try:
            hook()
        except Exception as e:
            raise ConfigError(
                f"{source}: plugins: {entry!r} failed ({type(e).__name__}: {e})"
            ) from None


def _import_problem(module_name: str, e: Exception, where: str) -> str:
    """Why ``module_name`` did not import: not found (nothing of that name on the path or
    in ``where``), or found but failed in its own code, then naming its file and the
    line where it failed (an import of its own that is missing, a syntax error, ...)."""
    missing = getattr(e, "name", None) if isinstance(e, ModuleNotFoundError) else None
    error = f"{type(e).__name__}: {e}"
    if missing is not None and (module_name + ".").startswith(missing + "."):
        return (f"cannot import {module_name!r} ({error}); expected a module on the Python "
                f"path or in {where}")  # fmt: skip
    try:
        spec = importlib.util.find_spec(module_name)
    except (ImportError, ValueError):
        spec = None
    origin = spec.origin if spec is not None else None
    line = e.lineno if isinstance(e, SyntaxError) else None
    for frame in traceback.extract_tb(e.__traceback__):
        if origin is not None and frame.filename == origin:
            line = frame.lineno  # the plugin's own line, last seen
    at = f" at line {line}" if line is not None else ""
    found = f" ({origin})" if origin else ""
    return (f"cannot import {module_name!r}: the module was found{found} but failed "
            f"while importing{at} ({error})")


def _merged(data: dict[str, Any]) -> dict[str, Any]:
    """``data`` merged onto the default chain (see the module text)."""
    merged = deep_merge(DEFAULT_CHAIN, data)
    user_steps = data.get("steps", {}) if isinstance(data.get("steps"), dict) else {}
    merged_steps = merged.get("steps")
    if not isinstance(merged_steps, dict):
        return merged
    for name, step in user_steps.items():
        default = DEFAULT_CHAIN["steps"].get(name)
        if not isinstance(step, dict) or default is None:
            continue
        default_kind = default.get("kind", DEFAULT_KIND)
        if step.get("kind", default_kind) != default_kind:
            # another kind: the default step's keys are not its keys
            merged_steps[name] = copy.deepcopy(step)
        elif isinstance(merged_steps.get(name), dict):
            # a JSON Schema is one value: the user's replaces the default's whole (merged
            # key by key, its "properties" and "required" would mix with the default's);
            # so is a routing condition (the default retrieve's `not` list would be ANDed
            # with the user's own fields; `when = {}` must run the step on every turn)
            for key in ("json_schema", "when"):
                if key in step:
                    merged_steps[name][key] = copy.deepcopy(step[key])
    # A built-in step the user's order leaves out is dropped (a shorter chain needs only
    # `order`); a step the user wrote but left out of order is a mistake, reported later.
    order = merged.get("order")
    if isinstance(order, list):
        merged["steps"] = {k: v for k, v in merged_steps.items() if k in order or k in user_steps}
    return merged


def config_from_dict(
    data: dict[str, Any], source: str = "config", *, path: str | None = None
) -> ChainConfig:
    """Validate a config dict merged onto the default chain, after importing its
    ``plugins`` (``path``: the file it came from, recorded on the error; plugins are
    also looked up in its folder).

    Raises:
        ConfigError: one line naming ``source``, the field path and the bad value.
    """
    folder = Path(path).parent if path is not None else None
    try:
        load_plugins(data.get("plugins"), source, folder=folder)
    except ConfigError as e:
        raise ConfigError(str(e), path=path) from None
    try:
        config = ChainConfig.model_validate(_merged(data))
    except ValidationError as e:
        raise ConfigError(format_validation_error(source, e), path=path) from None
    problem = route_without_step(data, config)
    if problem is not None:
        raise ConfigError(f"{source}: {problem}", path=path)
    config.loaded_from(path)
    return config


def route_without_step(data: dict[str, Any], config: ChainConfig) -> str | None:
    """Why ``config`` (validated from the file's ``data``) leaves labels with no route,
    in one line (None: it does not).

    A step of the default chain routed on the label whose ``when`` the file does not
    set keeps the default's, which skips some labels because another default step
    serves them (retrieve skips order_status, returns and sizing: the policy step
    answers them). When the file's ``order`` leaves that other step out (written before
    the default chain had it) and no step in ``order`` routes those labels to itself, a
    turn with one of them gets neither. Only the labels the chain's classifying step
    can write count; a ``when`` the file sets, or an ``order`` that keeps both ends of
    a route, is the file's choice.
    """
    steps = data.get("steps")
    user_steps: dict[str, Any] = steps if isinstance(steps, dict) else {}
    # the labels of the step that writes the turn's label (a classify step, an llm
    # step with labels); none: nothing routes on a label this config knows
    labels = next((list(found) for n in config.order
                   if (found := getattr(config.steps[n], "labels", None))), [])  # fmt: skip
    if not labels:
        return None
    for name in config.order:
        step = config.steps[name]
        default = DEFAULT_CHAIN["steps"].get(name) or {}
        table = user_steps.get(name)
        if (step.when is None or set(step.when) != {"label"} or "when" not in default
                or (isinstance(table, dict) and "when" in table)):
            continue  # not a default route the file kept unchanged
        skipped = [lab for lab in labels if route_problem(step.when, {"label": lab}) is not None]
        # the default steps left out of order that served what this route skips
        absent = {n: d["when"] for n, d in DEFAULT_CHAIN["steps"].items()
                  if n != name and d.get("when") and n not in config.order}
        routed = [when for n in config.order
                  if n != name and (when := config.steps[n].when) and "label" in when]
        lost = [lab for lab in skipped
                if any(route_problem(w, {"label": lab}) is None for w in absent.values())
                and not any(route_problem(w, {"label": lab}) is None for w in routed)]
        if not lost:
            continue
        servers = [n for n, w in absent.items()
                   if any(route_problem(w, {"label": lab}) is None for lab in lost)]
        return (f"order: labels {', '.join(lost)} reach no step: steps.{name} keeps the "
                f"default `when` that skips them, and the step that serves them, "
                f"{servers[0]!r}, is not in order; add {servers[0]!r} to order, or give "
                f"[steps.{name}] `when = {{}}` to run it on every label")
    return None


def config_from_snapshot(snapshot: str, source: str = "run") -> ChainConfig:
    """The config a run was made with, from its stored snapshot (:meth:`ChainConfig.snapshot`),
    after importing its ``plugins`` (looked up on the Python path and the current folder).

    Raises:
        ConfigError: the snapshot is not a valid config (written by another version), or
            one of its plugins does not import.
    """
    where = f"{source} (stored config)"
    try:
        data = json.loads(snapshot)
    except ValueError as e:
        raise ConfigError(f"{source}: stored config is not JSON ({e})") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: stored config is not a JSON object")
    load_plugins(data.get("plugins"), where)
    try:
        return ChainConfig.model_validate(data)
    except ValidationError as e:
        raise ConfigError(format_validation_error(where, e)) from None


def load_config(path: str | Path | None = None) -> ChainConfig:
    """Load ``chainrun.toml`` (or the built-in default chain when ``path`` is None).

    When ``path`` is None and ``./chainrun.toml`` exists, that file is used.

    Raises:
        ConfigError: the file is missing, is not valid TOML, names a plugin that does not
            import, or fails validation.
    """
    if path is None:
        default = Path("chainrun.toml")
        if not default.exists():
            return config_from_dict({}, "built-in default")
        path = default
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8-sig")
    except OSError as e:
        raise ConfigError(f"{p}: cannot read config file ({e.strerror})", path=str(p)) from None
    except UnicodeDecodeError:
        raise ConfigError(f"{p}: not a text file (expected UTF-8 TOML)", path=str(p)) from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        at = re.search(r"at line (\d+)", str(e))
        raise ConfigError(
            f"{p}: not valid TOML ({e})", path=str(p), line=int(at.group(1)) if at else None
        ) from None
    config = config_from_dict(data, str(p), path=str(p))
    check_tools(config, str(p), p.parent)
    return config


def check_tools(config: ChainConfig, source: str, folder: Path) -> None:
    """Import every ``[tools.NAME] function`` of ``config`` now, as the chain will
    (looked up on the Python path, then in ``folder``, the config file's), so that a
    file naming one that does not import fails at its load (``chainrun config show``
    included), not at a turn or at serve's start.

    Raises:
        ConfigError: one line, ``SOURCE: tools.NAME.function: cannot import ...;
            expected ...``.
    """
    if not config.tools:
        return
    from chainrun.tools.tool import build_tools  # imports the tools' own code: only if any

    try:
        build_tools(config.tools, base_dir=folder)
    except ConfigError as e:
        raise ConfigError(f"{source}: {e}", path=config.path) from None


__all__ = [
    "check_tools",
    "config_from_dict",
    "config_from_snapshot",
    "deep_merge",
    "format_validation_error",
    "load_config",
    "load_plugins",
    "route_without_step",
]
