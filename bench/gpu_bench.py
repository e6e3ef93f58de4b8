"""The torch engine against plain transformers on one device, in process and through the whole mesh.

A random-weight Llama of a named real shape (``--shape``: the public configs of Llama-3.2-1B / 3B, Qwen3-8B's
attention shape, or ``tiny`` for the CPU), with the demo tokenizer and chat template (its 4,102 ids, so every
sampled id decodes; prefill and decode cost depend on the shape, not on the weights). Side by side in one run:

* **engine** (in process, ``TorchEngine``): per ``--sizes`` prompt, the cold turn vs Hugging Face's own chunked
  prefill; the cached next turn (+``--suffixes`` tokens) vs one plain HF forward of the same suffix over a
  ``DynamicCache`` already holding the prefix (the compute floor of a cached turn), alternating, medians of
  ``--repeats`` (the ratio shown is the median of each run's ratio to the HF run beside it); and output tokens/s of 8
  concurrent decodes vs one (best of 3 each).
* **mesh** (``harnessmesh up --engine torch --device ...``, ``--mesh-sizes``): Claude Code-shaped Anthropic
  Messages sessions built from a real Claude Code request (tests/fixtures/captures), grown with Bash tool-loop
  rounds: ``cold`` (a new conversation), ``next`` (its next turn: + tool_use + tool_result), ``fork`` (a new
  session, new billing line, sharing the context), the fork with the billing-line strip on and off (per request,
  ``x-harnessmesh-strip-anthropic-preamble``). TTFT = request sent -> the first token's event (max_tokens 1).

Usage: ``python bench/gpu_bench.py --device cuda --shape llama-3.2-3b --sizes 32000,100000 --suffixes 16,450``;
on a CPU: ``python bench/gpu_bench.py`` (tiny shape, 24k tokens). docs/gpu.md has the figures.
"""

from __future__ import annotations

import argparse
import asyncio
import inspect
import json
import random
import secrets
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
from transformers import AutoModelForCausalLM, DynamicCache, LlamaConfig, LlamaForCausalLM  # noqa: E402

from services.common.model_dir import DEMO_MODEL_DIR, load_model_dir  # noqa: E402
from services.worker.engine import EngineRequest  # noqa: E402
from services.worker.torch_engine import ModelRunner, TorchConfig, TorchEngine  # noqa: E402

# hidden, layers, attention heads, KV heads, MLP width (the models' public config.json values)
SHAPES = {
    "tiny": (256, 2, 4, 2, 768),
    "llama-3.2-1b": (2048, 16, 32, 8, 8192),
    "llama-3.2-3b": (3072, 28, 24, 8, 8192),
    "qwen3-8b": (4096, 36, 32, 8, 12288),
}
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
VOCAB = 4102


def build_model(dest: Path, shape: str, dtype: str) -> Path:
    hidden, layers, heads, kv_heads, mlp = SHAPES[shape]
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=hidden, intermediate_size=mlp, num_hidden_layers=layers,
                         num_attention_heads=heads, num_key_value_heads=kv_heads, head_dim=hidden // heads,
                         max_position_embeddings=131072, rope_theta=500000.0, eos_token_id=[2, 0], pad_token_id=0,
                         tie_word_embeddings=True)
    torch.manual_seed(0)
    LlamaForCausalLM(config).to(DTYPES[dtype]).save_pretrained(dest)
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        shutil.copy(DEMO_MODEL_DIR / name, dest / name)
    return dest


def synced(device: str) -> Callable[[], None]:
    return torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)


class PlainHF:
    """The same checkpoint in plain transformers (SDPA, DynamicCache): chunked prefill and suffix forwards."""

    def __init__(self, path: Path, dtype: str, device: str) -> None:
        self.model: Any = AutoModelForCausalLM.from_pretrained(str(path), dtype=DTYPES[dtype],
                                                               attn_implementation="sdpa").to(device).eval()
        self.device, self.sync = device, synced(device)
        names = inspect.signature(type(self.model).forward).parameters
        self.cache_arg = "cache" if "cache" in names else "past_key_values"

    @torch.inference_mode()
    def forward(self, ids: list[int], cache: Any, start: int) -> None:
        tokens = torch.tensor([ids], device=self.device)
        positions = torch.arange(start, start + len(ids), device=self.device).unsqueeze(0)
        self.model(input_ids=tokens, position_ids=positions, use_cache=True, logits_to_keep=1,
                   **{self.cache_arg: cache})

    def prefill(self, ids: list[int], chunk: int) -> tuple[Any, float]:
        cache = DynamicCache(config=self.model.config)
        self.sync()
        t = time.perf_counter()
        for s in range(0, len(ids), chunk):
            self.forward(ids[s: s + chunk], cache, s)
        self.sync()
        return cache, time.perf_counter() - t

    def suffix(self, cache: Any, ids: list[int], start: int) -> float:
        self.sync()
        t = time.perf_counter()
        self.forward(ids, cache, start)
        self.sync()
        seconds = time.perf_counter() - t
        cache.crop(-len(ids))  # back to the prefix (a negative count works on transformers 4.x and 5.x)
        return seconds


