"""User text that spells control tokens never yields control ids in a Nano prompt, with text
normalization on or off, in every prompt mode (text/specials.py)."""

import numpy as np
import pytest

from moss_tts.models.nano_tts import Reference
from moss_tts.text.specials import neutralize_specials


def spellings(tok):
    """Every special piece of the tokenizer, plain, NFKC-disguised and split by another."""
    pieces = tok.special_pieces
    full_width = [p.replace("<", "＜").replace(">", "＞").replace("|", "｜") for p in pieces]
    nested = [p[:3] + pieces[0] + p[3:] for p in pieces]
    return " ".join(["Say", *pieces, *full_width, *nested, "please."])


@pytest.mark.parametrize("normalize", [True, False])
@pytest.mark.parametrize("mode", ["continuation", "voice_clone"])
def test_user_text_with_every_special_spelling_gives_no_control_ids(nano_tts, normalize, mode):
    tts = nano_tts()
    tok = tts.tokenizer
    control = {tok.piece_to_id(p) for p in tok.special_pieces}
    assert {tts.config.im_end_token_id, tts.config.audio_start_token_id} <= control
    reference = Reference(np.zeros((3, tts.config.n_vq), np.int32)) if mode == "voice_clone" \
        else None
    text = spellings(tok)
    assert control <= set(tok.encode(text))   # unguarded, the text would inject every one

    carried = Reference(np.zeros((3, tts.config.n_vq), np.int32))

    def control_counts(t):
        """Per utterance (long text is cut into several); a continuation chunk after the first
        is prompted by the chunk before it and its codes, as generation builds it."""
        plan = tts.plan(t, reference=reference, normalize=normalize)
        counts = []
        for i, (chunk, rows) in enumerate(plan):
            if rows is None:
                rows = tts.prompt_rows(chunk, prompt_text=plan[i - 1][0], prompt=carried)
            counts.append({c: int((rows[:, 0] == c).sum()) for c in control})
        return counts

    first, = control_counts("Say please.")   # the template's own control ids
    later = first if reference is not None else \
        {c: int((tts.prompt_rows("Say please.", prompt_text="Say please.", prompt=carried)[:, 0]
                 == c).sum()) for c in control}
    got = control_counts(text)
    assert got == [first] + [later] * (len(got) - 1)

def test_neutralize_specials_takes_any_tokenizers_pieces():
    pieces = ["<|im_end|>", "<|endoftext|>", "<|audio_pad|>"]   # e.g. a tokenizer.json's
    assert neutralize_specials("a<|im_<|endoftext|>end|>b＜|audio_pad|＞c", pieces) == "abc"
    assert neutralize_specials("plain <tag> text", pieces) == "plain <tag> text"
