"""Chat template rendering with Hugging Face's own renderer, plus an injectable template clock."""

from __future__ import annotations

import contextvars
import functools
import re
import time
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any, cast

import jinja2
from jinja2.runtime import LoopContext
from jinja2.utils import Namespace
from transformers.utils.chat_template_utils import (
    _alias_reasoning_fields,
    _compile_jinja_template,
    render_jinja_template,
)

from services.common.errors import InvalidRequestError
from services.parse import json_memo
from services.parse.conversation import TemplateInput

Clock = Callable[[], datetime]

# Names the renderer passes itself; a template kwarg may not replace them.
RESERVED_KWARGS = frozenset({
    "messages", "conversations", "tools", "documents", "chat_template", "add_generation_prompt",
    "continue_final_message", "return_assistant_tokens_mask",
})

# A template that concatenates ``...['arguments']`` with ``+``/``~`` (DeepSeek's) needs the arguments as
# JSON text: a mapping there raises TypeError. Every other template takes a mapping (the HF convention).
_TEXT_ARGUMENTS = re.compile(
    r"""(?:\+|~)\s*[\w.]+(?:\[['"]\w+['"]\])*(?:\[['"]arguments['"]\]|\.arguments)\s*(?:\+|~)"""
    r"""|(?:\[['"]arguments['"]\]|\.arguments)\s*(?:\+|~)"""
)


def wants_text_arguments(template: str) -> bool:
    """True when ``template`` concatenates tool-call arguments as text (see ``_TEXT_ARGUMENTS``)."""
    return _TEXT_ARGUMENTS.search(template) is not None


_clock: contextvars.ContextVar[Clock] = contextvars.ContextVar("harnessmesh_template_clock", default=datetime.now)


def _strftime_now(fmt: str) -> str:
    return _clock.get()().strftime(fmt)


# The render budget: the monotonic time a render must end by (None: no budget), checked every
# ``_CHECK_EVERY`` attribute / item / call operations of the sandbox (a 100k-token render makes ~800).
_deadline: contextvars.ContextVar[float | None] = contextvars.ContextVar("harnessmesh_render_deadline", default=None)
_CHECK_EVERY = 256


# Every attribute a plain dict instance has (its type's and object's): any other name is a key lookup.
_DICT_ATTRIBUTES = frozenset(dir(dict))
# Types whose public attributes the immutable sandbox always allows (none is internal or a known mutable):
# ``message.content.strip``, ``loop.last``, ``ns.prev``. Only ``str.format`` / ``format_map`` values need its
# wrapping. Read straight, ~2-5 us less each (~130 per 100k-token render). A template's ``namespace()`` is
# transformers' own subclass of Namespace (made with each compiled template), added per environment.
_PLAIN_ATTRIBUTE_TYPES = frozenset({str, LoopContext, Namespace})
_FORMAT_METHODS = frozenset({"format", "format_map"})


_MISSING = object()


class _BudgetExceeded(Exception):
    """A render ran past its deadline (raised inside the template, turned into InvalidRequestError)."""


def _install_budget(env: Any) -> None:
    """Make the sandbox's attribute, item and call hooks (every template operation on data goes through one)
    check the current render's deadline every ``_CHECK_EVERY`` operations; once per compiled environment."""
    if getattr(env, "_harnessmesh_budget", False):
        return
    left = _CHECK_EVERY  # operations until the next look at the clock (counted down inline: a call less each)

    def check() -> None:
        nonlocal left
        left = _CHECK_EVERY
        deadline = _deadline.get()
        if deadline is not None and time.monotonic() > deadline:
            raise _BudgetExceeded()

    getattr_, getitem, call, undefined = env.getattr, env.getitem, env.call, env.undefined
    namespace = env.globals.get("namespace")
    plain_types = _PLAIN_ATTRIBUTE_TYPES | (
        {namespace} if isinstance(namespace, type) and issubclass(namespace, Namespace) else set())

    def budget_getattr(obj: Any, attribute: str) -> Any:
        nonlocal left
        left -= 1
        if not left:
            check()
        cls = type(obj)
        if cls is dict and attribute not in _DICT_ATTRIBUTES:
            # ``message.content`` on a plain dict: what the sandbox does (getattr fails, so the item or
            # undefined), without raising and catching AttributeError first
            try:
                return obj[attribute]
            except KeyError:
                return undefined(obj=obj, name=attribute)
        if cls in plain_types and not attribute.startswith("_") and attribute not in _FORMAT_METHODS:
            value = getattr(obj, attribute, _MISSING)
            if value is not _MISSING and getattr(value, "__name__", None) not in _FORMAT_METHODS:
                return value  # what the sandbox returns for it (see _PLAIN_ATTRIBUTE_TYPES)
        return getattr_(obj, attribute)

    def budget_getitem(obj: Any, argument: Any) -> Any:
        nonlocal left
        left -= 1
        if not left:
            check()
        return getitem(obj, argument)

    def budget_call(__context: Any, __obj: Any, *args: Any, **kwargs: Any) -> Any:
        nonlocal left
        left -= 1
        if not left:
            check()
        return call(__context, __obj, *args, **kwargs)

    env.getattr, env.getitem, env.call = budget_getattr, budget_getitem, budget_call
    encode = env.filters.get("tojson")
    if encode is not None:  # transformers' own (no HTML escaping); registered objects are encoded once
        env.filters["tojson"] = functools.partial(_kept_tojson, encode)
    env._harnessmesh_budget = True


