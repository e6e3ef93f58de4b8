"""The engine core's step contract, driven by hand (no asyncio): plan, compute, complete."""

from __future__ import annotations

import ast
from pathlib import Path

from services.common.model_dir import load_model_dir
from services.kvcore.config import BatchingConfig
from services.kvcore.core import EngineCore
from services.kvcore.domain import EngineRequest, KvEvent, KvStored
from services.kvcore.outputs import CheckedRequest
from services.kvcore.request import CoreRequest
from services.kvcore.tokens import FillerText, FillerVocabulary, TokenSource

TOKENIZER = load_model_dir("").tokenizer


def request(rid: str, n: int, max_tokens: int, *, known: bool) -> CoreRequest:
    checked = CheckedRequest(EngineRequest(rid, list(range(100, 100 + n)), max_tokens=max_tokens), max_tokens,
                             frozenset())
    source = TokenSource((), None, FillerText(FillerVocabulary(TOKENIZER), 7)) if known else None
    return CoreRequest(checked, tokenizer=TOKENIZER, source=source)


def test_known_tokens_hold_their_kv_when_scheduled() -> None:
    core = EngineCore(BatchingConfig(block_size=4, num_blocks=16))
    req = request("a", 7, 3, known=True)
    core.add(req)
    plan = core.plan_step()
    (item,) = plan.items
    assert item.samples and item.token is not None and item.prefill_tokens == 7
    assert req.computed == 8  # the prompt plus the token this step generates
    done = core.complete_step(plan)
    assert done.first == [req] and req.generated == 1
    plan = core.plan_step()
    assert plan.items[0].tokens == [] and plan.decode_batch == 1 and req.computed == 9


def test_sampled_tokens_are_fed_by_the_next_step() -> None:
    events: list[KvEvent] = []
    core = EngineCore(BatchingConfig(block_size=4, num_blocks=16), on_event=events.append)
    req = request("a", 7, 3, known=False)
    core.add(req)
    plan = core.plan_step()
    (item,) = plan.items
    assert item.samples and item.token is None and req.computed == 7
    assert [b.block_hash for e in events if isinstance(e, KvStored) for b in e.blocks]  # sealed at schedule time
    core.complete_step(plan, [55])
    plan = core.plan_step()
    assert plan.items[0].tokens == [55] and plan.items[0].start == 7 and req.computed == 8
    core.complete_step(plan, [56])
    core.complete_step(core.plan_step(), [57])
    assert req.finish_reason == "length" and req.generated == 3 and not core.requests
    assert core.blocks.active_blocks == 0


def test_an_abort_during_the_step_skips_its_token() -> None:
    released: list[CoreRequest] = []
    core = EngineCore(BatchingConfig(block_size=4, num_blocks=16), on_release=released.append)
    req = request("a", 5, 3, known=False)
    core.add(req)
    plan = core.plan_step()
    assert core.abort("a") and released == [req]
    done = core.complete_step(plan, [9])
    assert done.first == [] and req.finish_reason == "cancelled" and req.generated == 0


def test_kvcore_imports_no_service_and_no_transport() -> None:
    banned = ("services.worker", "services.router", "services.launcher", "services.parse", "services.replay",
              "gateway", "grpc", "nats", "services.api")
    for path in (Path(__file__).resolve().parents[2] / "services" / "kvcore").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else (
                [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            for name in names:
                assert not name.startswith(banned), f"{path.name} imports {name}"


def _stopping_requests(vocab: FillerVocabulary) -> list[CoreRequest]:
    """Requests with an EOS stop id: one whose script ends in EOS mid-block, one that only ever draws filler."""
    eos = 3
    out = []
    for rid, script, max_tokens in (("scripted", [50 + i for i in range(13)], 40), ("filler", [], 30)):
        checked = CheckedRequest(EngineRequest(rid, list(range(100, 109)), max_tokens=max_tokens), max_tokens,
                                 frozenset({eos}))
        out.append(CoreRequest(checked, tokenizer=TOKENIZER, source=TokenSource(script, eos, FillerText(vocab, 5))))
    return out


def test_quiet_steps_stop_before_a_stop_id_and_end_as_step_by_step_does() -> None:
    """Requests with stop ids take quiet steps up to (not over) the first stop id among their known tokens;
    advancing them gives the tokens, endings and KV events of planning and completing every step."""
    vocab = FillerVocabulary(TOKENIZER)
    results = []
    for fast in (False, True):
        events: list[KvEvent] = []
        core = EngineCore(BatchingConfig(block_size=8, num_blocks=64), on_event=events.append)
        reqs = _stopping_requests(vocab)
        for req in reqs:
            core.add(req)
        quiet_taken = 0
        while core.has_work:
            quiet = core.quiet_steps() if fast else 0
            if quiet:
                core.advance_quiet(quiet)
                quiet_taken += quiet
            else:
                core.complete_step(core.plan_step())
        results.append(([(list(r.all_tokens[r.prompt_len:]), r.finish_reason, r.generated) for r in reqs], events))
        if fast:
            assert quiet_taken > 10
    assert results[0] == results[1]
    (scripted, reason, generated), _ = results[1][0]
    assert scripted == [50 + i for i in range(13)] and reason == "stop" and generated == 13  # EOS ended it, unshown
