"""Long-text chunking for voice cloning and the pauses between chunks (docs/upstream-notes.md
§nano-5.4-5.5).

Follows upstream HF `modeling_moss_tts_nano.py` `_split_text_into_best_sentences` (copied as
`split_voice_clone_text` in `onnx_tts_runtime.py`) and its inter-chunk pause estimate.
Token counts use the model's own tokenizer (anything with `encode(text) -> list[int]`).
"""

import re
from bisect import bisect_right

from moss_tts.errors import InputError
from moss_tts.text.script import CJK_OR_HANGUL, CLAUSE_END, CLOSERS, SENTENCE_END

DEFAULT_MAX_TEXT_TOKENS = 75  # every user-facing entry point; the model signature says 50
SHORT_CHUNK_PAUSE_SECONDS = 0.40  # after a chunk of <= 4 whitespace-separated words
LONG_CHUNK_PAUSE_SECONDS = 0.24
SHORT_CHUNK_MAX_WORDS = 4

_TOKEN_CUT_BOUNDARIES = SENTENCE_END | CLAUSE_END | {" "}
# Upstream scans prefix[-1] down to prefix[-24]: 24 positions, written as a 25-char window.
_TOKEN_CUT_LOOKBACK = 24
_SHORT_TEXT_WORDS = 5
_SHORT_TEXT_PADDING = " " * 8
# Tags the Delay family reads whole ([S1], [pause 1.5s], {whisper}): with keep_tags no cut
# falls inside one, though they hold marks and spaces. Nano's normalizer quotes them instead.
_TAG = re.compile(r"\[[^\[\]]*\]|\{[^{}]*\}")


def tag_spans(text):
    """(start, end) of each `[...]` / `{...}` tag in `text`, in order."""
    return [m.span() for m in _TAG.finditer(text)]


def _masked(text, spans):
    """`text` with every char inside a tag (brackets excluded) made a letter: no mark, space or
    closer inside a tag is then seen by a cut search."""
    if not spans:
        return text
    parts, done = [], 0
    for start, end in spans:
        parts += [text[done : start + 1], "x" * (end - start - 2)]
        done = end - 1
    return "".join(parts) + text[done:]


def _outside_tags(cut, spans, low):
    """`cut` moved out of the tag it falls inside (to the tag's start when that leaves text
    after `low`, else to its end); unchanged when it falls inside none."""
    i = bisect_right(spans, (cut, float("inf"))) - 1
    if i < 0 or not spans[i][0] < cut < spans[i][1]:
        return cut
    return spans[i][0] if spans[i][0] > low else spans[i][1]


def contains_cjk(text):
    """Any CJK ideograph, kana or Hangul syllable (the chunker's notion of "CJK")."""
    return CJK_OR_HANGUL.search(text) is not None


def continuation_prompt_text(chunk: str) -> str:
    """A chunk's text as the prompt text of the next one (upstream appends the next text with
    no separator, so a space ends it unless it is CJK)."""
    return chunk if contains_cjk(chunk) else chunk + " "


def prepare_for_chunking(text):
    """Fold newlines and double spaces, then close the text with a sentence mark."""
    text = text.strip()
    if not text:
        raise InputError("text is empty")
    text = text.replace("\n", " ").replace("\r", " ")
    while "  " in text:
        text = text.replace("  ", " ")
    if contains_cjk(text):
        return text if text[-1] in SENTENCE_END else text + "。"
    if not text[0].isupper():
        text = text[0].upper() + text[1:]
    if text[-1].isalnum():
        text += "."
    if len(text.split()) < _SHORT_TEXT_WORDS:
        # Upstream pads short texts; the padding is stripped again by the splitter.
        text = _SHORT_TEXT_PADDING + text
    return text


def split_at_marks(text, marks, *, keep_tags=False):
    """Cut after every char in `marks` (plus any closers right after it); pieces are stripped.
    keep_tags: marks inside a `[...]` / `{...}` tag do not cut."""
    probe = _masked(text, tag_spans(text)) if keep_tags else text
    pieces, start, i = [], 0, 0
    while i < len(text):
        if probe[i] not in marks:
            i += 1
            continue
        i += 1
        while i < len(text) and probe[i] in CLOSERS:
            i += 1
        piece = text[start:i].strip()
        if piece:
            pieces.append(piece)
        while i < len(text) and text[i].isspace():
            i += 1
        start = i
    tail = text[start:].strip()
    if tail:
        pieces.append(tail)
    return pieces


def _longest_prefix_within(text, start, count, max_tokens):
    """Largest n with count(text[start:start + n].strip()) <= max_tokens (1 if none).

    Upstream binary-searches the whole rest of the text, which makes a long unpunctuated text
    quadratic; the search here runs between the last window within budget and the first one
    over it (windows start at one character per token and double), so each cut costs about
    its own length.
    """
    rest, fits = len(text) - start, 1
    high = min(rest, max_tokens)
    while high < rest and count(text[start : start + high].strip()) <= max_tokens:
        fits, high = high, min(rest, 2 * high)
    if high == rest and count(text[start:].strip()) <= max_tokens:
        return rest  # the rest fits whole (upstream checks this first)
    low, best = fits, fits
    while low <= high:
        middle = (low + high) // 2
        candidate = text[start : start + middle].strip()
        if candidate and count(candidate) > max_tokens:
            high = middle - 1
            continue
        if candidate:
            best = middle
        low = middle + 1
    return best


