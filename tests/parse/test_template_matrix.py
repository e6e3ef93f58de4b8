"""The template matrix: every fixture chat template x a 10-turn Claude Code session with inline system messages.

The session is Claude Code 2.1.330's own first request (tests/fixtures/captures: its system prompt, 12 tools, the
user turn and the inline ``role: "system"`` environment message) and 9 tool-loop turns after it. After every tool
result Claude Code's kind of reminders arrive as ``role: "system"`` messages: a token-budget reminder whose text
changes every turn, a todo-list reminder every third turn and, once, the user's mid-turn steer. Each turn goes the
real way: the Anthropic body through the gateway's conversion (``chat_request``), the parse service's
``conversation_from_proto`` and ``ModelFormat.build_prompt`` with the template's start-up decision (``auto``).

Per turn it checks: the render succeeds (no 400 from any template), every reminder text sent so far is in the
prompt, and the prompt's cached share from turn 2 on: the common token prefix of this turn's prompt and the
previous turn's, over this turn's prompt (``cached_share``: what a prefix cache holding the previous prompt serves
of this one) and over the previous prompt (``reused_share``: how much of the previous prompt stays valid). Both
must be >= 0.97 (a template that does not render tools runs with the built-in tool prompt the start-up warning
names; without it, see ``test_without_a_tool_prompt_the_prefix_still_holds``). The tokenizer is the demo
tokenizer with the family's control strings as special tokens (``template_models.py``), not the model's own: the
share is the template's doing, the absolute counts are not.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from gateway.apis.anthropic.convert import chat_request
from gateway.apis.anthropic.models import MessagesRequest
from services.common.errors import InvalidRequestError
from services.common.model_dir import load_model_dir
from services.common.sequences import common_prefix
from services.parse.convert import conversation_from_proto
from services.parse.model_format import ModelFormat
from services.parse.tool_prompts import ToolPrompt, suggested_tool_prompt
from tests.parse.support import FIXED_NOW, REPO
from tests.parse.template_models import build_family_model, families

CAPTURE = REPO / "tests" / "fixtures" / "captures" / "claude-code_2.1.330_tool-loop_requests.json"
TURNS = 10
MIN_SHARE = 0.97

# The auto decision the start-up probe makes per fixture template (docs/conversation-mapping.md lists them).
EXPECTED_AUTO = {
    "deepseek-r1": "user", "deepseek-v3.1": "user", "glm-4.6": "as-is", "gpt-oss": "user", "kimi-k2-instruct": "as-is",
    "llama-3.1": "as-is", "llama-3.2": "as-is", "llama-nemotron-super-v1.5": "user", "minimax-m2": "user",
    "mistral-small-3.2": "user", "nemotron-3-nano": "as-is", "nemotron-nano-v2": "user", "qwen3": "as-is",
    "qwen3-coder": "as-is",
}


def _first_request() -> dict[str, Any]:
    captured = json.loads(CAPTURE.read_text(encoding="utf-8"))
    body: dict[str, Any] = copy.deepcopy(captured["requests"][0]["body"])
    assert [m["role"] for m in body["messages"]] == ["user", "system"]  # the capture's inline system message
    return body


def session_turns() -> list[tuple[dict[str, Any], list[str]]]:
    """Each turn's Messages body and the reminder texts it carries."""
    body = _first_request()
    reminders = [body["messages"][1]["content"] if isinstance(body["messages"][1]["content"], str)
                 else body["messages"][1]["content"][0]["text"]]
    turns = [(copy.deepcopy(body), list(reminders))]
    for turn in range(1, TURNS):
        call_id = f"toolu_{turn:024x}"
        command = f"ls -la src/module_{turn} && cat src/module_{turn}/README.md"
        body["messages"].append({"role": "assistant", "content": [
            {"type": "text", "text": f"Looking at module {turn} next."},
            {"type": "tool_use", "id": call_id, "name": "Bash",
             "input": {"command": command, "description": f"Inspect module {turn}"}}]})
        output = "\n".join(f"-rw-r--r-- 1 dev dev {1000 + 37 * i} Dec  4 12:0{i % 10} file_{turn}_{i}.py"
                           for i in range(8))
        body["messages"].append({"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": call_id, "content": output, "is_error": False}]})
        sent = [f"<system-reminder>\nToken usage: {21000 + 1450 * turn}/200000; {179000 - 1450 * turn} remaining\n"
                "</system-reminder>"]
        if turn % 3 == 0:
            sent.append("The TodoWrite tool hasn't been used recently. Here are the existing contents of your todo "
                        f"list: [1. [completed] Inspect modules 1-{turn - 1}] [2. [in_progress] Inspect module {turn}]")
        if turn == 5:
            sent.append("The user sent the following message while you were working:\nalso check the logs "
                        "directory, please\n\nPlease address this message and continue with your tasks.")
        body["messages"] += [{"role": "system", "content": text} for text in sent]
        reminders += sent
        turns.append((copy.deepcopy(body), list(reminders)))
    return turns


@pytest.fixture(scope="module")
def turns() -> list[tuple[dict[str, Any], list[str]]]:
    return session_turns()


