"""Template forms (``template_forms.py``, ``template_probe.py``, ``tool_prompts.py``, ``template_catalog.py``):
the user form of inline system messages, tool-call ids a template accepts, tools a template does not render, the
start-up decision, its log lines, GetModel, and the catalog keys."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from structlog.testing import capture_logs

from services.api import chat_pb2
from services.common.errors import InvalidRequestError
from services.common.model_dir import load_model_dir
from services.common.settings import parse_settings
from services.parse.conversation import ChatMessage, Conversation, TemplateInput, TextPart, ToolCallPart, ToolSpec
from services.parse.model_format import ModelFormat
from services.parse.parsers.events import ToolCallStart
from services.parse.server import build_model_format
from services.parse.service import ParseService
from services.parse.settings import ParseSettings
from services.parse.template_catalog import TemplatePolicy, template_policy
from services.parse.template_forms import (
    MadeDicts,
    TemplateForms,
    alnum9_id,
    as_reminder,
    call_id_form,
    fit_call_ids,
    fold_inline_system,
)
from services.parse.tool_prompts import BUILTIN, ToolPrompt, suggested_tool_prompt
from tests.parse.support import FIXED_NOW, TEMPLATE_FIXTURES
from tests.parse.template_models import build_family_model, families

TOOL = ToolSpec("Bash", "Run a shell command.", json.dumps({"type": "object", "properties": {
    "command": {"type": "string"}}}))


def _m(role: str, content: str, **extra: Any) -> dict[str, Any]:
    return {"role": role, "content": content, **extra}


# -- the user form -------------------------------------------------------------------------------------------------

def test_reminders_join_the_tool_or_user_message_before_them() -> None:
    messages = [_m("system", "S"), _m("user", "hi"), _m("system", "env"), _m("assistant", "a"),
                _m("tool", "out", tool_call_id="c"), _m("system", "budget"), _m("system", "todo")]
    folded = fold_inline_system(messages)
    assert [m["role"] for m in folded] == ["system", "user", "assistant", "tool"]
    assert folded[0] is messages[0] and folded[3]["tool_call_id"] == "c"
    assert folded[1]["content"] == "hi\n\n<system-reminder>\nenv\n</system-reminder>"
    assert folded[3]["content"] == ("out\n\n<system-reminder>\nbudget\n</system-reminder>"
                                    "\n\n<system-reminder>\ntodo\n</system-reminder>")
    assert messages[1]["content"] == "hi"  # the dicts handed in are not edited (they are shared by renders)


def test_a_reminder_with_no_user_or_tool_message_before_it() -> None:
    after_assistant = fold_inline_system([_m("user", "u"), _m("assistant", "a"), _m("system", "steer"),
                                          _m("user", "next")])
    assert after_assistant[-1] == _m("user", "<system-reminder>\nsteer\n</system-reminder>\n\nnext")
    at_the_end = fold_inline_system([_m("user", "u"), _m("assistant", "a"), _m("system", "steer")])
    assert at_the_end[-1] == _m("user", "<system-reminder>\nsteer\n</system-reminder>")
    before_assistant = fold_inline_system([_m("system", "S"), _m("system", "T"), _m("assistant", "a")])
    assert [m["role"] for m in before_assistant] == ["system", "user", "assistant"]


def test_the_user_form_keeps_a_turns_render_on_later_turns() -> None:
    """A reminder joins backwards: what a turn rendered is what every later turn renders of it."""
    turn = [_m("user", "u"), _m("assistant", "a"), _m("tool", "out"), _m("system", "r1")]
    later = [*turn, _m("assistant", "b"), _m("tool", "out2"), _m("system", "r2")]
    assert fold_inline_system(later)[:len(fold_inline_system(turn))] == fold_inline_system(turn)


def test_joined_messages_are_made_once_per_session() -> None:
    """The same message dicts (a held conversation's, every turn) get the same joined dicts back."""
    made = MadeDicts()
    messages = [_m("user", "u"), _m("assistant", "a"), _m("system", "steer"), _m("user", "v"),
                _m("tool", "out", tool_call_id="call_x"), _m("system", "r")]
    first, second = fold_inline_system(messages, made), fold_inline_system(list(messages), made)
    assert first == second == fold_inline_system(messages) and all(a is b for a, b in zip(first, second, strict=True))
    assert fold_inline_system([*messages[:5], _m("system", "r")], made)[-1] is not first[-1]  # another dict
    fitted = fit_call_ids(first, made)
    assert fit_call_ids(second, made)[-1] is fitted[-1] and fitted[-1]["tool_call_id"] == alnum9_id("call_x")


def test_nothing_to_fold_is_the_same_list() -> None:
    messages = [_m("system", "S"), _m("user", "u")]
    assert fold_inline_system(messages) is messages
    assert as_reminder("<system-reminder>\nx\n</system-reminder>\n") == "<system-reminder>\nx\n</system-reminder>\n"


# -- tool-call ids -------------------------------------------------------------------------------------------------

def test_nine_character_ids_are_derived_from_the_id() -> None:
    mesh_id = "call_" + "ab12" * 6
    fitted = alnum9_id(mesh_id)
    assert re.fullmatch(r"[A-Za-z0-9]{9}", fitted) and alnum9_id(mesh_id) == fitted
    assert alnum9_id("toolu_01") != fitted and alnum9_id("Ab3dE5fG7") == "Ab3dE5fG7"
    messages = [_m("assistant", "", tool_calls=[{"id": mesh_id, "type": "function",
                                                 "function": {"name": "Bash", "arguments": {}}}]),
                _m("tool", "out", tool_call_id=mesh_id)]
    out = fit_call_ids(messages)
    assert out[0]["tool_calls"][0]["id"] == out[1]["tool_call_id"] == fitted
    assert out[0]["tool_calls"][0]["function"] is messages[0]["tool_calls"][0]["function"]
    assert fit_call_ids(out) is out


def test_call_id_form_per_template() -> None:
    forms = {family: call_id_form((TEMPLATE_FIXTURES / family / "chat_template.jinja").read_text(encoding="utf-8"))
             for family in families()}
    assert {family for family, form in forms.items() if form == "alnum9"} == {"mistral-small-3.2"}


@pytest.fixture(scope="module")
def mistral(tmp_path_factory: pytest.TempPathFactory) -> ModelFormat:
    root = build_family_model("mistral-small-3.2", tmp_path_factory.mktemp("mistral") / "m")
    return ModelFormat(load_model_dir(root), now=lambda: FIXED_NOW, tool_parser="mistral")


def test_mistral_renders_the_turn_after_a_tool_call(mistral: ModelFormat) -> None:
    """The gateway's ``call_<24 hex>`` ids used to get a 400 from Mistral's template on the turn after a call."""
    mesh_id = "call_0123456789abcdef01234567"
    conversation = Conversation((
        ChatMessage("user", (TextPart("list files"),)),
        ChatMessage("assistant", (ToolCallPart(mesh_id, "Bash", '{"command": "ls"}'),)),
        ChatMessage("tool", (TextPart("a.txt"),), tool_call_id=mesh_id),
    ), tools=(TOOL,))
    text = mistral.render(conversation)
    fitted = alnum9_id(mesh_id)
    assert f"[CALL_ID]{fitted}[ARGS]" in text and f"[TOOL_RESULTS]{fitted}[TOOL_CONTENT]a.txt" in text
    assert mistral.render(conversation) == text  # the same every turn
    with pytest.raises(InvalidRequestError, match="length 9"):
        mistral.renderer.render(TemplateInput(messages=[
            {"role": "user", "content": "x"}, {"role": "assistant", "tool_calls": [
                {"id": mesh_id, "type": "function", "function": {"name": "Bash", "arguments": {}}}]}]))


def test_mistral_mints_ids_its_template_accepts(mistral: ModelFormat) -> None:
    pipeline = mistral.output_pipeline("", {})
    ids = mistral.encode('[TOOL_CALLS]Bash[ARGS]{"command": "ls"}')
    events = pipeline.feed(ids) + pipeline.finish()
    starts = [e for e in events if isinstance(e, ToolCallStart)]
    assert starts and all(re.fullmatch(r"[A-Za-z0-9]{9}", e.id) for e in starts)


# -- tools a template does not render ------------------------------------------------------------------------------

def _family_format(family: str, root: Path, **kwargs: Any) -> ModelFormat:
    return ModelFormat(load_model_dir(build_family_model(family, root / family)), now=lambda: FIXED_NOW, **kwargs)


def test_tools_are_probed_per_template(tmp_path: Path) -> None:
    unrendered = {family for family in families() if not _family_format(family, tmp_path).forms.renders_tools}
    assert unrendered == {"deepseek-r1", "deepseek-v3.1"}


@pytest.mark.parametrize("family", ["deepseek-r1", "deepseek-v3.1"])
def test_the_tool_prompt_puts_tools_in_the_system_message(family: str, tmp_path: Path) -> None:
    template = (TEMPLATE_FIXTURES / family / "chat_template.jinja").read_text(encoding="utf-8")
    assert suggested_tool_prompt(template) == family
    fmt = _family_format(family, tmp_path, tool_prompt=ToolPrompt.load(family))
    assert not fmt.forms.tools_unrendered and fmt.forms.model_info()["tool_prompt"] == family
    conversation = Conversation((ChatMessage("system", (TextPart("You are a coder."),)),
                                 ChatMessage("user", (TextPart("hi"),))), tools=(TOOL,))
    text = fmt.render(conversation)
    assert "You are a coder.\n\n## Tools" in text and "### Bash\nDescription: Run a shell command." in text
    assert text.index("## Tools") < text.index("hi")
    no_system = fmt.render(Conversation((ChatMessage("user", (TextPart("hi"),)),), tools=(TOOL,)))
    assert "### Bash" in no_system
    assert "## Tools" not in fmt.render(Conversation(conversation.messages))  # no tools: no section


def test_refusing_requests_with_unrendered_tools(tmp_path: Path) -> None:
    fmt = _family_format("deepseek-v3.1", tmp_path, refuse_unrendered_tools=True)
    assert fmt.forms.tools_unrendered
    messages = (ChatMessage("user", (TextPart("hi"),)),)
    with pytest.raises(InvalidRequestError, match="does not render tools") as refused:
        fmt.render(Conversation(messages, tools=(TOOL,)))
    assert refused.value.param == "tools"
    assert "hi" in fmt.render(Conversation(messages))  # a request without tools is served


def test_a_tool_prompt_file(tmp_path: Path) -> None:
    path = tmp_path / "tools.jinja"
    path.write_text("TOOLS:{% for t in tools %} {{ t.function.name }}{% endfor %}", encoding="utf-8")
    prompt = ToolPrompt.load(str(path))
    assert prompt.into_system([_m("user", "u")], [{"function": {"name": "Bash"}}])[0] == _m("system", "TOOLS: Bash")
    with pytest.raises(ValueError, match="neither a built-in"):
        ToolPrompt.load(str(tmp_path / "missing.jinja"))
    assert set(BUILTIN) == {"deepseek-r1", "deepseek-v3.1"}


# -- start-up: decision, log lines, GetModel, options and catalog --------------------------------------------------

def test_explicit_choices_are_kept_with_their_source(tmp_path: Path) -> None:
    qwen = _family_format("qwen3", tmp_path, inline_system="user", inline_system_source="the catalog")
    assert (qwen.forms.inline_system, qwen.forms.inline_system_reason) == ("user", "set by the catalog")
    assert "<system-reminder>\nR\n</system-reminder>" in qwen.render(Conversation((
        ChatMessage("user", (TextPart("u"),)), ChatMessage("system", (TextPart("R"),)))))
    kept = _family_format("gpt-oss", tmp_path, inline_system="as-is")
    assert kept.forms.inline_system == "as-is"
    with pytest.raises(ValueError, match="unknown inline system policy"):
        _family_format("qwen3", tmp_path, inline_system="sometimes")


def test_start_up_lines_for_a_template_without_tools(tmp_path: Path) -> None:
    root = build_family_model("deepseek-v3.1", tmp_path / "deepseek-v3.1")
    with capture_logs() as logs:
        fmt = build_model_format(ParseSettings(model=str(root), template_now="2026-01-15T09:30:00"))
    (decided,) = [e for e in logs if e["event"] == "parse.template_forms"]
    assert decided["inline_system"] == "user" and "hoists" in decided["inline_system_reason"]
    assert decided["tools_unrendered"] is True
    (warning,) = [e for e in logs if e["event"] == "parse.tools_not_rendered"]
    assert warning["log_level"] == "warning" and "--tool-prompt-template deepseek-v3.1" in warning["message"]
    assert fmt.forms.tools_unrendered
    with capture_logs() as logs:
        build_model_format(ParseSettings(model=str(root), tool_prompt_template="deepseek-v3.1"))
    assert not [e for e in logs if e["event"] == "parse.tools_not_rendered"]


async def test_get_model_reports_the_forms(tmp_path: Path) -> None:
    fmt = _family_format("deepseek-r1", tmp_path)
    info = await ParseService(fmt, router=None).GetModel(chat_pb2.ModelInfoRequest(), None)  # type: ignore[arg-type]
    assert (info.inline_system, info.tools_unrendered, info.tool_prompt) == ("user", True, "")
    assert info.inline_system_reason.startswith("auto: the template hoists")


def test_catalog_keys_override_the_flags(tmp_path: Path) -> None:
    catalog = tmp_path / "catalog.yaml"
    catalog.write_text("models:\n  '*': {inline_system: user, unrendered_tools: refuse}\n"
                       "  served: {inline_system: as-is, tool_prompt_template: deepseek-r1}\n"
                       "  other: {inline_system: auto}\n", encoding="utf-8")
    base = TemplatePolicy(inline_system="auto", tool_prompt_template="", unrendered_tools="warn")
    policy = template_policy(base, str(catalog), "served")
    assert (policy.inline_system, policy.tool_prompt_template, policy.unrendered_tools) == (
        "as-is", "deepseek-r1", "refuse")
    assert policy.inline_system_source == "the model catalog (models.served.inline_system)"
    assert template_policy(base, str(catalog), "unlisted").inline_system == "user"
    assert template_policy(base, "", "served") is base
    catalog.write_text("models:\n  served: {inline_system: sometimes}\n", encoding="utf-8")
    with pytest.raises(ValueError, match="inline_system must be one of"):
        template_policy(base, str(catalog), "served")


def test_the_options_have_env_twins() -> None:
    env = {"HARNESSMESH_PARSE_INLINE_SYSTEM": "user", "HARNESSMESH_PARSE_TOOL_PROMPT_TEMPLATE": "deepseek-r1",
           "HARNESSMESH_PARSE_UNRENDERED_TOOLS": "refuse", "HARNESSMESH_MODEL_CATALOG": "/etc/catalog.yaml"}
    settings = parse_settings(ParseSettings, "parse", [], env)
    assert settings.template_policy() == TemplatePolicy("user", "deepseek-r1", "refuse")
    assert settings.model_catalog == "/etc/catalog.yaml"
    assert parse_settings(ParseSettings, "parse", ["--inline-system", "as-is"], env).inline_system == "as-is"
    with pytest.raises(SystemExit):
        parse_settings(ParseSettings, "parse", ["--inline-system", "sometimes"], {})
    assert TemplateForms().summary()["inline_system"] == "as-is" and not TemplateForms().tools_unrendered


async def test_the_real_services_refuse_or_mark_unrendered_tools(tmp_path: Path) -> None:
    """A parse service over a DeepSeek template (which ignores tools) behind the gateway's app: with
    ``--unrendered-tools refuse`` a chat with tools is a 400 naming ``tools``; ``/v1/models`` says the template
    does not render tools and why inline system messages go in the user form."""
    import httpx

    from gateway.app import create_app
    from gateway.parse_client import ParseClient
    from gateway.settings import GatewaySettings
    from services.common.grpc_util import open_channel
    from services.launcher.supervisor import free_port
    from services.parse.server import start

    root = build_family_model("deepseek-v3.1", tmp_path / "deepseek-v3.1")
    settings = ParseSettings(model=str(root), port=0, router_address=f"127.0.0.1:{free_port()}",
                             unrendered_tools="refuse")
    parse = await start(settings)
    channel = open_channel(parse.address, None)
    try:
        app = create_app(ParseClient(channel), GatewaySettings())
        body = {"model": "deepseek-v3.1", "messages": [{"role": "user", "content": "hi"}], "tools": [
            {"type": "function", "function": {"name": "Bash", "parameters": {"type": "object", "properties": {}}}}]}
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw") as http:
            refused = await http.post("/v1/chat/completions", json=body)
            card = (await http.get("/v1/models")).json()["data"][0]
    finally:
        await channel.close()
        await parse.stop(0)
    assert refused.status_code == 400, refused.text
    error = refused.json()["error"]
    assert "does not render tools" in error["message"] and error["param"] == "tools"
    template = card["chat_template"]
    assert template["renders_tools"] is False and template["inline_system"] == "user"
    assert "hoists" in template["inline_system_reason"]