def _kept_tojson(encode: Callable[..., str], value: Any, *args: Any, **kwargs: Any) -> str:
    """``encode(value, ...)``, from :data:`services.parse.json_memo.MEMO` when ``value`` is registered there."""
    return json_memo.MEMO.encoded(value, args, kwargs, lambda: encode(value, *args, **kwargs))


class ChatTemplateRenderer:
    """Renders a chat template exactly as ``transformers``' ``apply_chat_template(tokenize=False)`` does.

    Named special tokens (bos_token, eos_token, ...) are template variables. ``now`` is the clock behind
    the template's ``strftime_now``. transformers turns every render kwarg into plain JSON data, so a
    callable cannot be passed that way; instead the compiled template's own globals layer (shared by
    every render of that template) gets a ``strftime_now`` that reads a context variable, which each
    render sets to its renderer's clock. ``arguments_as_text`` tells whether the template wants tool-call
    arguments as JSON text (DeepSeek) rather than a mapping; ``to_template_input`` prepares them so.
    ``budget``: seconds a render may take (None: unbounded); past it the render stops and the request gets an
    InvalidRequestError (400) naming the budget. Renders run in a thread but hold the GIL: the budget is
    what bounds how long one hostile conversation can slow the service's event loop.
    """

    def __init__(self, template: str, special_tokens: Mapping[str, str], now: Clock = datetime.now,
                 budget: float | None = None) -> None:
        self._template = template
        self.template = template
        self._special = dict(special_tokens)
        self._now = now
        self._budget = budget
        self.arguments_as_text = wants_text_arguments(template)
        self._compiled()  # fail fast on a template that does not compile

    def _compiled(self) -> Any:
        try:
            compiled = _compile_jinja_template(self._template)
        except jinja2.TemplateError as exc:
            raise InvalidRequestError(f"the chat template does not compile: {exc}") from exc
        compiled.globals["strftime_now"] = _strftime_now
        _install_budget(compiled.environment)
        return compiled

    def render(self, data: TemplateInput) -> str:
        """The prompt text; template errors (including ``raise_exception``) raise InvalidRequestError."""
        reserved = RESERVED_KWARGS.intersection(data.kwargs)
        if reserved:
            raise InvalidRequestError(f"chat_template_kwargs_json may not set {sorted(reserved)}",
                                      param="chat_template_kwargs_json")
        compiled = self._compiled()  # the compile cache may have been refreshed: (re)install the clock
        token = _clock.set(self._now)
        budget = _deadline.set(None if self._budget is None else time.monotonic() + self._budget)
        try:
            if data.continue_final_message:  # transformers edits the final message around the render
                # Annotated as str, but returns (rendered chats, generation indices).
                result: Any = render_jinja_template(
                    conversations=[data.messages],
                    tools=cast(Any, data.tools),
                    chat_template=self._template,
                    add_generation_prompt=data.add_generation_prompt,
                    continue_final_message=True,
                    **{**self._special, **data.kwargs},
                )
                return str(result[0][0])
            # What render_jinja_template does for this case, less its deep copy of every message through
            # ``_plain_template_data`` (~0.25 ms of a 100k-token turn): a TemplateInput holds plain JSON
            # data already, the same values that copy would make, and the immutable sandbox never edits it.
            return str(compiled.render(
                messages=_alias_reasoning_fields(data.messages),
                tools=data.tools,
                documents=None,
                add_generation_prompt=data.add_generation_prompt,
                **{**self._special, **data.kwargs},
            ))
        except jinja2.TemplateError as exc:
            raise InvalidRequestError(str(exc) or type(exc).__name__, param="messages") from exc
        except (ValueError, TypeError) as exc:
            raise InvalidRequestError(str(exc), param="messages") from exc
        except _BudgetExceeded:
            assert self._budget is not None
            raise InvalidRequestError(
                f"rendering the conversation took over the render budget of {self._budget * 1000:.0f} ms "
                "(--render-budget-ms): send fewer or shorter messages", param="messages") from None
        finally:
            _deadline.reset(budget)
            _clock.reset(token)