async def first_token(engine: TorchEngine, request_id: str, ids: list[int]) -> float:
    t, first = time.perf_counter(), 0.0
    async for _ in engine.generate(EngineRequest(request_id, ids, max_tokens=1, ignore_eos=True)):
        first = first or time.perf_counter() - t
    return first


async def decode_rate(engine: TorchEngine, rnd: random.Random, k: int, tag: str, new: int) -> float:
    reqs = [EngineRequest(f"{tag}{i}", [rnd.randrange(3, 4000) for _ in range(64)], max_tokens=new, ignore_eos=True)
            for i in range(k)]

    async def run(r: EngineRequest) -> int:
        return sum(len(out.token_ids) for out in [o async for o in engine.generate(r)])

    t = time.perf_counter()
    counts = await asyncio.gather(*(run(r) for r in reqs))
    return sum(counts) / (time.perf_counter() - t)


async def engine_part(args: argparse.Namespace, path: Path) -> list[tuple[str, str, str]]:
    runner = ModelRunner(path, dtype=args.dtype, device=args.device)
    most = max(args.sizes) + max(args.suffixes) * (args.repeats + 2) + 4096
    config = TorchConfig(num_blocks=args.num_blocks or most // 16 * 2, max_num_batched_tokens=args.chunk,
                         max_num_seqs=64)
    engine = TorchEngine(config, load_model_dir(path), runner)
    await engine.start()
    plain = PlainHF(path, args.dtype, args.device)
    rows: list[tuple[str, str, str]] = []
    rnd = random.Random(0)
    try:
        await first_token(engine, "warm", [rnd.randrange(3, 4000) for _ in range(600)])
        plain.prefill([rnd.randrange(3, 4000) for _ in range(600)], args.chunk)
        for size in args.sizes:
            base = [rnd.randrange(3, 4000) for _ in range(size)]
            cold = await first_token(engine, f"cold{size}", base)
            cache, hf_cold = plain.prefill(base, args.chunk)
            rows.append((f"{size} cold prefill", f"engine {cold * 1000:.0f} ms, HF {hf_cold * 1000:.0f} ms "
                         f"({args.chunk}-token chunks)", f"{cold / hf_cold:.2f}x"))
            for n in args.suffixes:
                ours, theirs = [], []
                for rep in range(args.repeats):
                    suffix = [rnd.randrange(3, 4000) for _ in range(n)]
                    ours.append(await first_token(engine, f"next{size}-{n}-{rep}", base + suffix))
                    theirs.append(plain.suffix(cache, suffix, size))
                e, h = statistics.median(ours), statistics.median(theirs)
                paired = statistics.median(a / b for a, b in zip(ours, theirs, strict=True))
                rows.append((f"{size} next turn +{n}", f"engine {e * 1000:.1f} ms, HF suffix forward {h * 1000:.1f} ms "
                             f"(runs {_ms(ours)} / {_ms(theirs)}; ratio of medians {e / h:.2f}x)", f"{paired:.2f}x"))
            del cache
        one, eight = [], []
        for rep in range(3):
            one.append(await decode_rate(engine, rnd, 1, f"one{rep}-", args.decode_tokens))
            eight.append(await decode_rate(engine, rnd, 8, f"eight{rep}-", args.decode_tokens))
        o, g = max(one), max(eight)
        rows.append(("8 concurrent decodes vs 1", f"{g:.0f} vs {o:.0f} output tok/s, best of 3 "
                     f"({args.decode_tokens} tokens each, 64-token prompts)", f"{g / o:.2f}x"))
    finally:
        await engine.close()
    return rows


