"""The parse service: owner of the model's format (chat template, tokenizer, output parsers)."""
