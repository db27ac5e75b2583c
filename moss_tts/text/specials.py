"""Neutralizing control-token spellings in user text, for every tokenizer family.

Tokenizers match their special pieces (`<|im_end|>`, `<|audio_start|>`, ...) literally inside
raw text, also after NFKC folding (`＜|im_end|＞`), so user text could inject control ids into a
prompt. Prompt builders pass user text through `neutralize_specials` with the tokenizer's list
of special spellings (SentencePiece user-defined pieces; a tokenizer.json's added tokens).
"""

import unicodedata


def _remove_pieces(text, pieces):
    # Repeat: removing one piece can join two fragments into another ("<|im_<|im_end|>end|>").
    previous = None
    while previous != text:
        previous = text
        for piece in pieces:
            text = text.replace(piece, "")
    return text


def neutralize_specials(text, pieces):
    """`text` without any of `pieces`, also those that appear only after NFKC folding.

    Longer pieces go first, so a piece that contains another is removed whole. The text is
    returned NFKC-folded only when folding revealed a piece; a tokenizer's NFKC normalizer
    folds it the same way anyway.
    """
    order = sorted(pieces, key=len, reverse=True)
    text = _remove_pieces(text, order)
    folded = unicodedata.normalize("NFKC", text)
    if any(piece in folded for piece in order):
        text = _remove_pieces(folded, order)
    return text
