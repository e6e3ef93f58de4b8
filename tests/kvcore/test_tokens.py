from __future__ import annotations

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
