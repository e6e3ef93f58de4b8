"""Chat template rendering as Hugging Face's ``apply_chat_template`` renders, plus an injectable template clock.

The template environment is built here (``compile_template``), the same one transformers 5.x builds for a chat
template (an immutable sandbox with ``trim_blocks``/``lstrip_blocks``, ``loopcontrols``, the ``generation`` tag, a
``tojson`` without HTML escaping, ``raise_exception``, ``strftime_now``, ``dict`` and a ``namespace`` refusing
underscore names), so renders do not change with the installed transformers release and nothing private of it is
imported.
"""

from __future__ import annotations

import contextvars
import copy
import functools
import json
import re
import time
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any

import jinja2
import jinja2.ext
from jinja2 import nodes
from jinja2.runtime import LoopContext
from jinja2.sandbox import ImmutableSandboxedEnvironment
from jinja2.utils import Namespace

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


# Names a message's reasoning comes under; templates read the first (``thinking`` for gpt-oss's).
REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")
_CONTINUE_TAG = "CONTINUE_FINAL_MESSAGE_TAG "


def alias_reasoning(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Messages whose reasoning (under any of ``REASONING_FIELDS``) is also under ``reasoning_content`` and
    ``thinking``, as transformers hands them to a template; a message without reasoning is the same object."""
    aliased = []
    for message in messages:
        if isinstance(message, dict):
            reasoning = next((message[k] for k in REASONING_FIELDS if message.get(k) is not None), None)
            if reasoning is not None:
                message = {"thinking": reasoning, **message, "reasoning_content": reasoning}
        aliased.append(message)
    return aliased


class _GenerationTag(jinja2.ext.Extension):
    """``{% generation %}...{% endgeneration %}`` (marks assistant text for training masks): renders its body."""

    tags = {"generation"}

    def parse(self, parser: Any) -> nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

    def _body(self, caller: Callable[[], str]) -> str:
        return caller()


class _TemplateDict:
    """``dict(...)`` and ``dict.fromkeys(...)`` in a template, without handing it the ``dict`` type."""

    def __call__(self, *args: Any, **kwargs: Any) -> dict[Any, Any]:
        return dict(*args, **kwargs)

    def fromkeys(self, *args: Any, **kwargs: Any) -> dict[Any, Any]:
        return dict.fromkeys(*args, **kwargs)


class _TemplateNamespace(Namespace):
    """A template's ``namespace()``: refuses underscore-prefixed names (no way to CPython internals)."""

    def __init__(*args: Any, **kwargs: Any) -> None:  # Namespace's signature trick: namespace(self=...) works
        self, rest = args[0], args[1:]
        attrs = dict(*rest, **kwargs)
        for name in attrs:
            _TemplateNamespace._check(name)
        Namespace.__init__(self, attrs)

    def __setitem__(self, name: str, value: Any) -> None:
        _TemplateNamespace._check(name)
        Namespace.__setitem__(self, name, value)

    @staticmethod
    def _check(name: Any) -> None:
        if isinstance(name, str) and name.startswith("_"):
            raise jinja2.exceptions.SecurityError(
                f"Chat templates cannot store underscore-prefixed attributes on a namespace, but got {name!r}. "
                "Please rename the attribute.")


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _tojson(x: Any, ensure_ascii: bool = False, indent: int | None = None, separators: Any = None,
            sort_keys: bool = False) -> str:
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


@functools.lru_cache(maxsize=128)
def compile_template(template: str) -> jinja2.Template:
    """``template`` compiled in a chat template's environment (see the module docstring); one per template text."""
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[_GenerationTag, jinja2.ext.loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    env.globals["dict"] = _TemplateDict()
    env.globals["namespace"] = _TemplateNamespace
    return env.from_string(template)


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
    the template's ``strftime_now``, which reads a context variable that each render sets to its renderer's
    clock. ``arguments_as_text`` tells whether the template wants tool-call
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
            compiled = compile_template(self._template)
        except jinja2.TemplateError as exc:
            raise InvalidRequestError(f"the chat template does not compile: {exc}") from exc
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
            messages = alias_reasoning(data.messages)
            if data.continue_final_message:
                return self._render_continuing(compiled, messages, data)
            # A TemplateInput holds plain JSON data already (what transformers' deep copy of every message
            # would make, ~0.25 ms of a 100k-token turn), and the immutable sandbox never edits it.
            return str(compiled.render(
                messages=messages,
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

    def _render_continuing(self, compiled: jinja2.Template, messages: list[dict[str, Any]],
                           data: TemplateInput) -> str:
        """The render ending inside the final message's content, left open (what ``continue_final_message``
        does in transformers: tag the text, render, cut at the tag)."""
        if not messages:
            raise ValueError("continue_final_message is set but the conversation is empty!")
        final = messages[-1] = copy.deepcopy(messages[-1])
        text = final.get("content")
        if text is None:
            raise ValueError('continue_final_message is set but the final message has no "content" to continue!')
        if "content" not in self._template:
            raise ValueError('continue_final_message is set to "content" but this is not an accepted field in the '
                             "chat_template")
        if isinstance(text, list | tuple):
            block = next((b for b in reversed(text) if "text" in b), None)
            if block is None:
                raise ValueError(
                    "continue_final_message is set but we could not find any text to continue in the final message!")
            text = block["text"]
            block["text"] = text + _CONTINUE_TAG
        else:
            final["content"] = text + _CONTINUE_TAG
        rendered = str(compiled.render(messages=messages, tools=data.tools, documents=None,
                                       add_generation_prompt=data.add_generation_prompt,
                                       **{**self._special, **data.kwargs}))
        if text.strip() not in rendered or _CONTINUE_TAG.strip() not in rendered:
            raise ValueError(
                "continue_final_message is set but the final message does not appear in the chat after "
                "applying the chat template! This can happen if the chat template deletes portions of "
                "the final message. Please verify the chat template and final message in your chat to "
                "ensure they are compatible."
                f"Final message to continue: {text.strip()}\nRendered chat:\n{rendered}")
        at = rendered.rindex(_CONTINUE_TAG.strip())
        if rendered[at: at + len(_CONTINUE_TAG)] == _CONTINUE_TAG:
            return rendered[:at]
        return rendered[:at].rstrip()  # the template trimmed the message's trailing space
