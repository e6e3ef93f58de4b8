"""A minimal custom harness on the gateway's gRPC edge API (``AgentService.Chat``).

It sends a conversation with one tool (``get_weather``), prints reasoning and text as they stream,
runs each tool call the moment its ``tool_call_dispatch`` event arrives (while the model may still
be generating), appends the assistant turn (ordered parts: reasoning, tool_call, ..., text) and the
tool results, and loops until a turn ends without tool calls. The last stdout line is a JSON
summary: ``{"turns", "tool_calls", "final_text", "finish_reason"}``.

    python examples/agent_tool_loop.py --target 127.0.0.1:8001 --prompt "What is the weather in Paris?"
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import uuid
from typing import Any

from services.common.grpc_io import choose_grpc_io

choose_grpc_io()  # grpc's poller socket I/O, as the mesh's services run it: a cheaper hop (before grpc loads)

import grpc  # noqa: E402 - after choose_grpc_io

from services.api import chat_pb2, chat_pb2_grpc, common_pb2  # noqa: E402

WEATHER_TOOL = chat_pb2.Tool(
    name="get_weather",
    description="Current weather for a city.",
    parameters_json=json.dumps(
        {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
    ),
)


async def get_weather(arguments: dict[str, Any]) -> str:
    """The local tool: a deterministic fake forecast."""
    city = str(arguments.get("city", "unknown"))
    await asyncio.sleep(0)  # a real tool would do I/O here
    return f"{city}: 22 degrees, sunny"


async def run_tool(call: chat_pb2.ToolCall) -> chat_pb2.Message:
    """Run one tool call; failures become an error tool message the model can read."""
    result = chat_pb2.Message(role="tool", tool_call_id=call.id, name=call.name)
    try:
        if call.name != "get_weather":
            raise ValueError(f"unknown tool {call.name!r}")
        output = await get_weather(json.loads(call.arguments_json or "{}"))
    except (ValueError, TypeError) as exc:
        output, result.is_error = f"error: {exc}", True
    result.parts.append(chat_pb2.Part(text=output))
    return result


def _append_delta(parts: list[chat_pb2.Part], kind: str, piece: str) -> None:
    """Extend the last part if it has the same kind, else start a new one (keeps the model's order)."""
    if parts and parts[-1].WhichOneof("kind") == kind:
        setattr(parts[-1], kind, getattr(parts[-1], kind) + piece)
    else:
        part = chat_pb2.Part()
        setattr(part, kind, piece)
        parts.append(part)


async def one_turn(
    stub: Any, request: chat_pb2.ChatRequest
) -> tuple[chat_pb2.Message, list[asyncio.Task[chat_pb2.Message]], int]:
    """Stream one turn; returns the assistant message, the running tool tasks and the finish reason."""
    parts: list[chat_pb2.Part] = []
    tasks: list[asyncio.Task[chat_pb2.Message]] = []
    reason: int = common_pb2.FINISH_REASON_UNSPECIFIED
    async for frame in stub.Chat(request):
        for event in frame.events:
            kind = event.WhichOneof("event")
            if kind == "reasoning_delta":
                _append_delta(parts, "reasoning", event.reasoning_delta.text)
                print(event.reasoning_delta.text, end="", file=sys.stderr, flush=True)
            elif kind == "text_delta":
                _append_delta(parts, "text", event.text_delta.text)
                print(event.text_delta.text, end="", flush=True)
            elif kind == "tool_call_dispatch":
                call = event.tool_call_dispatch.call
                parts.append(chat_pb2.Part(tool_call=call))
                print(f"\n[tool] {call.name}({call.arguments_json})", file=sys.stderr, flush=True)
                tasks.append(asyncio.create_task(run_tool(call)))
            elif kind == "finish":
                reason = event.finish.reason
            elif kind == "error":
                raise RuntimeError(f"in-band error {event.error.code}: {event.error.message}")
    print(flush=True)
    return chat_pb2.Message(role="assistant", parts=parts), tasks, reason


async def agent_loop(target: str, prompt: str, model: str, max_turns: int) -> dict[str, Any]:
    session = uuid.uuid4().hex
    messages = [
        chat_pb2.Message(role="system", parts=[chat_pb2.Part(text="You can call get_weather.")]),
        chat_pb2.Message(role="user", parts=[chat_pb2.Part(text=prompt)]),
    ]
    turns = calls = 0
    final_text, reason = "", int(common_pb2.FINISH_REASON_UNSPECIFIED)
    async with grpc.aio.insecure_channel(target) as channel:
        stub = chat_pb2_grpc.AgentServiceStub(channel)
        while turns < max_turns:
            turns += 1
            request = chat_pb2.ChatRequest(
                model=model,
                messages=messages,
                tools=[WEATHER_TOOL],
                tool_choice=chat_pb2.ToolChoice(mode="auto"),
                sampling=common_pb2.SamplingParams(max_tokens=512),
                identity=common_pb2.Identity(session_id=session, trajectory_id="main", harness="agent-tool-loop"),
            )
            assistant, tasks, reason = await one_turn(stub, request)
            messages.append(assistant)
            if not tasks:
                final_text = "".join(p.text for p in assistant.parts if p.WhichOneof("kind") == "text")
                break
            calls += len(tasks)
            messages.extend(await asyncio.gather(*tasks))
    return {
        "turns": turns,
        "tool_calls": calls,
        "final_text": final_text,
        "finish_reason": common_pb2.FinishReason.Name(reason),  # type: ignore[arg-type]
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", default="127.0.0.1:8001", help="gateway gRPC address HOST:PORT")
    parser.add_argument("--prompt", default="What is the weather in Paris?")
    parser.add_argument("--model", default="", help="model name (empty: the served model)")
    parser.add_argument("--max-turns", type=int, default=8)
    args = parser.parse_args(argv)
    try:
        summary = asyncio.run(agent_loop(args.target, args.prompt, args.model, args.max_turns))
    except grpc.aio.AioRpcError as exc:
        print(f"error: {exc.code().name}: {exc.details()}", file=sys.stderr)
        return 1
    except RuntimeError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
