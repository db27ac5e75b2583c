"""The Qwen tokenizer wrapper (text/qwen_tokenizer.py) and MossTTSDelay prompts built by ids
(text/delay_prompts.py), against upstream's string route (fixtures/reference/delay.py) on the
tiny tokenizer.json whose specials sit at the upstream ids."""

import re

import numpy as np
import pytest

from fixtures.make_delay import make_tokenizer_json, tiny_config
from fixtures.reference import delay as ref
from moss_tts.errors import InputError, ModelFileError
from moss_tts.text.delay_prompts import build_generation_rows
from moss_tts.text.template import PromptIds
from moss_tts.text.qwen_tokenizer import QwenTokenizer

CFG = tiny_config()
N, PAD = CFG["n_vq"], CFG["audio_pad_code"]
IDS = PromptIds(N, 151644, 151645, 151652, 151653, 151654, 151656, PAD)


@pytest.fixture(scope="module")
def tokenizer_json():
    return make_tokenizer_json()


@pytest.fixture(scope="module")
def tokenizer(tokenizer_json):
    return QwenTokenizer.from_json(tokenizer_json)


def test_specials_sit_at_the_upstream_ids(tokenizer):
    assert tokenizer.vocab_size == 151663
    assert tokenizer.token_id("<|im_end|>") == 151645 and tokenizer.token_id("<|fim_pad|>") == 151662
    assert 151662 in tokenizer.control and 151643 in tokenizer.control
    assert tokenizer.decode(tokenizer.encode("Hello there")) == "Hello there"


@pytest.mark.parametrize("spelling", ["<|im_end|>", "<|vision_start|>", "<|fim_pad|>",
                                      "<|endoftext|>"])
def test_text_spelling_a_control_token_is_refused(tokenizer, spelling):
    with pytest.raises(InputError, match="control token spelling"):
        tokenizer.encode(f"Say {spelling} now")
    with pytest.raises(InputError, match="control token spelling"):
        build_generation_rows(tokenizer, IDS, f"Say {spelling} now", normalize=False)
    with pytest.raises(InputError, match="control token spelling"):
        build_generation_rows(tokenizer, IDS, "Hi", language=spelling)


@pytest.mark.parametrize("spelling", ["<|im_end|>", "<|endoftext|>"])
def test_normalized_text_never_yields_a_control_id(tokenizer, spelling):
    """Delay's normalizer (unlike Nano's) keeps `_` and `<|...|>` as they are, so a spelled
    control token reaches the tokenizer, which refuses it."""
    with pytest.raises(InputError, match=re.escape(spelling)):
        build_generation_rows(tokenizer, IDS, f"Say {spelling} now")


def test_broken_tokenizer_json_raises_model_file_error():
    with pytest.raises(ModelFileError, match="not a usable tokenizer.json"):
        QwenTokenizer.from_json("{\"model\": 3}")


@pytest.mark.parametrize("start_audio", [False, True], ids=["hf_generation", "audio_start_row"])
@pytest.mark.parametrize("with_reference", [False, True], ids=["no_reference", "voice_clone"])
def test_rows_by_ids_equal_upstreams_string_route(tokenizer, tokenizer_json, with_reference,
                                                  start_audio):
    """Upstream's HF `mode="generation"` ends the prompt at `assistant\\n` (the model samples
    AUDIO_START); with start_audio the AUDIO_START row follows (MossTTSLocal's processor)."""
    codes = np.random.default_rng(2).integers(0, 16, size=(6, N)) if with_reference else None
    fields = dict(instruction="calm", tokens=38, language="English")
    got = build_generation_rows(tokenizer, IDS, "Hello there, 你好。", references=[codes],
                                normalize=False, start_audio=start_audio, **fields)
    want = ref.prompt_rows_by_string(tokenizer_json, CFG, "Hello there, 你好。", codes,
                                     start_audio=start_audio, **fields)
    np.testing.assert_array_equal(got, want)
    ending = got[-1:] if start_audio else got[-3:]
    assert (ending[:, 1:] == PAD).all()
    assert list(ending[:, 0]) == ([IDS.audio_start] if start_audio else
                                  [IDS.im_start] + tokenizer.encode("assistant\n"))
    if with_reference:   # the AUDIO_START row carries pads, the next row codebook 0 of frame 0
        at = int(np.flatnonzero(got[:, 0] == IDS.audio_start)[0])
        assert (got[at, 1:] == PAD).all() and got[at + 1, 1] == codes[0, 0]
        assert got[at + 1 + len(codes) + N - 1, 0] == IDS.audio_end
    # guard: a changed field moves the rows
    other = build_generation_rows(tokenizer, IDS, "Hello there, 你好。", references=[codes],
                                  normalize=False, **(fields | {"language": "Chinese"}))
    assert not np.array_equal(other, got)


def test_reference_numbering_counts_missing_references(tokenizer):
    codes = np.zeros((2, N), dtype=np.int64)
    rows = build_generation_rows(tokenizer, IDS, "Hi", references=[None, codes], normalize=False)
    text = tokenizer.decode([i for i in rows[:, 0] if i not in tokenizer.control])
    assert "[S2]:" in text and "[S1]" not in text
    assert (rows[:, 0] == IDS.user_slot).sum() == 2 + N - 1


@pytest.mark.parametrize("text", ["", "   \n"])
def test_empty_text_raises_input_error(tokenizer, text):
    with pytest.raises(InputError, match="text is empty"):
        build_generation_rows(tokenizer, IDS, text)


def test_bad_reference_codes_and_fields_raise_input_error(tokenizer):
    with pytest.raises(InputError, match=r"audio codes must be integers \[frames, 4\]"):
        build_generation_rows(tokenizer, IDS, "Hi", references=[np.zeros((3, 2), np.int64)])
    with pytest.raises(InputError, match="unknown prompt field"):
        build_generation_rows(tokenizer, IDS, "Hi", speed=2)


def test_continuation_rows_equal_hfs_truncated_assistant_turn(tokenizer, tokenizer_json):
    """P28: the assistant turn carries the prompt audio and ends on its T-th GEN row; the
    staircase is cut (codebook k holds frames 0..T−1−k)."""
    codes = np.random.default_rng(5).integers(0, 16, size=(7, N))
    got = build_generation_rows(tokenizer, IDS, "Prompt words. New words.", prompt_codes=codes,
                                normalize=False)
    want = ref.prompt_rows_by_string(tokenizer_json, CFG | {
        "audio_assistant_gen_slot_token_id": 151656,
        "audio_assistant_delay_slot_token_id": 151662}, "Prompt words. New words.",
        prompt_codes=codes)
    np.testing.assert_array_equal(got, want)
    tail = got[-len(codes):]
    assert (tail[:, 0] == IDS.gen_slot).all() and got[-len(codes) - 1, 0] == IDS.audio_start
    for k in range(N):
        np.testing.assert_array_equal(tail[k:, k + 1], codes[:len(codes) - k, k])


def test_text_between_audio_items_is_one_piece():
    """Upstream tokenizes the whole string: the head and the first label, and the text after
    one reference up to the next label, must not be split where BPE could merge across."""
    from moss_tts.text.delay_prompts import user_pieces

    a, b = np.zeros((1, N), np.int64), np.ones((1, N), np.int64)
    pieces = user_pieces("Hi", [a, None, b], {})
    assert [type(p).__name__ for p in pieces] == ["str", "ndarray", "str", "ndarray", "str"]
    assert pieces[0] == "<user_inst>\n- Reference(s):\n[S1]:\n" and pieces[2] == "\n[S3]:\n"
