"""Real Codex CLI (every version pinned in ``.ci/harnesses/clients.txt``) compacting its context against the real
mesh, both ways Codex does it, and what share of each compaction request the engine's prefix cache served.

- remote: the provider is named "OpenAI" (``-c model_providers.harnessmesh.name="OpenAI"``, as proxy setups
  do), so Codex compacts with ``responses_compaction_v2``: a ``/v1/responses`` request whose input ends with
  ``compaction_trigger``, which must get exactly one ``compaction`` item back; the next request carries that
  item, which the gateway opens to its summary.
- local: the config ``harnessmesh catalog codex`` prints, so Codex asks for the summary itself (its own prompt
  as a user message) in a request with ``tools: []``; the gateway renders it with the conversation's tools.

A low ``model_auto_compact_token_limit`` makes Codex compact in the middle of the turn, after the tool call and
before the answer. Runs only inside ``.ci/harnesses/offline.sh`` (``HARNESS_OFFLINE=1``).
"""

from __future__ import annotations

import base64
import json
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.harness import (
    Recorded,
    RecordingProxy,
    client_binary,
    configure_codex,
    offline_harness_marks,
    pinned_versions,
    run_codex,
    scripted_mesh,
    stdout_events,
    trace_records,
)
from tests.support.mesh import RunningMesh

MODEL = "mesh-coder"
MARKER = "harnessmesh-compaction-ok"
PROMPT = "Run the greeting command and tell me what it printed."
SUMMARY = f"Handoff: the user asked to run the greeting command; exec_command ran it and it printed {MARKER}."
CODEX_TIMEOUT = int(os.environ.get("CODEX_TIMEOUT", "90"))
MIN_CACHED_SHARE = 0.9

TOOL_TURN = '<tool_call>\n{"name": "exec_command", "arguments": {"cmd": "echo ' + MARKER + '"}}\n</tool_call>'
# Lines match the request's user/tool messages since the model's last turn: a compaction instruction (the
# gateway's default, or Codex's own prompt) gets the summary; the tool output, or the summary, the answer; the
# prompt, the tool call.
SCRIPT = [{"match": "Context checkpoint", "completion": SUMMARY},
          {"match": "CONTEXT CHECKPOINT", "completion": SUMMARY},
          {"match": MARKER, "completion": f"The greeting command printed {MARKER}."},
          {"match": "greeting command", "completion": TOOL_TURN}]
VERSIONS = pinned_versions("codex")

pytestmark = offline_harness_marks("Codex")


@pytest.fixture(scope="module")
def mesh_and_records(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[RunningMesh, Path]]:
    client_binary("codex")  # skips before starting a mesh when it is not installed
    tmp = tmp_path_factory.mktemp("codex-compaction-mesh")
    records = tmp / "records.jsonl"
    with scripted_mesh(tmp, SCRIPT, MODEL, ["--trace-records", str(records)]) as mesh:
        yield mesh, records


def metadata(request: Recorded) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(request.headers.get("x-codex-turn-metadata") or "{}")
    return loaded


def compact_session(mesh_and_records: tuple[RunningMesh, Path], tmp_path: Path, version: str, remote: bool,
                    record_property: Callable[[str, object], None]) -> tuple[list[Recorded], Recorded, float]:
    """One Codex session that compacts; its requests, the compaction request and that request's cached share."""
    client_binary("codex", version)
    mesh, records = mesh_and_records
    since = time.time()
    workdir = tmp_path / "cx"
    with RecordingProxy(mesh.http) as proxy:
        configure_codex(proxy.url, workdir)
        args = [PROMPT, "-c", "model_providers.harnessmesh.stream_max_retries=0",
                "-c", "model_auto_compact_token_limit=2000"]
        if remote:
            args += ["-c", 'model_providers.harnessmesh.name="OpenAI"']
        status = run_codex(workdir, args, CODEX_TIMEOUT, version)
        stderr = (workdir / "stderr.txt").read_text()
        assert status == 0, f"codex {version} exited {status}\n{stderr[-4000:]}\n{mesh.log_path.read_text()[-4000:]}"
        posts = proxy.posts("/responses")
    events = stdout_events(workdir)
    items = [e["item"] for e in events if e["type"] == "item.completed"]
    assert not [i for i in items if i["type"] == "error"], items
    assert events[-1]["type"] == "turn.completed", events[-1]
    messages = [i["text"] for i in items if i["type"] == "agent_message"]
    assert messages and MARKER in messages[-1], items  # the session went on after the compaction

    kinds = [metadata(r).get("request_kind") for r in posts]
    assert kinds.count("compaction") == 1, kinds
    at = kinds.index("compaction")
    served = trace_records(records, since, "responses", len(posts))
    assert all(r["outcome"] == "ok" for r in served), served
    record = served[at]
    share = record["cached_tokens"] / record["prompt_tokens"]
    mode = "remote" if remote else "local"
    record_property(f"codex_{version}_{mode}_compaction_cached_share", round(share, 4))
    print(f"codex {version} {mode} compaction: {record['cached_tokens']} of {record['prompt_tokens']} prompt "
          f"tokens cached ({share:.1%})")
    assert share >= MIN_CACHED_SHARE, record
    return posts, posts[at], share


@pytest.mark.parametrize("version", VERSIONS)
def test_codex_named_openai_compacts_remotely(mesh_and_records: tuple[RunningMesh, Path], tmp_path: Path,
                                              version: str, record_property: Callable[[str, object], None]) -> None:
    posts, compacting, _ = compact_session(mesh_and_records, tmp_path, version, True, record_property)
    assert metadata(compacting)["compaction"]["implementation"] == "responses_compaction_v2"
    assert compacting.body["input"][-1] == {"type": "compaction_trigger"}
    after = posts[posts.index(compacting) + 1].body["input"]
    carried = [i for i in after if i.get("type") == "compaction"]
    assert len(carried) == 1 and carried[0]["encrypted_content"].startswith("hmc1."), after
    sealed = carried[0]["encrypted_content"].removeprefix("hmc1.").rpartition(".")[0]
    assert base64.urlsafe_b64decode(sealed + "=" * (-len(sealed) % 4)).decode() == SUMMARY  # the model's summary


@pytest.mark.parametrize("version", VERSIONS)
def test_codex_with_the_catalog_config_compacts_locally(mesh_and_records: tuple[RunningMesh, Path], tmp_path: Path,
                                                        version: str,
                                                        record_property: Callable[[str, object], None]) -> None:
    posts, compacting, _ = compact_session(mesh_and_records, tmp_path, version, False, record_property)
    assert metadata(compacting)["compaction"]["implementation"] == "responses"
    assert compacting.body["tools"] == [] and posts[0].body["tools"]  # Codex drops them; the gateway does not
    after = posts[posts.index(compacting) + 1].body["input"]
    assert any(SUMMARY in json.dumps(i) for i in after), after  # the model's summary, in Codex's own wrapping
