"""SentencePiece text tokenizer (MOSS-TTS-Nano `tokenizer.model`; docs/upstream-notes.md §nano-6).

Follows upstream `onnx_tts_runtime.py` `encode_text` (plain `SentencePieceProcessor.encode`, no
BOS/EOS), which gives the same ids as the HF `tokenization_moss_tts_nano.py` wrapper with
`add_special_tokens=False` for ordinary text.

User-defined pieces (`<|im_start|>`, `<user_inst>`, ...) match literally inside raw text, also
after NFKC folding (`＜|im_end|＞`), so user text can produce control ids. Upstream does not guard
against that; `encode(text, sanitize_specials=True)` strips those pieces from the text first
(text/specials.py), and the prompt builders always ask for it on user text.
"""

from pathlib import Path

import sentencepiece as spm

from moss_tts.errors import InputError, ModelFileError
from moss_tts.text.specials import neutralize_specials

# sentencepiece_model.proto: ModelProto.pieces = 1; SentencePiece.piece = 1, .type = 3;
# Type.NORMAL = 1 (the proto2 default when the field is absent), Type.USER_DEFINED = 4.
_FIELD_PIECES, _FIELD_PIECE, _FIELD_TYPE = 1, 1, 3
_TYPE_NORMAL, _TYPE_USER_DEFINED = 1, 4


def _read_varint(buf, pos):
    value, shift = 0, 0
    while True:
        if pos >= len(buf) or shift > 63:
            raise ValueError("truncated varint")
        byte = buf[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return value, pos


def _proto_fields(buf):
    """Yield (field number, wire type, value) of one protobuf message, top level only."""
    pos = 0
    while pos < len(buf):
        key, pos = _read_varint(buf, pos)
        field, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = _read_varint(buf, pos)
        elif wire == 1:
            value, pos = buf[pos : pos + 8], pos + 8
        elif wire == 2:
            size, pos = _read_varint(buf, pos)
            value, pos = buf[pos : pos + size], pos + size
        elif wire == 5:
            value, pos = buf[pos : pos + 4], pos + 4
        else:
            raise ValueError(f"unsupported protobuf wire type {wire}")
        if pos > len(buf):
            raise ValueError("truncated field")
        yield field, wire, value


def user_defined_pieces(model_proto):
    """The user-defined pieces of a serialized SentencePiece model, in id order.

    sentencepiece's Python API has no `is_user_defined`, and protobuf is not a dependency, so
    the piece table is read from the wire format directly.
    """
    pieces = []
    for field, wire, entry in _proto_fields(memoryview(model_proto)):
        if field != _FIELD_PIECES or wire != 2:
            continue
        text, kind = None, _TYPE_NORMAL
        for sub_field, sub_wire, value in _proto_fields(entry):
            if sub_field == _FIELD_PIECE and sub_wire == 2:
                text = bytes(value).decode("utf-8")
            elif sub_field == _FIELD_TYPE and sub_wire == 0:
                kind = value
        if kind == _TYPE_USER_DEFINED and text:
            pieces.append(text)
    return tuple(pieces)


class SentencePieceTokenizer:
    """Text → ids with a SentencePiece model; no BOS/EOS is ever added.

    >>> tok = SentencePieceTokenizer.from_file("tokenizer.model")  # doctest: +SKIP
    >>> tok.encode("hello")  # doctest: +SKIP
    [...]
    """

    def __init__(self, processor, special_pieces, source):
        self._sp = processor
        self.source = source
        self.special_pieces = tuple(special_pieces)

    @classmethod
    def from_bytes(cls, model_bytes, *, source="<bytes>"):
        """Load a serialized model (bytes, bytearray, memoryview or a uint8 numpy array)."""
        try:
            proto = memoryview(model_bytes).tobytes()  # bytes(int) would make zeros, not fail
        except TypeError as exc:
            raise ModelFileError(
                f"tokenizer model from {source}: expected bytes, got {type(model_bytes).__name__}"
            ) from exc
        if not proto:
            raise ModelFileError(f"tokenizer model from {source} is empty")
        try:
            processor = spm.SentencePieceProcessor(model_proto=proto)
            specials = user_defined_pieces(proto)
        except (RuntimeError, ValueError, UnicodeDecodeError) as exc:
            first_line = (
                str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            )
            raise ModelFileError(
                f"tokenizer model from {source} is not a SentencePiece model "
                f"({len(proto)} bytes): {first_line}"
            ) from exc
        return cls(processor, specials, source)

    @classmethod
    def from_file(cls, path):
        """Load `tokenizer.model` from disk."""
        path = Path(path)
        try:
            data = path.read_bytes()
        except OSError as exc:
            raise ModelFileError(
                f"cannot read tokenizer model {path}: {exc.strerror or exc}"
            ) from exc
        return cls.from_bytes(data, source=str(path))

    @property
    def vocab_size(self):
        return int(self._sp.get_piece_size())

    def piece_to_id(self, piece):
        """Id of `piece`; a piece the model does not have raises `ModelFileError`."""
        token_id = int(self._sp.piece_to_id(piece))
        if self._sp.id_to_piece(token_id) != piece:
            raise ModelFileError(f"tokenizer model {self.source} has no piece {piece!r}")
        return token_id

    def id_to_piece(self, token_id):
        if not 0 <= int(token_id) < self.vocab_size:
            raise InputError(
                f"token id {token_id} is outside the vocabulary [0, {self.vocab_size})"
            )
        return str(self._sp.id_to_piece(int(token_id)))

    def strip_special_pieces(self, text):
        """`text` without any user-defined piece, also those that appear only after NFKC folding
        (`neutralize_specials`)."""
        return neutralize_specials(_check_text(text), self.special_pieces)

    def encode(self, text, *, sanitize_specials=False):
        """Ids of `text` (`add_special_tokens=False` semantics: no BOS/EOS).

        A whitespace-only string encodes to `[]`. With `sanitize_specials`, user-defined pieces
        are removed from the text first (upstream never does this).
        """
        text = _check_text(text)
        if sanitize_specials:
            text = self.strip_special_pieces(text)
        return [int(i) for i in self._sp.encode(text, out_type=int)]

    def encode_pieces(self, text):
        """Piece strings of `text` (for debugging and tests)."""
        return [str(p) for p in self._sp.encode(_check_text(text), out_type=str)]

    def __repr__(self):
        return f"SentencePieceTokenizer(source={self.source!r}, vocab_size={self.vocab_size})"


def _check_text(text):
    if not isinstance(text, str):
        raise InputError(f"text must be a str, got {type(text).__name__}")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InputError(
            f"text is not valid Unicode: unpaired surrogate {text[exc.start]!r} "
            f"at index {exc.start}"
        ) from exc
    return text
