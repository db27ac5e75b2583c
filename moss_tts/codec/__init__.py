"""MOSS-Audio-Tokenizer codecs: stage towers from GGUF metadata, the RLFQ quantizer, encode /
decode / partial decode / exact streaming decode."""

from .codec import Codec, StreamDecoder
from .config import CodecConfig, StageConfig

__all__ = ["Codec", "StreamDecoder", "CodecConfig", "StageConfig"]