def _format(family: str, root: Path, *, tool_prompt: bool = True, inline_system: str = "auto") -> ModelFormat:
    """The family's model format; ``tool_prompt``: with the built-in tool prompt the start-up warning names for a
    template that does not render tools (the documented setup for DeepSeek-R1 / V3.1)."""
    model_dir = load_model_dir(build_family_model(family, root / family))
    suggested = suggested_tool_prompt(model_dir.chat_template) if tool_prompt else ""
    return ModelFormat(model_dir, now=lambda: FIXED_NOW, inline_system=inline_system,
                       tool_prompt=ToolPrompt.load(suggested) if suggested else None)


def run_session(fmt: ModelFormat, turns: list[tuple[dict[str, Any], list[str]]]) -> list[tuple[int, float, float]]:
    """Serve each turn's prompt; check every reminder sent so far is in it; per turn from the second:
    ``(turn, cached_share, reused_share)``."""
    previous: list[int] | None = None
    shares = []
    for number, (body, reminders) in enumerate(turns, start=1):
        request = chat_request(MessagesRequest.model_validate(body), {}, model="m", request_id=f"r{number}",
                               strip=True)
        prompt = fmt.build_prompt(conversation_from_proto(request), session="matrix")  # a refusal raises (400)
        missing = [text[:60] for text in reminders if not _present(text, prompt.text)]
        assert not missing, f"turn {number}: reminders not in the prompt: {missing}"
        ids = list(prompt.token_ids)
        if previous is not None:
            common = common_prefix(previous, ids)
            shares.append((number, round(common / len(ids), 4), round(common / len(previous), 4)))
        previous = ids
    return shares


@pytest.mark.parametrize("family", families())
def test_claude_code_session_keeps_its_prefix(family: str, turns: list[tuple[dict[str, Any], list[str]]],
                                              tmp_path: Path) -> None:
    fmt = _format(family, tmp_path)
    assert fmt.forms.inline_system == EXPECTED_AUTO[family], fmt.forms.inline_system_reason
    assert not fmt.forms.tools_unrendered
    shares = run_session(fmt, turns)
    assert len(shares) == TURNS - 1
    assert all(cached >= MIN_SHARE and reused >= MIN_SHARE for _, cached, reused in shares), (family, shares)


@pytest.mark.parametrize("family", ["deepseek-r1", "deepseek-v3.1"])
def test_without_a_tool_prompt_the_prefix_still_holds(family: str, turns: list[tuple[dict[str, Any], list[str]]],
                                                      tmp_path: Path) -> None:
    """Without the tool prompt the tools are lost (and said so); the prompt is then ~13k tokens, so a turn's new
    ~650 tokens are ~5 % of it: the previous prompt is still reused whole (reused share), the cached share is ~0.95."""
    fmt = _format(family, tmp_path, tool_prompt=False)
    assert fmt.forms.tools_unrendered
    shares = run_session(fmt, turns)
    assert all(reused >= MIN_SHARE for _, _, reused in shares), shares
    assert all(cached >= 0.94 for _, cached, _ in shares), shares


def test_the_matrix_fails_without_the_user_form(turns: list[tuple[dict[str, Any], list[str]]], tmp_path: Path) -> None:
    """The control: as-is, DeepSeek-V3.1 hoists each reminder into its system prompt (the previous prompt is reused
    only up to there: a share that falls every turn), gpt-oss drops them, Mistral refuses turn 2."""
    for tool_prompt, last in ((True, MIN_SHARE), (False, 0.8)):  # docs/templates.md: 0.988 -> 0.892, 0.964 -> 0.746
        shares = run_session(_format("deepseek-v3.1", tmp_path, inline_system="as-is", tool_prompt=tool_prompt), turns)
        reused = [share for _, _, share in shares]
        assert reused[-1] < last and reused == sorted(reused, reverse=True), shares
    with pytest.raises(AssertionError, match="reminders not in the prompt"):
        run_session(_format("gpt-oss", tmp_path, inline_system="as-is"), turns[:2])
    with pytest.raises(InvalidRequestError, match="alternate"):
        run_session(_format("mistral-small-3.2", tmp_path, inline_system="as-is"), turns[:2])


def _present(reminder: str, prompt: str) -> bool:
    """Whether the reminder's text (without the wrapping the user form may add or keep) is in ``prompt``, as it is
    or JSON-encoded (gpt-oss's template writes every tool result, and so a reminder joined to one, as JSON)."""
    text = reminder.removeprefix("<system-reminder>\n").removesuffix("\n</system-reminder>")
    return text in prompt or json.dumps(text, ensure_ascii=False)[1:-1] in prompt


def test_probe_sees_what_the_issue_reports(tmp_path: Path) -> None:
    """The auto decisions' reasons name the behaviour: hoisted (DeepSeek), dropped (gpt-oss), refused (Mistral)."""
    reasons = {family: _format(family, tmp_path).forms.inline_system_reason
               for family in ("deepseek-v3.1", "gpt-oss", "mistral-small-3.2", "qwen3")}
    assert "hoists" in reasons["deepseek-v3.1"]
    assert "drops" in reasons["gpt-oss"]
    assert "refuses" in reasons["mistral-small-3.2"] and "alternate" in reasons["mistral-small-3.2"]
    assert "in place" in reasons["qwen3"]
