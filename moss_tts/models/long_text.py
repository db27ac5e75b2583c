"""Long text for the families that speak one prompt at a time (Delay, Local, Local v1.5): the
text cut at sentence boundaries by Nano's rules (text/chunking.py), never inside a `[...]` /
`{...}` tag, each chunk its own utterance continuing the chunk before it (its text and
generated frames are the next prompt, as Nano's continuation), and upstream's pause between
chunks (docs/upstream-notes.md §nano-5.5)."""

from __future__ import annotations

import dataclasses
import gc
from collections.abc import Callable, Iterator

import numpy as np

from ..text.chunking import pause_samples, split_into_chunks
from .tts import BudgetCut, Reference

# Tokens of text per utterance. Upstream speaks a whole request as one prompt; a cap keeps
# every prompt, KV cache and frame budget bounded whatever the text's length, and 200 tokens
# (about a minute of speech) fit each family's default frame budget with room to spare
MAX_CHUNK_TOKENS = 200

# say(chunk, prompt, prompt_text, seed, frames): one utterance's audio chunks; it appends each
# frame it generates (codes [n_vq]) to `frames`, which become the next chunk's prompt
Say = Callable[[str, "Reference | None", "str | None", "int | None", list], Iterator[np.ndarray]]


def split_long_text(text, tokenizer, max_tokens: int = MAX_CHUNK_TOKENS, *,
                    fields: dict | None = None) -> list[str]:
    """Sentence chunks of at most max_tokens tokens; a text that fits one chunk comes back
    unchanged as [text], so it is spoken exactly as without chunking. A text given a duration
    (`tokens` or `seconds` among the prompt `fields`) also stays whole: upstream's duration is
    the whole utterance's. What is not a non-empty str comes back as [text] too: the family's
    own check names what is wrong with it."""
    fields = fields or {}
    if fields.get("tokens") is not None or fields.get("seconds") is not None:
        return [text]
    if not isinstance(text, str) or not text.strip():
        return [text]
    # tags such as [pause 1.5s] or [S1] hold marks and spaces, and are spoken whole
    return split_into_chunks(text, tokenizer, max_tokens, keep_tags=True)


def speak(chunks: list[str], say: Say, *, sample_rate: int, channels: int,
          prompt: Reference | None = None, prompt_text: str | None = None,
          seed: int | None = None) -> Iterator[np.ndarray]:
    """Each chunk's audio, then the pause after it (none after the last). Chunk 0 takes the
    caller's continuation prompt; chunk i > 0 continues chunk i − 1 (its text, and the frames
    it generated), so the voice holds across chunks. With a seed, chunk i samples from
    seed + i, as Nano's chunks do, so a one-chunk text sees exactly the caller's seed."""
    for i, chunk in enumerate(chunks):
        frames: list[np.ndarray] = []
        spoke = False
        for part in say(chunk, prompt, prompt_text, seed if i == 0 or seed is None else seed + i,
                        frames):
            # a chunk cut by its budget is counted among all the chunks (one warning per call)
            if isinstance(part, BudgetCut):
                yield dataclasses.replace(part, chunks=len(chunks))
                continue
            spoke = spoke or len(part) > 0
            yield part
        if i + 1 == len(chunks):
            return
        # an utterance builds and frees dozens of graphs whose Python wrappers are reference
        # cycles (graph ↔ tensors ↔ allocator); collected here, at a chunk's end, the peak RSS
        # stays flat over hundreds of chunks (tiny Local, 400 chunks: 182 MB, 262 MB without)
        gc.collect()
        if frames:   # a chunk that made no frame leaves the previous prompt in place
            prompt, prompt_text = Reference(np.array(frames, dtype=np.int64)), chunk
        if spoke:    # no pause after a silent chunk: silence alone is no audio (as Nano's)
            yield np.zeros((pause_samples(chunk, sample_rate), channels), dtype=np.float32)
