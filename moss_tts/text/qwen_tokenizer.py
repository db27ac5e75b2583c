"""The Qwen byte-level BPE tokenizer of the Qwen3-based families, through the `tokenizers`
library on the tokenizer.json text embedded in the model GGUF (upstream
`moss_tts_delay/llama_cpp/processor.py` `Tokenizer`).

Prompts are built by ids (P27): control tokens are never spelled out, and text that spells one
(`<|im_end|>`) is refused, so user text can never produce a control id.
"""

from __future__ import annotations

from moss_tts.errors import InputError, ModelFileError


class QwenTokenizer:
    """`QwenTokenizer.from_json(text)`; `encode(text)` → ids of ordinary text only."""

    def __init__(self, tokenizer, *, source: str = "tokenizer.json"):
        self._tok = tokenizer
        self.source = source
        # every added token (the specials at 151643 … in Qwen) is a control id
        self.control = {i: t.content for i, t in tokenizer.get_added_tokens_decoder().items()}

    @classmethod
    def from_json(cls, text: str, *, source: str = "tokenizer.json") -> "QwenTokenizer":
        from tokenizers import Tokenizer

        try:
            return cls(Tokenizer.from_str(text), source=source)
        except Exception as e:  # the Rust error names the JSON problem
            raise ModelFileError(f"{source}: not a usable tokenizer.json ({e})") from None

    @classmethod
    def embedded(cls, text: str | None, path, key: str, family: str) -> "QwenTokenizer":
        """The tokenizer.json a model GGUF at `path` holds under `key`; ModelFileError saying
        how to re-convert (`convert <family>`) when it holds none."""
        if text is None:
            raise ModelFileError(f"{path}: no embedded tokenizer.json ({key}) — re-convert with "
                                 f"`moss_tts convert {family}`")
        return cls.from_json(text, source=str(path))

    @property
    def vocab_size(self) -> int:
        return self._tok.get_vocab_size()

    def token_id(self, token: str) -> int | None:
        return self._tok.token_to_id(token)

    def encode(self, text: str) -> list[int]:
        """Ids of `text`; InputError when it spells a control token."""
        ids = self._tok.encode(text, add_special_tokens=False).ids
        bad = sorted({self.control[i] for i in ids if i in self.control})
        if bad:
            raise InputError(f"text contains the control token spelling(s) {', '.join(bad)}; "
                             "remove them (prompts are built from ids, never from spellings)")
        return ids

    def decode(self, ids) -> str:
        return self._tok.decode([int(i) for i in ids])
