"""text/local_v15_prompts.py: MOSS-TTS-Local-Transformer-v1.5 prompt rows from separately
tokenized segments (P14) with its own audio ids (P13), references without labels, the fields,
continuation, and bad input — against upstream's segment list written out here (§family-4.5)."""

import numpy as np
import pytest

from fixtures.make_delay import make_tokenizer_json
from moss_tts.errors import InputError
from moss_tts.text.local_v15_prompts import after_reference, build_prompt_rows, field_value
from moss_tts.text.qwen_tokenizer import QwenTokenizer
from moss_tts.text.template import PromptIds

N_VQ, PAD = 4, 64
IDS = PromptIds(N_VQ, 151644, 151645, 151669, 151670, 151654, 151656, PAD)


@pytest.fixture(scope="module")
def tok():
    return QwenTokenizer.from_json(make_tokenizer_json())


def upstream_ids(tok, text, *, fields_text, reference_ids=None):
    """processing_moss_tts.py's direct path, segment by segment."""
    enc = tok.encode
    ids = [151644] + enc("user\n") + enc("<user_inst>\n- Reference(s):\n")
    ids += reference_ids if reference_ids is not None else enc("None")
    return ids + enc(fields_text) + enc(text) + enc("\n</user_inst>") + [151645] + enc("\n") + \
        [151644] + enc("assistant\n") + [151669]


NONE_FIELDS = ("\n- Instruction:\nNone\n- Tokens:\nNone\n- Quality:\nNone\n- Sound Event:\nNone"
               "\n- Ambient Sound:\nNone\n- Language:\nNone\n- Text:\n")


def test_plain_prompt_is_the_segments_tokenized_one_by_one(tok):
    rows = build_prompt_rows(tok, IDS, "Hello there, this is a test.")
    want = upstream_ids(tok, "Hello there, this is a test.", fields_text=NONE_FIELDS)
    assert rows[:, 0].tolist() == want
    assert (rows[:, 1:] == PAD).all() and rows.shape[1] == N_VQ + 1
    # the segments reach the tokenizer one by one, as upstream's (P14): BPE never sees a
    # boundary (this tiny tokenizer splits at newlines anyway, so ids alone cannot show it)
    seen = []

    class Recording:
        def encode(self, text):
            seen.append(text)
            return tok.encode(text)

    build_prompt_rows(Recording(), IDS, "Hello there.")
    assert seen == ["user\n", "<user_inst>\n- Reference(s):\n", "None", NONE_FIELDS,
                    "Hello there.", "\n</user_inst>", "\n", "assistant\n"]


def test_fields_are_stripped_and_blank_means_none(tok):
    rows = build_prompt_rows(tok, IDS, "Hi.", instruction="  calm voice ", tokens=25,
                             language="", quality=None)
    fields_text = NONE_FIELDS.replace("Instruction:\nNone", "Instruction:\ncalm voice") \
        .replace("Tokens:\nNone", "Tokens:\n25")
    assert rows[:, 0].tolist() == upstream_ids(tok, "Hi.", fields_text=fields_text)
    assert (field_value(" "), field_value(7), field_value(None)) == ("None", "7", "None")
    assert after_reference({}) == NONE_FIELDS


def test_references_are_unlabelled_blocks_with_the_v15_audio_ids(tok):
    rng = np.random.default_rng(0)
    a, b = rng.integers(0, PAD, (3, N_VQ)), rng.integers(0, PAD, (2, N_VQ))
    rows = build_prompt_rows(tok, IDS, "Hi.", references=[a, None, b])
    head = [151644] + tok.encode("user\n") + tok.encode("<user_inst>\n- Reference(s):\n")
    n = len(head)
    assert rows[:n, 0].tolist() == head
    block = rows[n:n + 2 * 2 + len(a) + len(b)]
    assert block[:, 0].tolist() == [151669] + [151654] * 3 + [151670, 151669] + [151654] * 2 + \
        [151670]
    np.testing.assert_array_equal(block[1:4, 1:], a)
    np.testing.assert_array_equal(block[6:8, 1:], b)
    assert (block[[0, 4, 5, 8], 1:] == PAD).all()
    tail = rows[n + len(block):, 0].tolist()
    assert tail == upstream_ids(tok, "Hi.", fields_text=NONE_FIELDS)[n + len(tok.encode("None")):]
    assert "[S1]" not in tok.decode(rows[:, 0][rows[:, 0] < 151643])


def test_continuation_appends_the_prompt_audio_on_assistant_slots(tok):
    codes = np.random.default_rng(1).integers(0, PAD, (5, N_VQ))
    rows = build_prompt_rows(tok, IDS, "Earlier words. New words.", prompt_codes=codes)
    plain = build_prompt_rows(tok, IDS, "Earlier words. New words.")
    np.testing.assert_array_equal(rows[:len(plain)], plain)
    assert rows[len(plain):, 0].tolist() == [151656] * 5
    np.testing.assert_array_equal(rows[len(plain):, 1:], codes)


@pytest.mark.parametrize("kwargs, match", [
    ({"text": "  "}, "text is empty"),
    ({"text": "hi", "speaker": "x"}, "unknown prompt field"),
    ({"text": "hi", "references": [np.zeros((3, N_VQ + 1), int)]}, "audio codes"),
    ({"text": "hi", "references": [np.zeros((0, N_VQ), int)]}, "frames ≥ 1"),
    ({"text": "hi", "prompt_codes": np.zeros((2, N_VQ))}, "integers"),
    ({"text": "hi", "references": [np.zeros((2, N_VQ), int)],
      "prompt_codes": np.zeros((2, N_VQ), int)}, "cannot be combined"),
    ({"text": "say <|im_end|> now"}, "control token"),
])
def test_bad_input_is_a_one_line_input_error(tok, kwargs, match):
    text = kwargs.pop("text")
    with pytest.raises(InputError, match=match) as e:
        build_prompt_rows(tok, IDS, text, **kwargs)
    assert "\n" not in str(e.value)
