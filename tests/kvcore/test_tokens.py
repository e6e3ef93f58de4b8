from __future__ import annotations

import random

from services.common.model_dir import load_model_dir
from services.kvcore.tokens import FillerText, FillerVocabulary, filler_seed


def test_filler_is_deterministic_words_without_special_tokens() -> None:
    model = load_model_dir("")
    vocab = FillerVocabulary(model.tokenizer)
    a = FillerText(vocab, filler_seed([1, 2, 3], 0))
    b = FillerText(vocab, filler_seed([1, 2, 3], 0))
    c = FillerText(vocab, filler_seed([1, 2, 4], 0))
    ta, tb, tc = ([f.next() for _ in range(50)] for f in (a, b, c))
    assert ta == tb and ta != tc
    special = {model.tokenizer.token_to_id(t) for t in ("<|im_end|>", "<|endoftext|>", "<|im_start|>", "<think>")}
    assert not special & set(ta)
    text = model.tokenizer.decode(ta)
    assert text.replace(".", "").replace(" ", "").isalpha()


def test_filler_draws_are_random_randoms_own() -> None:
    """FillerText inlines ``random.Random``'s ``choice`` / ``randint``: the same tokens, draw for draw."""
    class Vocab:
        words = list(range(100, 1100))  # not a power of two: rejection sampling happens
        period = 13

    for seed in (0, 1, 12345):
        ours = FillerText(Vocab(), seed)  # type: ignore[arg-type]
        rng = random.Random(seed)
        until = rng.randint(6, 16)
        expected = []
        for _ in range(500):
            until -= 1
            if until <= 0:
                until = rng.randint(6, 16)
                expected.append(Vocab.period)
            else:
                expected.append(rng.choice(Vocab.words))
        assert [ours.next() for _ in range(250)] + ours.take(250) == expected
