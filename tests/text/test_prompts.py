import numpy as np
import pytest

from moss_tts.errors import ConfigError, InputError
from moss_tts.text import prompts
from moss_tts.text.prompts import (
    NanoPromptIds,
    after_reference_ids,
    assistant_prefix_ids,
    build_rows,
    user_prefix_ids,
)

IDS = NanoPromptIds()
PAD, N_VQ = 1024, 16

# docs/upstream-notes.md §nano-5.2: the real tokenizer's ids for each template segment (decoded from
# the official tokenizer dump). A segment-keyed fake proves that every segment is encoded on its
# own.
REAL_SEGMENT_IDS = {
    prompts.USER_ROLE: [600, 289],
    prompts.REFERENCE_OPENER: [10356, 13, 10356, 10425, 1860, 4546, 12907, 10363, 13325, 11492],
    prompts.USER_CLOSER: [10356, 14],
    prompts.ASSISTANT_TURN_SEPARATOR: [],
    prompts.ASSISTANT_ROLE: [8165, 430],
}
REAL_P_USER = [4, 600, 289, 10356, 13, 10356, 10425, 1860, 4546, 12907, 10363, 13325, 11492]
REAL_P_ASST = [10356, 14, 5, 4, 8165, 430]
ONNX_MANIFEST_USER_PREFIX = [
    600,
    289,
    10356,
    13,
    10356,
    10425,
    1860,
    4546,
    12907,
    10363,
    13325,
    11492,
]


class SegmentTokenizer:
    """Encodes only whole template segments (KeyError otherwise) and logs every call."""

    def __init__(self, table):
        self.table, self.calls = table, []

    def encode(self, text, sanitize_specials=False):
        self.calls.append(text)
        return list(self.table[text])


def test_real_ids_give_the_official_user_and_assistant_blocks():
    tok = SegmentTokenizer(REAL_SEGMENT_IDS)
    assert user_prefix_ids(tok) == REAL_P_USER
    assert assistant_prefix_ids(tok) == REAL_P_ASST
    assert user_prefix_ids(tok, onnx_manifest_form=True) == ONNX_MANIFEST_USER_PREFIX


HEAD_SEGMENTS = [prompts.USER_ROLE, prompts.REFERENCE_OPENER]
TAIL_SEGMENTS = [prompts.USER_CLOSER, prompts.ASSISTANT_TURN_SEPARATOR, prompts.ASSISTANT_ROLE]
TWO_FRAMES = np.zeros((2, N_VQ), np.int64)


@pytest.mark.parametrize(
    "mode, kwargs, segments",
    [
        (
            "voice_clone",
            {"reference_codes": TWO_FRAMES},
            HEAD_SEGMENTS + [prompts.AFTER_REFERENCE, "TEXT"] + TAIL_SEGMENTS,
        ),
        (
            "continuation",
            {},
            HEAD_SEGMENTS + ["None", prompts.AFTER_REFERENCE, "TEXT"] + TAIL_SEGMENTS,
        ),
        (
            "continuation",
            {"prompt_text": "PROMPT ", "prompt_codes": TWO_FRAMES},
            HEAD_SEGMENTS + ["None", prompts.AFTER_REFERENCE, "PROMPT TEXT"] + TAIL_SEGMENTS,
        ),
    ],
)
def test_each_template_segment_is_encoded_separately_in_upstream_order(mode, kwargs, segments):
    table = {s: [] for s in segments}
    tok = SegmentTokenizer(table)
    build_rows(tok, "TEXT", mode=mode, **kwargs)
    assert tok.calls == segments


def test_segmentwise_encoding_differs_from_whole_string_encoding(tiny_tokenizer):
    whole = tiny_tokenizer.encode("\n</user_inst><|im_end|>\n<|im_start|>assistant\n")
    segmentwise = assistant_prefix_ids(tiny_tokenizer)
    assert whole != segmentwise
    # Its own segment gives "assistant" a leading ▁; inline after <|im_start|> it has none.
    tail = segmentwise[segmentwise.index(4) + 1 :]
    assert tail == tiny_tokenizer.encode("assistant\n")
    assert tiny_tokenizer.id_to_piece(tail[0]).startswith("▁")


def _codes(rng, n_frames):
    return rng.integers(0, 1024, size=(n_frames, N_VQ))


def _assert_text_rows(rows, ids):
    assert rows[:, 0].tolist() == list(ids)
    assert (rows[:, 1:] == PAD).all()


def test_voice_clone_rows_layout(tiny_tokenizer, rng):
    ref = _codes(rng, 5)
    text = "今天天气很好, the speaker reads."
    rows = build_rows(tiny_tokenizer, text, mode="voice_clone", reference_codes=ref)
    p_user = user_prefix_ids(tiny_tokenizer)
    p_after = after_reference_ids(tiny_tokenizer)
    p_asst = assistant_prefix_ids(tiny_tokenizer)
    enc = tiny_tokenizer.encode(text)
    assert rows.dtype == np.int32 and rows.shape[1] == N_VQ + 1
    assert rows.shape[0] == len(p_user) + 1 + 5 + 1 + len(p_after) + len(enc) + len(p_asst) + 1

    head, audio = len(p_user) + 1, slice(len(p_user) + 1, len(p_user) + 6)
    _assert_text_rows(rows[:head], p_user + [6])
    assert rows[0].tolist() == [4] + [PAD] * N_VQ
    assert (rows[audio, 0] == 8).all() and (rows[audio, 1:] == ref).all()
    _assert_text_rows(rows[audio.stop :], [7] + p_after + enc + p_asst + [6])
    assert rows[-1].tolist() == [6] + [PAD] * N_VQ
    # Specials at their places: <user_inst> and </user_inst>, one <|im_end|>, two <|im_start|>.
    column = rows[:, 0].tolist()
    assert column.count(13) == column.count(14) == column.count(5) == 1
    assert column.count(4) == 2 and column.count(6) == 2 and column.count(7) == 1


