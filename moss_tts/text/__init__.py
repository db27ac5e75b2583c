"""Text side of MOSS-TTS: tokenizers, normalization, chunking and per-variant prompt builders."""

from moss_tts.text.chunking import (
    DEFAULT_MAX_TEXT_TOKENS,
    pause_after,
    pause_samples,
    split_into_chunks,
)
from moss_tts.text.normalize import (
    PreparedTexts,
    normalize_delay_text,
    normalize_tts_text,
    prepare_texts,
)
from moss_tts.text.prompts import NanoPromptIds, build_rows
from moss_tts.text.tokenizer import SentencePieceTokenizer

__all__ = [
    "DEFAULT_MAX_TEXT_TOKENS",
    "NanoPromptIds",
    "PreparedTexts",
    "SentencePieceTokenizer",
    "build_rows",
    "normalize_delay_text",
    "normalize_tts_text",
    "pause_after",
    "pause_samples",
    "prepare_texts",
    "split_into_chunks",
]
