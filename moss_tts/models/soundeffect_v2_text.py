"""MOSS-SoundEffect v2.0's text context: the prompt as upstream writes and cleans it, and the
Qwen3 final-norm rows the DiT cross-attends to (upstream `moss_soundeffect_v2/`
`pipeline_moss_soundeffect.py`, `diffsynth/prompters/wan_prompter.py`,
`diffsynth/models/qwen3_text_encoder.py`; docs/upstream-notes.md §family-10.2).

The context is always `text_len` (512) rows: the prompt's tokens (cut to 512) through the
backbone, then zero rows. Upstream right-pads with `<|endoftext|>` under a causal + padding
mask and zeroes the padded rows afterwards; a valid row never sees a later one, so running
only the valid tokens gives the same rows, without 512-row graphs for short prompts.
"""

from __future__ import annotations

import html
from dataclasses import dataclass

import numpy as np

from ..ggml import I32, Graph, Weights, ops
from ..ggml.graph import Tensor
from ..nn.session import DecodeSession, concat_rows
from ..text.qwen_tokenizer import QwenTokenizer
from . import qwen3, spec

PREFIX = "moss.soundeffect_v2.text"
TEXT_LEN = 512                  # WanPrompter's text_len: the context's rows


def duration_seconds(seconds: float) -> float:
    """Seconds as the pipeline keeps them: Python's round to one decimal (on the binary double,
    so 1.25 → 1.2 and 2.35 → 2.4)."""
    return round(float(seconds), 1)


def positive_prompt(prompt: str, seconds: float) -> str:
    """The prompt with the training-time duration suffix; the negative prompt gets none."""
    return f"{prompt.strip()} duration: {duration_seconds(seconds):.1f}s"


def clean_prompt(text: str) -> str:
    """WanPrompter's 'whitespace' cleaning: ftfy's fixes with its defaults (quotes uncurled,
    fullwidth forms and ligatures unfolded, NFC, control characters dropped), HTML entities
    undone twice (`&amp;amp;` → `&`), whitespace runs to one space, ends stripped. Upstream
    splits on regex's `\\s`, which lacks U+001C-U+001F where str.split has them; ftfy has
    dropped those by then (and html.unescape never makes them), so str.split is the same."""
    import ftfy     # lazily: only this family needs it

    text = html.unescape(html.unescape(ftfy.fix_text(text)))
    return " ".join(text.split())


@dataclass(frozen=True)
class TextEncoderConfig:
    """The Qwen3 text encoder: its backbone, its vocabulary and the context's rows."""

    language_config: qwen3.Qwen3Config
    vocab_size: int
    text_len: int = TEXT_LEN

    @classmethod
    def from_gguf(cls, meta) -> "TextEncoderConfig":
        return spec.config_from_gguf(cls, meta, PREFIX,
                                     language_config=qwen3.Qwen3Config.from_gguf(meta))

    def to_metadata(self) -> dict:
        return spec.config_to_metadata(self, PREFIX) | self.language_config.to_metadata()

    def tensor_shapes(self) -> dict[str, tuple]:
        """The token table, the blocks and the final norm (the causal LM's head is not run)."""
        d = self.language_config.hidden_size
        return {"token_embd.weight": (self.vocab_size, d)} | self.language_config.tensor_shapes()

    def source_names(self, source_prefix: str = "model.") -> dict[str, str]:
        """{checkpoint name: GGUF name} below the causal LM's `model.`."""
        return self.language_config.source_names(source_prefix) | {
            f"{source_prefix}embed_tokens.weight": "token_embd.weight"}


@dataclass(frozen=True)
class TextEncoderWeights:
    token_embd: Tensor
    layers: list[qwen3.Qwen3Layer]
    output_norm: Tensor

    @classmethod
    def from_tensors(cls, t: dict, cfg: TextEncoderConfig) -> "TextEncoderWeights":
        return cls(t["token_embd.weight"], qwen3.layers_from_tensors(t, cfg.language_config),
                   t["output_norm.weight"])


def build_hidden(g: Graph, w: TextEncoderWeights, cfg: TextEncoderConfig, n_rows: int,
                 kv) -> None:
    """Token ids "ids" [n_rows] → "hidden" [D, n_rows], the final-RMSNorm output."""
    x = ops.get_rows(w.token_embd, g.input("ids", (n_rows,), I32))    # [D, n_rows]
    h = qwen3.forward(x, w.layers, w.output_norm, cfg.language_config, kv=kv, stage="text")
    g.output(h, "hidden", ndim=2)


class TextEncoder:
    """Prompt → context [text_len, hidden] float32; stateless after load (style C16).
    `weights` holds the tensors of `TextEncoderConfig.tensor_shapes` and its metadata (only
    those, unless `alone` is False: a pipeline's GGUF holds the other components too)."""

    def __init__(self, weights: Weights, tokenizer: QwenTokenizer, *, alone: bool = True):
        self.weights, self.tokenizer = weights, tokenizer
        self.config = TextEncoderConfig.from_gguf(weights.file)
        self.w = TextEncoderWeights.from_tensors(
            weights.require(self.config.tensor_shapes(), strict=alone), self.config)

    def token_ids(self, text: str) -> np.ndarray:
        """The cleaned text's ids, cut to text_len (the tokenizer adds no special tokens). Text
        that spells a control token (`<|im_end|>`) is refused (InputError), where upstream's
        tokenizer would give its special id (P27)."""
        return np.asarray(self.tokenizer.encode(clean_prompt(text)),
                          dtype=np.int32)[:self.config.text_len]

    def hidden(self, ids: np.ndarray) -> np.ndarray:
        """Ids [n] (n ≥ 1) → final-norm rows [n, hidden] at positions 0..n−1."""
        lc = self.config.language_config
        with DecodeSession(lambda g, n, kv, variant: build_hidden(g, self.w, self.config, n, kv),
                           backend=self.weights.backend, n_layer=lc.num_hidden_layers,
                           n_kv_head=lc.num_key_value_heads, head_dim=lc.head_dim,
                           capacity=len(ids), prefix="kv", name="soundeffect_v2.text") as s:
            return concat_rows(s.prefill({"ids": ids}, len(ids)))["hidden"]

    def context(self, text: str) -> np.ndarray:
        """The context of `text` as given (a positive prompt already carries its suffix):
        [text_len, hidden], zero past its tokens; an empty text gives all zeros."""
        ids = self.token_ids(text)
        out = np.zeros((self.config.text_len, self.config.language_config.hidden_size),
                       dtype=np.float32)
        if len(ids):
            out[:len(ids)] = self.hidden(ids)
        return out

    def close(self) -> None:
        if self.weights is not None:
            self.weights.close()
            self.weights = None
