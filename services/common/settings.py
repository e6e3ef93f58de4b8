"""Frozen settings dataclasses with a command-line flag and an env-var twin for every field.

A service declares its settings as a frozen dataclass whose fields use :func:`option`::

    @dataclass(frozen=True)
    class WorkerSettings:
        speedup: float = option(1.0, "Divide every simulated duration by this factor.")

:func:`parse_settings` builds an ``argparse`` parser from the dataclass (``--speedup``), reads
defaults from the environment (``HARNESSMESH_WORKER_SPEEDUP``), validates, and returns the instance.
Fields marked ``shared=True`` mean the same thing in every service and use the env name without the
service part (``HARNESSMESH_MODEL``), so one variable configures the whole mesh.
"""

from __future__ import annotations

import argparse
import dataclasses
import enum
import os
import types
import typing
from collections.abc import Mapping, Sequence
from typing import Any, TypeVar

ENV_PREFIX = "HARNESSMESH_"

T = TypeVar("T")


def option(
    default: Any,
    help: str,
    *,
    shared: bool = False,
    wiring: bool = False,
    choices: Sequence[str] | None = None,
    metavar: str | None = None,
    secret: bool = False,
) -> Any:
    """Declare a settings field.

    ``shared``: the option means the same in every service (one env var, one launcher flag).
    ``wiring``: addresses and ports the launcher sets itself; not exposed on ``harnessmesh up``.
    ``secret``: the value (e.g. an API key) is masked in the start-up settings log event.
    """
    meta = {
        "help": help, "shared": shared, "wiring": wiring, "choices": choices, "metavar": metavar, "secret": secret,
    }
    if isinstance(default, list | dict):
        factory = default.copy
        return dataclasses.field(default_factory=factory, metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


def flag_name(field: dataclasses.Field[Any]) -> str:
    return "--" + field.name.replace("_", "-")


def env_name(service: str, field: dataclasses.Field[Any]) -> str:
    if field.metadata.get("shared"):
        return ENV_PREFIX + field.name.upper()
    return f"{ENV_PREFIX}{service.upper()}_{field.name.upper()}"


def _base_type(tp: Any) -> Any:
    """``int | None`` -> ``int``; ``list[str]`` -> ``list``."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        return _base_type(args[0])
    return origin or tp


def _convert(tp: Any, raw: str) -> Any:
    base = _base_type(tp)
    if base is bool:
        lowered = raw.strip().lower()
        if lowered in ("1", "true", "yes", "on"):
            return True
        if lowered in ("0", "false", "no", "off", ""):
            return False
        raise ValueError(f"not a boolean: {raw!r}")
    if base is list:
        (item,) = typing.get_args(_strip_optional(tp)) or (str,)
        return [_convert(item, part) for part in raw.split(",") if part.strip()]
    if isinstance(base, type) and issubclass(base, enum.Enum):
        return base(raw)
    return base(raw)


def _strip_optional(tp: Any) -> Any:
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        return next(a for a in typing.get_args(tp) if a is not type(None))
    return tp


def fields_of(cls: type[Any]) -> list[dataclasses.Field[Any]]:
    hints = typing.get_type_hints(cls)
    out = []
    for f in dataclasses.fields(cls):
        f.type = hints[f.name]
        out.append(f)
    return out


def add_arguments(
    parser: argparse.ArgumentParser,
    cls: type[Any],
    service: str,
    environ: Mapping[str, str],
    *,
    include: typing.Callable[[dataclasses.Field[Any]], bool] = lambda f: True,
    seen: set[str] | None = None,
) -> None:
    """Add one flag per field of ``cls`` to ``parser``, defaults taken from ``environ``."""
    group = parser.add_argument_group(f"{service} options")
    for f in fields_of(cls):
        if not include(f) or (seen is not None and f.name in seen):
            continue
        if seen is not None:
            seen.add(f.name)
        env = env_name(service, f)
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()  # type: ignore[misc,operator]
        if env in environ:
            try:
                default = _convert(f.type, environ[env])
            except ValueError as exc:
                parser.error(f"{env}={environ[env]!r}: {exc}")
        shown = "***" if f.metadata.get("secret") and default else repr(default)  # --help never prints a secret
        help_text = f"{f.metadata['help']} [env {env}; default {shown}]"
        base = _base_type(f.type)
        kwargs: dict[str, Any] = {"dest": f.name, "default": default, "help": help_text}
        if f.metadata.get("metavar"):
            kwargs["metavar"] = f.metadata["metavar"]
        if base is bool:
            kwargs["action"] = argparse.BooleanOptionalAction
        elif base is list:
            (item,) = typing.get_args(_strip_optional(f.type)) or (str,)
            kwargs["action"] = "append"
            kwargs["type"] = _base_type(item)
            kwargs["default"] = None
            kwargs["help"] = help_text + " (repeatable)"
            parser.set_defaults(**{f"_default_{f.name}": default})
        else:
            kwargs["type"] = base if base in (int, float, str) else (lambda raw, t=f.type: _convert(t, raw))
            if f.metadata.get("choices"):
                kwargs["choices"] = f.metadata["choices"]
        group.add_argument(flag_name(f), **kwargs)


def settings_from_namespace(cls: type[T], ns: argparse.Namespace) -> T:
    values: dict[str, Any] = {}
    for f in fields_of(cls):
        if not hasattr(ns, f.name):
            continue
        value = getattr(ns, f.name)
        if value is None and _base_type(f.type) is list:
            value = getattr(ns, f"_default_{f.name}", [])
        values[f.name] = value
    settings = cls(**values)
    validate = getattr(settings, "validate", None)
    if validate is not None:
        validate()
    return settings


def parse_settings(
    cls: type[T],
    service: str,
    argv: Sequence[str] | None = None,
    environ: Mapping[str, str] | None = None,
    *,
    prog: str | None = None,
    description: str | None = None,
) -> T:
    """Parse ``argv`` (flags win over env vars, env vars over defaults) into a ``cls`` instance."""
    env = os.environ if environ is None else environ
    parser = argparse.ArgumentParser(prog=prog, description=description or cls.__doc__)
    add_arguments(parser, cls, service, env)
    ns = parser.parse_args(argv)
    try:
        return settings_from_namespace(cls, ns)
    except ValueError as exc:
        parser.error(str(exc))
        raise  # unreachable: parser.error exits


def to_argv(settings: Any, *, only: typing.Callable[[dataclasses.Field[Any]], bool] = lambda f: True) -> list[str]:
    """Render settings back into flags (used by the launcher to pass options on)."""
    argv: list[str] = []
    for f in fields_of(type(settings)):
        if not only(f):
            continue
        value = getattr(settings, f.name)
        base = _base_type(f.type)
        if value is None:
            continue
        if base is bool:
            argv.append(flag_name(f) if value else "--no-" + f.name.replace("_", "-"))
        elif base is list:
            for item in value:
                argv += [flag_name(f), str(item)]
        else:
            argv += [flag_name(f), str(value.value if isinstance(value, enum.Enum) else value)]
    return argv


def as_log_dict(settings: Any) -> dict[str, Any]:
    """Settings as a plain dict for the one ``*.settings`` log event at start."""
    out = {f.name: getattr(settings, f.name) for f in dataclasses.fields(settings)}
    for f in dataclasses.fields(settings):
        if f.metadata.get("secret") and out[f.name]:
            out[f.name] = "***"
    return out