def test_plain_continuation_rows_layout(tiny_tokenizer):
    text = "ni hao shi jie"
    rows = build_rows(tiny_tokenizer, text, mode="continuation")
    expected = (
        user_prefix_ids(tiny_tokenizer)
        + tiny_tokenizer.encode("None")
        + after_reference_ids(tiny_tokenizer)
        + tiny_tokenizer.encode(text)
        + assistant_prefix_ids(tiny_tokenizer)
        + [6]
    )
    _assert_text_rows(rows, expected)
    assert rows[0].tolist() == [4] + [PAD] * N_VQ and rows[-1].tolist() == [6] + [PAD] * N_VQ
    assert not (rows[:, 0] == 8).any() and not (rows[:, 0] == 9).any()


def test_continuation_with_prompt_appends_assistant_slot_frames(tiny_tokenizer, rng):
    codes = _codes(rng, 4)
    codes[:, 12:] = PAD  # codebooks beyond nq are carried as the pad
    rows = build_rows(
        tiny_tokenizer,
        "the dog ran.",
        mode="continuation",
        prompt_text="The cat sat.",
        prompt_codes=codes,
    )
    plain = build_rows(tiny_tokenizer, "The cat sat.the dog ran.", mode="continuation")
    # prompt_text + text are joined with no separator, then [6], then the prompt frames (slot 9).
    assert (rows[: len(plain)] == plain).all()
    assert rows.shape[0] == len(plain) + 4
    assert (rows[-4:, 0] == 9).all() and (rows[-4:, 1:] == codes).all()


def test_onnx_manifest_form_drops_only_the_leading_im_start(tiny_tokenizer, rng):
    ref = _codes(rng, 3)
    hf = build_rows(tiny_tokenizer, "hello", reference_codes=ref)
    onnx = build_rows(tiny_tokenizer, "hello", reference_codes=ref, onnx_manifest_form=True)
    assert hf[0, 0] == 4 and (hf[1:] == onnx).all()


def test_ids_come_from_the_config(tiny_tokenizer, rng):
    ids = NanoPromptIds(audio_pad_token_id=2048, n_vq=4, audio_user_slot_token_id=10)
    ref = rng.integers(0, 2048, size=(3, 4))
    rows = build_rows(tiny_tokenizer, "hello", reference_codes=ref, ids=ids)
    assert rows.shape[1] == 5 and rows[0].tolist() == [4, 2048, 2048, 2048, 2048]
    assert (rows[rows[:, 0] == 10, 1:] == ref).all()


def test_specials_in_user_text_never_become_control_ids(tiny_tokenizer, rng):
    ref = _codes(rng, 2)
    injected = build_rows(tiny_tokenizer, "hi<|audio_end|>there", reference_codes=ref)
    plain = build_rows(tiny_tokenizer, "hithere", reference_codes=ref)
    assert (injected[:, 0] == 7).sum() == 1  # only the template's <|audio_end|>
    assert (injected[:, 0] == 13).sum() == 1  # the template's own <user_inst> stays
    assert np.array_equal(injected, plain)


BAD_CALLS = [
    ({"mode": "voice_clone"}, "needs reference codes"),
    ({"mode": "voice_clone", "reference_codes": "REF", "prompt_text": "p"}, "takes no prompt"),
    ({"mode": "voice_clone", "reference_codes": "REF", "prompt_codes": "REF"}, "takes no prompt"),
    ({"mode": "continuation", "prompt_text": "p"}, "together, or neither"),
    ({"mode": "continuation", "prompt_codes": "REF"}, "together, or neither"),
    ({"mode": "continuation", "reference_codes": "REF"}, "not reference codes"),
    ({"mode": "clone"}, "unknown mode"),
    ({"mode": "continuation", "prompt_text": "  ", "prompt_codes": "REF"}, "prompt text is empty"),
    ({"reference_codes": np.zeros((0, N_VQ), np.int64)}, r"shape \[frames >= 1, 16\]"),
    ({"reference_codes": np.zeros((3, 8), np.int64)}, r"got \[3, 8\]"),
    ({"reference_codes": np.full((3, N_VQ), 1025)}, r"\[0, 1024\]"),
    ({"reference_codes": np.full((3, N_VQ), -1)}, r"\[0, 1024\]"),
    ({"reference_codes": np.zeros((3, N_VQ), np.float32)}, "must be integers"),
    (
        {"mode": "continuation", "prompt_text": "p", "prompt_codes": [[1, 2]]},
        "prompt codes must have shape",
    ),
]


@pytest.mark.parametrize("kwargs, message", BAD_CALLS)
def test_bad_prompt_inputs_raise_one_line_input_errors(tiny_tokenizer, kwargs, message):
    kwargs = {
        k: (np.ones((2, N_VQ), np.int64) if isinstance(v, str) and v == "REF" else v)
        for k, v in kwargs.items()
    }
    with pytest.raises(InputError, match=message) as info:
        build_rows(tiny_tokenizer, "hello", **kwargs)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("text", ["", "  \n\t", None])
def test_empty_text_raises_input_error(tiny_tokenizer, text):
    with pytest.raises(InputError, match="text is empty"):
        build_rows(tiny_tokenizer, text, mode="continuation")


def test_config_with_no_codebooks_is_rejected():
    with pytest.raises(ConfigError, match="n_vq"):
        NanoPromptIds(n_vq=0)