def _ms(values: list[float]) -> str:
    return ",".join(f"{v * 1000:.0f}" for v in values)


# -- the mesh: Claude Code-shaped Anthropic sessions ------------------------------------------------------------

CAPTURE = ROOT / "tests" / "fixtures" / "captures" / "claude-code_2.1.330_tool-loop_requests.json"
WORDS = ["def", "return", "import", "class", "self", "path", "file", "read", "write", "test", "assert", "value",
         "error", "None", "True", "for", "in", "if", "else", "while", "try", "except", "with", "open", "json", "dict",
         "list", "str", "int", "src", "main", "util", "config", "parse", "router", "worker", "cache"]
HEADERS = {"anthropic-version": "2023-06-01", "content-type": "application/json",
           "user-agent": "claude-cli/2.1.330 (external, cli)"}
STRIP = "x-harnessmesh-strip-anthropic-preamble"


def session_body(cch: str, seed: int, rounds: int, last_seed: int, next_turn: bool = False) -> dict[str, Any]:
    """The captured request, billing line ``cch``, grown by ``rounds`` Bash tool rounds (the last one's output
    from ``last_seed``); ``next_turn`` adds one more tool call and its result."""
    body: dict[str, Any] = json.loads(CAPTURE.read_text())["requests"][1]["body"]
    body["system"][0]["text"] = f"x-anthropic-billing-header: cc_version=2.1.330.930; cc_entrypoint=cli; cch={cch};"
    body.update(stream=True, max_tokens=1, model="bench")
    rnd = random.Random(seed)
    for i in range(rounds):
        words = random.Random(last_seed) if i == rounds - 1 else rnd
        body["messages"] += [
            {"role": "assistant", "content": [{"type": "text", "text": "Checking."}, {
                "type": "tool_use", "id": f"toolu_{seed}_{i}", "name": "Bash",
                "input": {"command": f"cat src/module_{i}.py"}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": f"toolu_{seed}_{i}",
                                          "content": " ".join(words.choice(WORDS) for _ in range(1200))}]}]
    if next_turn:
        body["messages"] += [
            {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_next", "name": "Bash",
                                               "input": {"command": "python -m pytest -x -q"}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_next", "content":
                                          "1 failed, 212 passed in 9.81s\n" + " ".join(rnd.choice(WORDS)
                                                                                      for _ in range(200))}]}]
    return body


def timed_turn(http: Any, body: dict[str, Any], session: str, strip: bool) -> tuple[float, int, int]:
    """TTFT, prompt tokens and cached tokens of one streamed turn."""
    headers = {**HEADERS, "x-claude-code-session-id": session, STRIP: "1" if strip else "0"}
    t0, first, usage = time.perf_counter(), 0.0, {}
    with http.stream("POST", "/v1/messages", content=json.dumps(body).encode(), headers=headers) as r:
        if r.status_code != 200:
            raise RuntimeError(f"HTTP {r.status_code}: {r.read().decode()[:300]}")
        for line in r.iter_lines():
            if not line.startswith("data: "):
                continue
            event = json.loads(line[6:])
            if event["type"] == "message_start":
                usage.update(event["message"].get("usage") or {})
            elif event["type"] in ("content_block_delta", "message_delta") and not first:
                first = time.perf_counter() - t0
    cached = int(usage.get("cache_read_input_tokens") or 0)
    return first, int(usage.get("input_tokens") or 0) + cached, cached  # input_tokens: the uncached ones


def count_tokens(http: Any, body: dict[str, Any]) -> int:
    r = http.post("/v1/messages/count_tokens", headers=HEADERS,
                  json={k: v for k, v in body.items() if k not in ("stream", "max_tokens")})
    r.raise_for_status()
    return int(r.json()["input_tokens"])


