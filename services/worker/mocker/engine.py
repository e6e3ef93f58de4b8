"""The mocker engine: the shared engine core with simulated compute, no GPU.

Its compute is a step-time model (:mod:`services.kvcore.timing`): a step sleeps its modelled time.
What a request generates is known in advance: a scripted completion picked by ``match_text``
(``script.py``), else seeded filler text (:mod:`services.kvcore.tokens`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from services.common.model_dir import ModelDir
from services.kvcore.config import BatchingConfig
from services.kvcore.loop import ModelledCompute
from services.kvcore.outputs import CheckedRequest
from services.kvcore.request import CoreRequest
from services.kvcore.timing import StepTiming, TimingModel
from services.kvcore.tokens import FillerText, FillerVocabulary, TokenSource, filler_seed
from services.worker.core_engine import CoreEngine
from services.worker.mocker.script import Script


def resumed_script(scripted: list[int], prompt: Sequence[int], continued: int) -> list[int]:
    """What is left of a scripted completion for a continuation whose prompt ends with the ``continued``
    tokens an earlier attempt generated: the script after them when they are its start, else all of it."""
    if 0 < continued <= min(len(scripted), len(prompt)) and list(prompt[-continued:]) == scripted[:continued]:
        return scripted[continued:]
    return scripted


@dataclass(frozen=True)
class MockerConfig(BatchingConfig):
    """Knobs of the simulated engine: batching limits plus filler seed and timing model."""

    seed: int = 0
    timing: StepTiming = field(default_factory=TimingModel)  # or DynamoTiming (``--timing-model dynamo``)


class MockerEngine(CoreEngine):
    """Implements :class:`services.worker.engine.Engine` without a GPU (see module docstring)."""

    name = "mocker"
    config: MockerConfig

    def __init__(self, config: MockerConfig, model: ModelDir, script: Script | None = None) -> None:
        super().__init__(config, model, ModelledCompute(config.timing))
        self.script = script
        self._vocab = FillerVocabulary(model.tokenizer)

    def _new_request(self, checked: CheckedRequest) -> CoreRequest:
        request = checked.request
        scripted: list[int] = []
        entry = self.script.lookup(request.match_text) if self.script is not None else None
        if entry is not None:
            scripted = self.model.tokenizer.encode(entry.completion, add_special_tokens=False).ids
            scripted = resumed_script(scripted, request.token_ids, request.continued_tokens)
        eos = self.model.eos_token_ids[0] if self.model.eos_token_ids else None
        filler = self._filler(request.token_ids, request.continued_tokens, request.seed, request.packed)
        # a continuation that resumes after the script's last token still ends there (EOS next, not filler)
        source = TokenSource(scripted, eos, filler, scripted_reply=bool(scripted) or entry is not None)
        # the prompt is never copied: nothing computes on its ids
        return CoreRequest(checked, tokenizer=self.model.tokenizer, source=source, share_prompt=True)

    def _filler(self, prompt: Sequence[int], continued: int, request_seed: int | None,
                packed: bytes = b"") -> FillerText:
        """The request's filler text (``packed``: the prompt's ids packed, when the request has them). A
        continuation (a migrated or resumed request: its prompt ends with the ``continued`` tokens an earlier
        attempt generated) goes on with the same text a clean run would have produced: seeded from the
        original prompt and advanced past those tokens, when they are that text's start (else, e.g. another
        ``--seed`` wrote them, seeded from the whole prompt as any request)."""
        if 0 < continued < len(prompt):
            cut = len(prompt) - continued
            filler = FillerText(self._vocab, filler_seed(prompt[:cut], self.config.seed, request_seed))
            if filler.take(continued) == list(prompt[cut:]):
                return filler
        return FillerText(self._vocab, filler_seed(packed or prompt, self.config.seed, request_seed))
