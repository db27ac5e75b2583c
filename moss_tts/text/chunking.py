"""Long-text chunking for voice cloning and the pauses between chunks (docs/upstream-notes.md
§nano-5.4-5.5).

Follows upstream HF `modeling_moss_tts_nano.py` `_split_text_into_best_sentences` (copied as
`split_voice_clone_text` in `onnx_tts_runtime.py`) and its inter-chunk pause estimate.
Token counts use the model's own tokenizer (anything with `encode(text) -> list[int]`).
"""

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


def contains_cjk(text):
    """Any CJK ideograph, kana or Hangul syllable (the chunker's notion of "CJK")."""
    return CJK_OR_HANGUL.search(text) is not None


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


def split_at_marks(text, marks):
    """Cut after every char in `marks` (plus any closers right after it); pieces are stripped."""
    pieces, start, i = [], 0, 0
    while i < len(text):
        if text[i] not in marks:
            i += 1
            continue
        i += 1
        while i < len(text) and text[i] in CLOSERS:
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


def split_by_token_budget(text, count, max_tokens):
    """Cut `text` into pieces of <= `max_tokens` tokens, preferring a space or mark near the cut."""
    pieces, text, at = [], text.strip(), 0
    while at < len(text):
        limit = _longest_prefix_within(text, at, count, max_tokens)
        if at + limit >= len(text):
            pieces.append(text[at:])
            break
        cut = limit
        for i in range(limit - 1, max(-1, limit - 1 - _TOKEN_CUT_LOOKBACK), -1):
            if text[at + i] in _TOKEN_CUT_BOUNDARIES:
                cut = i + 1
                break
        piece = text[at : at + cut].strip()
        if not piece:
            piece, cut = text[at : at + limit].strip(), limit
        pieces.append(piece)
        at += cut
        while at < len(text) and text[at].isspace():  # upstream strips the rest
            at += 1
    return pieces


def _join(left, right):
    if not left or not right:
        return left or right
    return left + right if contains_cjk(left) or contains_cjk(right) else f"{left} {right}"


def _budget_pieces(sentence, count, max_tokens):
    """(tokens, text) pieces of one sentence: whole, else by clauses, else by token budget."""
    n_tokens = count(sentence)
    if n_tokens <= max_tokens:
        return [(n_tokens, sentence)]
    pieces = []
    for clause in split_at_marks(sentence, CLAUSE_END) or [sentence]:
        n_tokens = count(clause)
        if n_tokens <= max_tokens:
            pieces.append((n_tokens, clause))
            continue
        pieces.extend((count(p), p) for p in split_by_token_budget(clause, count, max_tokens))
    return pieces


def split_into_chunks(text, tokenizer, max_tokens=DEFAULT_MAX_TEXT_TOKENS):
    """Voice-clone chunks of at most `max_tokens` tokens each (when a piece allows it).

    Sentences are cut at sentence marks, too-long ones at clause marks, and too-long clauses by
    token count; the pieces are then packed greedily. A budget <= 0 disables chunking, and a
    result of one chunk returns the original `text` unchanged (not the prepared form).

    >>> split_into_chunks("One. Two.", tok, max_tokens=75)  # doctest: +SKIP
    ['One. Two.']
    """
    if not isinstance(text, str) or not text.strip():
        raise InputError("text is empty")
    if int(max_tokens) <= 0:
        return [text]
    max_tokens = int(max_tokens)

    def count(piece):
        return len(tokenizer.encode(piece))

    prepared = prepare_for_chunking(text)
    pieces = []
    for sentence in split_at_marks(prepared, SENTENCE_END) or [prepared.strip()]:
        pieces.extend(_budget_pieces(sentence, count, max_tokens))

    chunks, current, current_tokens = [], "", 0
    for n_tokens, piece in pieces:
        if current and current_tokens + n_tokens > max_tokens:
            chunks.append(current.strip())
            current, current_tokens = piece, n_tokens
        elif current:
            current = _join(current, piece)
            current_tokens = count(current)  # recounted: a join can merge tokens
        else:
            current, current_tokens = piece, n_tokens
    if current:
        chunks.append(current.strip())
    return chunks if len(chunks) > 1 else [text]


def pause_after(chunk_text):
    """Silence in seconds after a chunk that is not the last (CJK without spaces = one word)."""
    n_words = len(chunk_text.split())
    return (
        SHORT_CHUNK_PAUSE_SECONDS if n_words <= SHORT_CHUNK_MAX_WORDS else LONG_CHUNK_PAUSE_SECONDS
    )


def pause_samples(chunk_text, sample_rate):
    """`pause_after` as a sample count: round(sample_rate × seconds)."""
    return max(0, round(sample_rate * pause_after(chunk_text)))
