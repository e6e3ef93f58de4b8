"""The mesh's processes as the launcher knows them: module, settings class, wiring overrides."""

from __future__ import annotations

import dataclasses
import importlib
from dataclasses import dataclass
from typing import Any

from services.common.settings import env_name, fields_of, to_argv


@dataclass(frozen=True)
class ServiceSpec:
    """One kind of process: ``python -m <module>`` configured by ``<settings_path>``."""

    name: str
    module: str
    settings_path: str  # "package.module:ClassName"

    def settings_class(self) -> type[Any]:
        module_name, _, class_name = self.settings_path.partition(":")
        cls: type[Any] = getattr(importlib.import_module(module_name), class_name)
        return cls


ROUTER = ServiceSpec("router", "services.router", "services.router.settings:RouterSettings")
WORKER = ServiceSpec("worker", "services.worker", "services.worker.settings:WorkerSettings")
PARSE = ServiceSpec("parse", "services.parse", "services.parse.settings:ParseSettings")
GATEWAY = ServiceSpec("gateway", "gateway", "gateway.settings:GatewaySettings")
ALL_SERVICES = (ROUTER, WORKER, PARSE, GATEWAY)


def is_exposed(field: dataclasses.Field[Any]) -> bool:
    """Options `harnessmesh up` offers and passes on (wiring is the launcher's own business)."""
    return not field.metadata.get("wiring")


def build_settings(cls: type[Any], values: dict[str, Any], overrides: dict[str, Any]) -> Any:
    """An instance of ``cls`` from parsed launcher values plus the launcher's wiring."""
    kwargs = {}
    for f in fields_of(cls):
        if f.name in overrides:
            kwargs[f.name] = overrides[f.name]
        elif f.name in values and is_exposed(f):
            kwargs[f.name] = values[f.name]
    settings = cls(**kwargs)
    validate = getattr(settings, "validate", None)
    if validate is not None:
        validate()
    return settings


def child_argv(spec: ServiceSpec, settings: Any) -> list[str]:
    """Every option spelled out as a flag, so a child never depends on defaults drifting apart; secrets
    excepted (:func:`child_secrets`): any local user can read a process's argv in ``/proc``."""
    return ["-m", spec.module, *to_argv(settings, only=lambda f: not f.metadata.get("secret"))]


def child_secrets(spec: ServiceSpec, settings: Any) -> dict[str, str]:
    """The secret options as the environment variables the child's settings read them from (their env
    twins, e.g. ``HARNESSMESH_GATEWAY_API_KEY``); unset ones are left out."""
    out: dict[str, str] = {}
    for f in fields_of(type(settings)):
        value = getattr(settings, f.name)
        if f.metadata.get("secret") and value:
            out[env_name(spec.name, f)] = ",".join(value) if isinstance(value, list) else str(value)
    return out
