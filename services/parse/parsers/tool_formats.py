# ruff: noqa: RUF001 - DeepSeek's markers are spelled with fullwidth bars, on purpose
"""Tool-call formats as data: one row per family, run by ``tool_machine.MarkedToolParser``.

A format is a grammar in a few fields. A *section* opens with one of ``sections``' start markers
(or, with ``bare_start``, a ``{`` / ``[`` that opens the output) and holds one or more calls. Each call
is either a JSON object carrying its name (``{"name": .., "arguments": ..}``, optionally inside a JSON
array) — chosen whenever the call begins with ``{`` or ``[`` — or a *header* (``call_start`` .. one of
``header_ends``) naming the function followed by the arguments: a JSON value, or XML-style
parameters when ``params`` is set. ``call_end`` closes a call.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class ParamsFormat:
    """XML-style parameters: ``open KEY key_end value_start VALUE value_end``.

    ``trim``: one newline the template writes around a value (Qwen3-Coder). A key header carrying
    ``string="false"`` (DeepSeek DSML) holds JSON; otherwise the tool's schema types the value.
    """

    open: str
    key_end: str
    value_end: str
    value_start: str = ""
    trim: str = ""


@dataclass(frozen=True)
class ToolFormat:
    """One family's tool-call grammar (see the module docstring)."""

    sections: tuple[tuple[str, str], ...]       # (start, end) pairs; end "" = the section ends with its calls
    call_start: str = ""
    header_ends: tuple[str, ...] = ()           # the name ends at the first of these (kept if it opens params)
    name_after: str = ""                        # the name is what follows this inside the header
    name_prefix: str = ""                       # dropped from the name (Kimi's and Harmony's "functions.")
    call_end: str = ""
    args_prefix: str = ""                       # skipped before JSON arguments (DeepSeek V3's ```json)
    params: ParamsFormat | None = None
    id_from_header: bool = False                # the header is the call id (Kimi K2: functions.NAME:0)
    bare_start: bool = False                    # a JSON object / array opening the output is a section
    header_marks: tuple[str, ...] = ()          # may follow the name inside the header (Mistral's [CALL_ID])
    separators: str = ",;"

    @property
    def markers(self) -> tuple[str, ...]:
        out = [m for pair in self.sections for m in pair if m]
        out += [m for m in (self.call_start, self.call_end, self.name_after, *self.header_ends, *self.header_marks)
                if m]
        if self.params:
            out += [m for m in dataclasses.astuple(self.params) if m]
        return tuple(out)

    def remap(self, marker: Callable[[str], str]) -> ToolFormat:
        """The same format with every marker passed through ``marker`` (token-id sentinels)."""
        def m(text: str) -> str:
            return marker(text) if text else text

        p = self.params
        params = p and ParamsFormat(m(p.open), m(p.key_end), m(p.value_end), m(p.value_start), p.trim)
        return dataclasses.replace(
            self,
            sections=tuple((m(a), m(b)) for a, b in self.sections),
            call_start=m(self.call_start),
            header_ends=tuple(map(m, self.header_ends)),
            header_marks=tuple(map(m, self.header_marks)),
            name_after=m(self.name_after),
            call_end=m(self.call_end),
            params=params,
        )


HERMES = ToolFormat(sections=(("<tool_call>", "</tool_call>"),))
DEEPSEEK_SECTION = (("<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>"),)
GLM45 = ToolFormat(
    sections=(("<tool_call>", "</tool_call>"),),
    header_ends=("\n", "<arg_key>", "</tool_call>"),
    params=ParamsFormat(open="<arg_key>", key_end="</arg_key>", value_start="<arg_value>", value_end="</arg_value>"),
)

TOOL_FORMATS: dict[str, ToolFormat] = {
    "hermes": HERMES,
    "qwen25": HERMES,
    "qwen3_coder": ToolFormat(
        sections=(("<tool_call>", "</tool_call>"),),
        call_start="<function=", header_ends=(">",), call_end="</function>",
        params=ParamsFormat(open="<parameter=", key_end=">", value_end="</parameter>", trim="\n"),
    ),
    "llama3_json": ToolFormat(sections=(("<|python_tag|>", ""),), bare_start=True),
    "mistral": ToolFormat(sections=(("[TOOL_CALLS]", ""),), header_ends=("[ARGS]",), name_after="",
                          header_marks=("[CALL_ID]",), separators=","),
    "nemotron_deci": ToolFormat(sections=(("<TOOLCALL>", "</TOOLCALL>"),)),
    "phi4": ToolFormat(sections=(("functools", ""),)),
    "jamba": ToolFormat(sections=(("<tool_calls>", "</tool_calls>"),)),
    "deepseek_v3": ToolFormat(
        sections=DEEPSEEK_SECTION, call_start="<｜tool▁call▁begin｜>", header_ends=("```json",),
        name_after="<｜tool▁sep｜>", call_end="<｜tool▁call▁end｜>",
    ),
    "deepseek_v3_1": ToolFormat(
        sections=DEEPSEEK_SECTION, call_start="<｜tool▁call▁begin｜>", header_ends=("<｜tool▁sep｜>",),
        call_end="<｜tool▁call▁end｜>",
    ),
    "deepseek_v3_2": ToolFormat(
        sections=(("<｜DSML｜function_calls>", "</｜DSML｜function_calls>"),),
        call_start='<｜DSML｜invoke name="', header_ends=('">',), call_end="</｜DSML｜invoke>",
        params=ParamsFormat(open='<｜DSML｜parameter name="', key_end='">', value_end="</｜DSML｜parameter>"),
    ),
    "kimi_k2": ToolFormat(
        sections=(("<|tool_calls_section_begin|>", "<|tool_calls_section_end|>"),),
        call_start="<|tool_call_begin|>", header_ends=("<|tool_call_argument_begin|>",),
        name_prefix="functions.", call_end="<|tool_call_end|>", id_from_header=True,
    ),
    "glm45": GLM45,
    "glm47": dataclasses.replace(GLM45, header_ends=("<arg_key>", "</tool_call>", "\n")),
    "minimax_m2": ToolFormat(
        sections=(("<minimax:tool_call>", "</minimax:tool_call>"),),
        call_start='<invoke name="', header_ends=('">',), call_end="</invoke>",
        params=ParamsFormat(open='<parameter name="', key_end='">', value_end="</parameter>"),
    ),
    "harmony": ToolFormat(
        sections=(("<|channel|>", ""),), header_ends=("<|message|>",), name_after="to=",
        name_prefix="functions.", call_end="<|call|>",
    ),
    "default": ToolFormat(
        sections=(("<TOOLCALL>", "</TOOLCALL>"), ("<tool_call>", "</tool_call>"), ("<|python_tag|>", "")),
    ),
}