def split_by_token_budget(text, count, max_tokens, *, keep_tags=False):
    """Cut `text` into pieces of <= `max_tokens` tokens, preferring a space or mark near the cut.
    keep_tags: no cut inside a `[...]` / `{...}` tag (one longer than the budget stays whole)."""
    pieces, text, at = [], text.strip(), 0
    spans = tag_spans(text) if keep_tags else []
    probe = _masked(text, spans)
    while at < len(text):
        limit = _longest_prefix_within(text, at, count, max_tokens)
        if at + limit >= len(text):
            pieces.append(text[at:])
            break
        cut = limit
        for i in range(limit - 1, max(-1, limit - 1 - _TOKEN_CUT_LOOKBACK), -1):
            if probe[at + i] in _TOKEN_CUT_BOUNDARIES:
                cut = i + 1
                break
        cut = _outside_tags(at + cut, spans, at) - at
        piece = text[at : at + cut].strip()
        if not piece:
            cut = _outside_tags(at + limit, spans, at) - at
            piece = text[at : at + cut].strip()
        pieces.append(piece)
        at += cut
        while at < len(text) and text[at].isspace():  # upstream strips the rest
            at += 1
    return pieces


def _join(left, right):
    if not left or not right:
        return left or right
    return left + right if contains_cjk(left) or contains_cjk(right) else f"{left} {right}"


def _budget_pieces(sentence, count, max_tokens, keep_tags):
    """(tokens, text) pieces of one sentence: whole, else by clauses, else by token budget."""
    n_tokens = count(sentence)
    if n_tokens <= max_tokens:
        return [(n_tokens, sentence)]
    pieces = []
    for clause in split_at_marks(sentence, CLAUSE_END, keep_tags=keep_tags) or [sentence]:
        n_tokens = count(clause)
        if n_tokens <= max_tokens:
            pieces.append((n_tokens, clause))
            continue
        pieces.extend((count(p), p) for p in
                      split_by_token_budget(clause, count, max_tokens, keep_tags=keep_tags))
    return pieces


def split_into_chunks(text, tokenizer, max_tokens=DEFAULT_MAX_TEXT_TOKENS, *, keep_tags=False):
    """Voice-clone chunks of at most `max_tokens` tokens each (when a piece allows it).

    Sentences are cut at sentence marks, too-long ones at clause marks, and too-long clauses by
    token count; the pieces are then packed greedily. A budget <= 0 disables chunking, and a
    result of one chunk returns the original `text` unchanged (not the prepared form).
    keep_tags: no cut inside a `[...]` / `{...}` tag (the Delay family's `[pause 1.5s]`).

    >>> split_into_chunks("One. Two.", tok, max_tokens=75)  # doctest: +SKIP
    ['One. Two.']
    """
    if not isinstance(text, str) or not text.strip():
        raise InputError("text is empty")
    if int(max_tokens) <= 0:
        return [text]
    chunks = pack_sentences(prepare_for_chunking(text), tokenizer, int(max_tokens),
                            keep_tags=keep_tags)
    return chunks if len(chunks) > 1 else [text]


def pack_sentences(text, tokenizer, max_tokens, *, keep_tags=False, prefix=""):
    """`split_into_chunks` without its preparation: `text` as it is, cut at sentences (then
    clauses, then the budget) and packed greedily; each chunk is counted with `prefix` before
    it (a speaker tag the caller will put there), so prefix + chunk fits max_tokens."""

    def count(piece):
        return len(tokenizer.encode(prefix + piece))

    pieces = []
    for sentence in split_at_marks(text, SENTENCE_END, keep_tags=keep_tags) or [text.strip()]:
        pieces.extend(_budget_pieces(sentence, count, max_tokens, keep_tags))

    shared = len(tokenizer.encode(prefix)) if prefix else 0  # counted in both terms below
    chunks, current, current_tokens = [], "", 0
    for n_tokens, piece in pieces:
        if current and current_tokens + n_tokens - shared > max_tokens:
            chunks.append(current.strip())
            current, current_tokens = piece, n_tokens
        elif current:
            current = _join(current, piece)
            current_tokens = count(current)  # recounted: a join can merge tokens
        else:
            current, current_tokens = piece, n_tokens
    if current:
        chunks.append(current.strip())
    return chunks


def pause_after(chunk_text):
    """Silence in seconds after a chunk that is not the last (CJK without spaces = one word)."""
    n_words = len(chunk_text.split())
    return (
        SHORT_CHUNK_PAUSE_SECONDS if n_words <= SHORT_CHUNK_MAX_WORDS else LONG_CHUNK_PAUSE_SECONDS
    )


def pause_samples(chunk_text, sample_rate):
    """`pause_after` as a sample count: round(sample_rate × seconds)."""
    return max(0, round(sample_rate * pause_after(chunk_text)))
