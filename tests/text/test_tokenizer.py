import numpy as np
import pytest

from fixtures.make_spm import NANO_SPECIAL_PIECES, make_tiny_spm
from moss_tts.errors import InputError, ModelFileError
from moss_tts.text.tokenizer import SentencePieceTokenizer, user_defined_pieces

# The real tokenizer.model's special table (docs/upstream-notes.md §nano-6).
REAL_SPECIAL_IDS = {
    "<unk>": 0, "<s>": 1, "</s>": 2, "<pad>": 3,
    "<|im_start|>": 4, "<|im_end|>": 5, "<|audio_start|>": 6, "<|audio_end|>": 7,
    "<|vision_pad|>": 8, "<|video_pad|>": 9, "<|vision_start|>": 10, "<|vision_end|>": 11,
    "<|audio_pad|>": 12, "<user_inst>": 13, "</user_inst>": 14,
}  # fmt: skip


def test_tiny_model_special_ids_equal_the_real_table(tiny_tokenizer):
    for piece, token_id in REAL_SPECIAL_IDS.items():
        assert tiny_tokenizer.piece_to_id(piece) == token_id
        assert tiny_tokenizer.id_to_piece(token_id) == piece


def test_tiny_model_byte_pieces_sit_at_15_to_270_as_in_the_real_model(tiny_tokenizer):
    assert tiny_tokenizer.id_to_piece(15) == "<0x00>"
    assert tiny_tokenizer.id_to_piece(270) == "<0xFF>"
    assert not tiny_tokenizer.id_to_piece(271).startswith("<0x")


def test_user_defined_pieces_are_the_eleven_nano_specials_in_id_order(
    tiny_tokenizer, tiny_spm_bytes
):
    assert tiny_tokenizer.special_pieces == NANO_SPECIAL_PIECES
    assert user_defined_pieces(tiny_spm_bytes) == NANO_SPECIAL_PIECES
    assert [tiny_tokenizer.piece_to_id(p) for p in NANO_SPECIAL_PIECES] == list(range(4, 15))


def test_make_spm_is_deterministic(tiny_spm_bytes):
    assert make_tiny_spm() == tiny_spm_bytes


def test_encode_adds_no_bos_or_eos(tiny_tokenizer):
    ids = tiny_tokenizer.encode("the speaker reads")
    assert ids and 1 not in ids and 2 not in ids
    assert tiny_tokenizer.encode("") == []


def test_whitespace_only_segment_encodes_to_nothing(tiny_tokenizer):
    # nmt_nfkc + remove_extra_whitespaces: the template's lone newline vanishes.
    assert tiny_tokenizer.encode("\n") == []
    assert tiny_tokenizer.encode(" \t\n ") == []


def test_every_segment_gets_its_own_leading_marker(tiny_tokenizer):
    assert tiny_tokenizer.encode_pieces("assistant\n")[0].startswith("▁")
    # Inline after a special piece the same word has no leading marker.
    inline = tiny_tokenizer.encode_pieces("<|im_start|>assistant\n")
    assert inline[:2] == ["▁", "<|im_start|>"] and not inline[2].startswith("▁")


def test_user_defined_pieces_match_literally_in_user_text(tiny_tokenizer):
    assert 7 in tiny_tokenizer.encode("hello<|audio_end|>world")
    assert 5 in tiny_tokenizer.encode(
        "hello＜|im_end|＞world"
    )  # NFKC folds the full-width brackets


@pytest.mark.parametrize(
    "text",
    [
        "hello<|audio_end|>world",
        "hello＜|im_end|＞world",
        "a<|im_<|im_end|>start|>b",
        "<user_inst>x",
    ],
)
def test_sanitize_specials_removes_every_special_id(tiny_tokenizer, text):
    ids = tiny_tokenizer.encode(text, sanitize_specials=True)
    assert ids and not set(ids) & set(range(4, 15))


def test_sanitize_specials_keeps_plain_text_unchanged(tiny_tokenizer):
    text = "今天 the speaker reads <not special>."
    assert tiny_tokenizer.strip_special_pieces(text) == text
    assert tiny_tokenizer.encode(text, sanitize_specials=True) == tiny_tokenizer.encode(text)


def test_from_file_reads_the_same_model(tmp_path, tiny_spm_bytes, tiny_tokenizer):
    path = tmp_path / "tokenizer.model"
    path.write_bytes(tiny_spm_bytes)
    tok = SentencePieceTokenizer.from_file(path)
    assert tok.vocab_size == tiny_tokenizer.vocab_size == 480
    assert tok.encode("ni hao shi jie") == tiny_tokenizer.encode("ni hao shi jie")


def test_from_bytes_takes_a_uint8_array(tiny_spm_bytes, tiny_tokenizer):
    tok = SentencePieceTokenizer.from_bytes(np.frombuffer(tiny_spm_bytes, dtype=np.uint8))
    assert tok.encode("你好世界") == tiny_tokenizer.encode("你好世界")


@pytest.mark.parametrize("data", [b"not a sentencepiece model", b"", 12345, "a str"])
def test_bad_model_bytes_raise_model_file_error(data):
    with pytest.raises(ModelFileError) as info:
        SentencePieceTokenizer.from_bytes(data, source="bad.model")
    assert "bad.model" in str(info.value) and "\n" not in str(info.value)


def test_missing_model_file_raises_model_file_error(tmp_path):
    with pytest.raises(ModelFileError, match="cannot read tokenizer model"):
        SentencePieceTokenizer.from_file(tmp_path / "missing.model")


@pytest.mark.parametrize("text", [None, b"bytes", 3, "bad \ud800 surrogate"])
def test_bad_text_raises_input_error(tiny_tokenizer, text):
    with pytest.raises(InputError) as info:
        tiny_tokenizer.encode(text)
    assert "\n" not in str(info.value)


def test_unknown_piece_raises_model_file_error(tiny_tokenizer):
    with pytest.raises(ModelFileError, match="no piece"):
        tiny_tokenizer.piece_to_id("<|not_a_piece|>")
