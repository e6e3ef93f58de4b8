"""NVIDIA Dynamo 1.6.1 (frontend + CPU mocker) as a side-by-side peer for ``bench/vs_dynamo.py``.

Adapted from the team's ``shared/dynamo-peer`` recipe (install script, model builder, start/stop
scripts, mocker wrapper, null SSE server), rewritten here as our own code so the repo stands alone:

| module | what |
|---|---|
| ``venv.py`` | create / reuse a side venv with ai-dynamo 1.6.1 (PyPI only) |
| ``model.py`` | a hub-free model dir both stacks accept (copy of our demo model, raised context) |
| ``peer.py`` | start / stop Dynamo's frontend + mocker, the null server (file discovery, TCP, loopback) |
| ``null_sse.py`` | a trivial OpenAI-style SSE server: the client/loopback floor (runs in the side venv: aiohttp) |
| ``client.py`` | the one streaming chat-completions client of all three stacks |
| ``procstat.py`` | CPU seconds of whole process trees from ``/proc`` |
| ``workload.py`` | prompt / tool-loop conversation / fallback long-trace builders (pure) |
| ``replay.py`` | metric 6: the same trace through both offline simulators, timed as whole processes |
| ``dynamo_replay.py`` | ``run_trace_replay`` driver run inside the side venv (never imported here) |

Nothing here reads ``shared/`` at run time; the recipe's ``mocker_wrapper.py`` (reasoning / tool parser names
for the mocker's model card) is not needed: these requests parse no reasoning or tool calls.
"""
