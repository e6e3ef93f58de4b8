"""A trivial OpenAI-style SSE server: the client / loopback floor the stacks are compared above.

Streams ``max_tokens`` one-token chunks at once, then a usage chunk and ``[DONE]``. aiohttp, so it runs
in the Dynamo side venv (which has it): ``DYNAMO_VENV/bin/python null_sse.py PORT``.
Adapted from ``shared/dynamo-peer/null_sse_server.py``; reads the whole body (as the real servers must),
and reports the prompt's character count as ``prompt_tokens`` (there is no tokenizer here).
"""

import json
import sys
import time

from aiohttp import web


async def chat(req: web.Request) -> web.StreamResponse:
    body = await req.json()
    n = int(body.get("max_tokens") or 16)
    prompt = sum(len(str(m.get("content") or "")) for m in body.get("messages", []))
    resp = web.StreamResponse(headers={"content-type": "text/event-stream"})
    await resp.prepare(req)
    base = {"id": "x", "object": "chat.completion.chunk", "created": int(time.time()), "model": body.get("model")}
    for i in range(n):
        c = dict(base, choices=[{"index": 0, "delta": {"content": f" t{i}"}, "finish_reason": None}])
        await resp.write(f"data: {json.dumps(c)}\n\n".encode())
    c = dict(base, choices=[{"index": 0, "delta": {}, "finish_reason": "length"}],
             usage={"prompt_tokens": prompt, "completion_tokens": n, "total_tokens": prompt + n})
    await resp.write(f"data: {json.dumps(c)}\n\ndata: [DONE]\n\n".encode())
    await resp.write_eof()
    return resp


async def models(_req: web.Request) -> web.Response:
    return web.json_response({"object": "list", "data": [{"id": "null", "object": "model"}]})


if __name__ == "__main__":
    app = web.Application(client_max_size=64 << 20)
    app.router.add_post("/v1/chat/completions", chat)
    app.router.add_get("/v1/models", models)
    web.run_app(app, host="127.0.0.1", port=int(sys.argv[1]), print=None)
