"""``--model-alias``: other model names clients may ask for, exact names and glob patterns.

Each entry is ``NAME=SERVED``. A ``NAME`` holding a glob character (``*``, ``?``, ``[``) is a pattern in
``fnmatch`` syntax, matched against the whole requested name, case-sensitively (``'claude-*=demo'``);
any other ``NAME`` is an exact name. A requested name resolves to the exact name if there is one, else to
the first pattern, in the order given, that matches it. Harnesses invent names (Claude Code asks for its
own current Haiku id for a sub-agent whose definition says ``model: haiku``), so one pattern keeps every
such request from a 404.

On the hot path a name costs a dict lookup: the patterns are compiled once, and the outcome for a name
(the alias, or none) is remembered, up to :data:`MEMO_LIMIT` distinct names (beyond that, new names are
matched each time rather than remembered, so a client making up names cannot grow the table).
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import NamedTuple

from opentelemetry import trace

GLOB_CHARACTERS = frozenset("*?[")
MEMO_LIMIT = 4096


def is_pattern(name: str) -> bool:
    """Whether an alias name is a glob pattern rather than an exact name."""
    return not GLOB_CHARACTERS.isdisjoint(name)


@dataclass(frozen=True)
class ModelAlias:
    """One ``--model-alias`` entry: requests for ``name`` (a glob pattern when ``pattern``) go to ``target``."""

    name: str
    target: str
    pattern: bool = False
    _regex: re.Pattern[str] | None = field(default=None, compare=False, repr=False)

    @classmethod
    def parse(cls, entry: str) -> ModelAlias:
        """``NAME=SERVED`` (whitespace around either side ignored); a malformed entry raises ValueError."""
        name, sep, target = entry.partition("=")
        name, target = name.strip(), target.strip()
        if not sep or not name or not target:
            raise ValueError(f"model_alias must be NAME=SERVED (NAME may be a glob pattern), got {entry!r}")
        return cls.of(name, target)

    def __post_init__(self) -> None:
        if self.pattern and self._regex is None:
            object.__setattr__(self, "_regex", re.compile(fnmatch.translate(self.name)))  # compiled once

    @classmethod
    def of(cls, name: str, target: str) -> ModelAlias:
        """``name`` served by ``target``; a pattern when ``name`` holds a glob character."""
        return cls(name, target, is_pattern(name))

    def matches(self, requested: str) -> bool:
        if self._regex is None:
            return requested == self.name
        return self._regex.match(requested) is not None


# Span attributes of a request that names a model (the access line carries them as model, requested_model,
# model_alias): the name it resolved to (the public name of the served model), the name asked for (when
# the request named one), and the alias entry that matched (when one did).
RESOLVED_MODEL = "harnessmesh.model.resolved"
REQUESTED_MODEL = "harnessmesh.model.requested"
MODEL_ALIAS = "harnessmesh.model.alias"


class Resolution(NamedTuple):
    """How a request's model name resolved: ``public`` is the name the client is answered with (what it asked
    for, when an alias matched), ``resolved`` the served model's public name (empty: nothing serves the name),
    ``alias`` the entry used."""

    requested: str
    public: str
    resolved: str
    alias: ModelAlias | None = None

    def attributes(self) -> dict[str, str]:
        """The span attributes (:data:`RESOLVED_MODEL`, :data:`REQUESTED_MODEL`, :data:`MODEL_ALIAS`)."""
        attrs = {RESOLVED_MODEL: self.resolved} if self.resolved else {}
        if self.requested:
            attrs[REQUESTED_MODEL] = self.requested
        if self.alias is not None:
            attrs[MODEL_ALIAS] = self.alias.name
        return attrs

    def annotate_span(self) -> None:
        """Set :meth:`attributes` on the current span (when it records; the HTTP access line's tap always does)."""
        span = trace.get_current_span()
        if span.is_recording():
            span.set_attributes(self.attributes())

    def access_fields(self) -> dict[str, str]:
        """The same as access-line fields: ``model``, ``requested_model``, ``model_alias``."""
        fields = {"model": self.resolved} if self.resolved else {}
        if self.requested:
            fields["requested_model"] = self.requested
        if self.alias is not None:
            fields["model_alias"] = self.alias.name
        return fields


class ModelAliases:
    """The gateway's ``--model-alias`` entries, in resolution order: exact names, then patterns as given.

    A name given twice keeps its first entry (first match wins, for exact names as for patterns).
    """

    def __init__(self, aliases: Iterable[ModelAlias] = ()) -> None:
        self._exact: dict[str, ModelAlias] = {}
        patterns: dict[str, ModelAlias] = {}
        for alias in aliases:
            table = patterns if alias.pattern else self._exact
            table.setdefault(alias.name, alias)
        self._patterns = tuple(patterns.values())
        self._memo: dict[str, ModelAlias | None] = {}

    @classmethod
    def parse(cls, entries: Iterable[str]) -> ModelAliases:
        """From ``NAME=SERVED`` strings (the flag's values); a malformed one raises ValueError."""
        return cls(ModelAlias.parse(entry) for entry in entries)

    @classmethod
    def coerce(cls, aliases: ModelAliases | Mapping[str, str] | None) -> ModelAliases:
        """``aliases`` as is, or a ``{NAME: SERVED}`` mapping's entries in its order."""
        if isinstance(aliases, ModelAliases):
            return aliases
        return cls(ModelAlias.of(name, target) for name, target in (aliases or {}).items())

    def match(self, requested: str) -> ModelAlias | None:
        """The alias that serves ``requested``: its exact name, else the first matching pattern, else None."""
        exact = self._exact.get(requested)
        if exact is not None or not self._patterns:
            return exact
        try:
            return self._memo[requested]
        except KeyError:
            pass
        found = next((alias for alias in self._patterns if alias.matches(requested)), None)
        if len(self._memo) < MEMO_LIMIT:
            self._memo[requested] = found
        return found

    def __iter__(self) -> Iterator[ModelAlias]:
        """Every entry in resolution order: exact names, then the patterns in the order given."""
        yield from self._exact.values()
        yield from self._patterns

    def __len__(self) -> int:
        return len(self._exact) + len(self._patterns)

    def names(self) -> list[str]:
        """Every alias name (patterns as written) in resolution order."""
        return [alias.name for alias in self]


__all__ = ["GLOB_CHARACTERS", "MEMO_LIMIT", "MODEL_ALIAS", "REQUESTED_MODEL", "RESOLVED_MODEL", "ModelAlias",
           "ModelAliases", "Resolution", "is_pattern"]
