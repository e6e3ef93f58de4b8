"""How each model family writes reasoning and tool calls: test data for the parser case table.

``WRITERS[tool_parser]`` renders a list of calls the way that family's model writes them; each entry
also names the reasoning parser the family pairs with and what the format can express.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from services.parse.parsers.reasoning import REASONING_FORMATS

Call = tuple[str, dict[str, Any]]


def dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)


def _py(value: Any) -> str:
    """A JSON value as Python source (pythonic tool calls)."""
    if isinstance(value, dict):
        return "{" + ", ".join(f"{_py(k)}: {_py(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ", ".join(map(_py, value)) + "]"
    return repr(value)


def _xml_value(value: Any) -> str:
    return value if isinstance(value, str) else dumps(value)


def _objects(calls: list[Call], key: str = "arguments") -> list[str]:
    return [f'{{"name": {dumps(n)}, "{key}": {dumps(a)}}}' for n, a in calls]


DS = (  # DeepSeek's markers
    "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>", "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>",  # noqa: RUF001
    "<｜tool▁sep｜>",  # noqa: RUF001
)


def _write(name: str, calls: list[Call], first: int = 0) -> str:
    if name in ("hermes", "qwen25"):
        return "\n".join(f"<tool_call>\n{o}\n</tool_call>" for o in _objects(calls))
    if name == "qwen3_coder":
        return "\n".join(
            f"<tool_call>\n<function={n}>\n"
            + "".join(f"<parameter={k}>\n{_xml_value(v)}\n</parameter>\n" for k, v in a.items())
            + "</function>\n</tool_call>" for n, a in calls)
    if name == "llama3_json":
        return "; ".join(_objects(calls, "parameters"))
    if name == "mistral":
        return "".join(f"[TOOL_CALLS]{n}[ARGS]{dumps(a)}" for n, a in calls)
    if name == "pythonic":
        return "[" + ", ".join(f"{n}(" + ", ".join(f"{k}={_py(v)}" for k, v in a.items()) + ")" for n, a in calls) + "]"
    if name in ("nemotron_deci", "default"):
        return "<TOOLCALL>[" + ", ".join(_objects(calls)) + "]</TOOLCALL>"
    if name == "phi4":
        return "functools[" + ", ".join(_objects(calls)) + "]"
    if name == "jamba":
        return "<tool_calls>[" + ", ".join(_objects(calls)) + "]</tool_calls>"
    if name == "deepseek_v3":
        body = "\n".join(f"{DS[2]}function{DS[4]}{n}\n```json\n{dumps(a)}\n```{DS[3]}" for n, a in calls)
        return DS[0] + body + DS[1]
    if name == "deepseek_v3_1":
        return DS[0] + "".join(f"{DS[2]}{n}{DS[4]}{dumps(a)}{DS[3]}" for n, a in calls) + DS[1]
    if name == "deepseek_v3_2":
        return "<｜DSML｜function_calls>\n" + "".join(  # noqa: RUF001
            f'<｜DSML｜invoke name="{n}">\n' + "".join(  # noqa: RUF001
                f'<｜DSML｜parameter name="{k}" string="{str(isinstance(v, str)).lower()}">'  # noqa: RUF001
                f"{_xml_value(v)}</｜DSML｜parameter>\n" for k, v in a.items())  # noqa: RUF001
            + "</｜DSML｜invoke>\n" for n, a in calls) + "</｜DSML｜function_calls>"  # noqa: RUF001
    if name == "kimi_k2":
        return "<|tool_calls_section_begin|>" + "".join(
            f"<|tool_call_begin|>functions.{n}:{i}<|tool_call_argument_begin|>{dumps(a)}<|tool_call_end|>"
            for i, (n, a) in enumerate(calls, first)) + "<|tool_calls_section_end|>"
    if name in ("glm45", "glm47"):
        nl = "\n" if name == "glm45" else ""
        return nl.join(
            f"<tool_call>{n}{nl}" + "".join(
                f"<arg_key>{k}</arg_key>{nl}<arg_value>{_xml_value(v)}</arg_value>{nl}" for k, v in a.items())
            + "</tool_call>" for n, a in calls)
    if name == "minimax_m2":
        return "<minimax:tool_call>\n" + "".join(
            f'<invoke name="{n}">\n' + "".join(f'<parameter name="{k}">{_xml_value(v)}</parameter>\n'
                                             for k, v in a.items()) + "</invoke>\n" for n, a in calls
        ) + "</minimax:tool_call>"
    if name == "harmony":
        return "<|start|>assistant".join(
            f"<|channel|>commentary to=functions.{n} <|constrain|>json<|message|>{dumps(a)}<|call|>" for n, a in calls)
    raise KeyError(name)


def tagged_reasoning(parser: str) -> Callable[[str], str]:
    fmt = REASONING_FORMATS[parser]
    return lambda text: fmt.starts[0] + fmt.inner + text + fmt.inner + fmt.ends[0] + fmt.separator


def harmony_reasoning(text: str) -> str:
    return f"<|channel|>analysis<|message|>{text}<|end|><|start|>assistant"


@dataclass(frozen=True)
class Family:
    """One tool format with its paired reasoning parser and what the format can express."""

    tool_parser: str
    reasoning_parser: str
    reasoning: Callable[[str], str]
    text_before_calls: bool = True     # text may precede a call (not for formats that must open the output)
    parallel_in_one_block: bool = True
    call_ids: Callable[[int, str], str] | None = None
    text: Callable[[str], str] = str
    prompt: str = ""    # the rendered prompt the output follows (a forced family's says thinking is off)

    def calls(self, calls: list[Call], first: int = 0) -> str:
        """``calls`` as the model writes them; ``first`` is the turn's index of the first one."""
        return _write(self.tool_parser, calls, first)


def _family(tool: str, reasoning: str = "qwen3", **kw: Any) -> Family:
    fmt = REASONING_FORMATS[reasoning]
    # A forced family starts inside reasoning unless its prompt closed the block: these cases are written
    # with explicit blocks, so their prompt is the template's thinking-off one.
    prompt = tagged_reasoning(reasoning)("") if fmt.forced else ""
    return Family(tool, reasoning, tagged_reasoning(reasoning), prompt=prompt, **kw)


FAMILIES: dict[str, Family] = {f.tool_parser: f for f in (
    _family("hermes"), _family("qwen25"), _family("qwen3_coder"),
    _family("llama3_json", "basic", text_before_calls=False),
    _family("mistral", "mistral"),
    _family("pythonic", "basic", text_before_calls=False),
    _family("nemotron_deci", "nemotron_deci"), _family("phi4", "basic"), _family("jamba", "basic"),
    _family("deepseek_v3", "deepseek_v3"), _family("deepseek_v3_1", "deepseek_v3_1"),
    _family("deepseek_v3_2", "deepseek_v3_1"),
    _family("kimi_k2", "kimi_k25", call_ids=lambda i, n: f"functions.{n}:{i}"),
    _family("glm45", "glm45"), _family("glm47", "glm45"), _family("minimax_m2", "minimax_m2"),
    Family("harmony", "gpt_oss", harmony_reasoning,
           text=lambda t: f"<|channel|>final<|message|>{t}<|end|><|start|>assistant"),
    _family("default", "basic"),
)}