def mesh_part(args: argparse.Namespace, path: Path, log: Path) -> list[tuple[str, str, str]]:
    import httpx

    from tests.support.mesh import running_mesh

    num_blocks = args.num_blocks or max(args.mesh_sizes) * 2 * args.mesh_repeats // 16 + 4096
    mesh_args = ["--engine", "torch", "--model", str(path), "--device", args.device, "--dtype", args.dtype,
                 "--workers", "1", "--served-model-name", "bench", "--max-model-len", "131072",
                 "--max-num-batched-tokens", str(args.chunk), "--num-blocks", str(num_blocks),
                 "--stall-timeout", "3600", "--first-frame-timeout", "3600",  # a CPU's long prefill is no stall
                 "--torch-threads", str(args.threads)]
    rows: list[tuple[str, str, str]] = []
    with running_mesh(mesh_args, log, timeout=600) as mesh, httpx.Client(base_url=mesh.http, timeout=1800) as http:
        base = count_tokens(http, session_body("00000000", 0, 1, 0))
        per_round = (count_tokens(http, session_body("00000000", 0, 5, 0)) - base) / 4
        timed_turn(http, session_body("warm0000", 1, 1, 1), "warm", True)
        for size in args.mesh_sizes:
            rounds = max(1, 1 + round((size - base) / per_round))
            results: dict[str, list[float]] = {}
            seen: dict[str, tuple[int, int]] = {}
            for rep in range(args.mesh_repeats):
                seed, a, b = size * 100 + rep, secrets.token_hex(4), secrets.token_hex(4)
                for case, body, session, strip in (
                        ("cold", session_body(a, seed, rounds, seed), f"A{seed}", True),
                        ("next", session_body(a, seed, rounds, seed, next_turn=True), f"A{seed}", True),
                        ("fork, strip on", session_body(b, seed, rounds, seed + 1), f"B{seed}", True),
                        ("fork, strip off", session_body(secrets.token_hex(4), seed, rounds, seed + 2),
                         f"C{seed}", False)):
                    ttft, prompt, cached = timed_turn(http, body, session, strip)
                    results.setdefault(case, []).append(ttft)
                    seen[case] = (prompt, cached)
            for case, values in results.items():
                prompt, cached = seen[case]
                rows.append((f"mesh {prompt // 1000}k {case}", f"TTFT {statistics.median(values) * 1000:.0f} ms "
                             f"(runs {_ms(values)}; {prompt} tokens, {cached} cached)", ""))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", choices=sorted(SHAPES), default="tiny")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default=None, help="default: bfloat16 on cuda, else float32")
    parser.add_argument("--sizes", default="24000", help="prompt tokens of the in-process turns")
    parser.add_argument("--suffixes", default="16,450", help="new tokens of a cached next turn")
    parser.add_argument("--mesh-sizes", default="32000",
                        help="prompt tokens of the mesh sessions (at least the captured request's ~29k; '' to skip)")
    parser.add_argument("--repeats", type=int, default=7, help="runs of each in-process case")
    parser.add_argument("--mesh-repeats", type=int, default=2, help="sessions per mesh size")
    parser.add_argument("--chunk", type=int, default=8192, help="prefill chunk (--max-num-batched-tokens)")
    parser.add_argument("--num-blocks", type=int, default=0, help="KV pool blocks (0: sized to the run)")
    parser.add_argument("--decode-tokens", type=int, default=128)
    parser.add_argument("--threads", type=int, default=0,
                        help="CPU threads of torch, here and in the mesh's worker (0: PyTorch's default; on a shared "
                             "CPU, 1 keeps other jobs' load from stalling every op's thread team)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    args.dtype = args.dtype or ("bfloat16" if args.device.startswith("cuda") else "float32")
    args.sizes = [int(s) for s in args.sizes.split(",") if s]
    args.suffixes = [int(s) for s in args.suffixes.split(",") if s]
    args.mesh_sizes = [int(s) for s in args.mesh_sizes.split(",") if s]
    with tempfile.TemporaryDirectory() as tmp:
        path = build_model(Path(tmp) / "model", args.shape, args.dtype)
        rows = asyncio.run(engine_part(args, path)) if args.sizes else []
        if args.mesh_sizes:
            log = Path(tmp) / "mesh.log"
            try:
                rows += mesh_part(args, path, log)
            except Exception:
                print(log.read_text(errors="replace")[-4000:] if log.exists() else "(no mesh log)", file=sys.stderr)
                raise
    import transformers

    print(f"torch engine vs plain transformers: {args.shape} shape, random weights, {args.dtype}, {args.device}, "
          f"{torch.get_num_threads()} torch threads "
          f"(torch {torch.__version__}, transformers {transformers.__version__}); medians of {args.repeats} in "
          f"process, {args.mesh_repeats} through the mesh")
    width = max(len(r[0]) for r in rows)
    for name, figures, ratio in rows:
        print(f"{name:<{width}}  {ratio:>6}  {figures}")


if __name__ == "__main__":
    main()
