"""MOSS-Audio-Tokenizer codecs: stage towers from GGUF metadata, the RLFQ quantizer, encode /
decode / partial decode / exact streaming decode."""

from .codec import Codec, StreamDecoder
from .stream_batch import StreamBatch, StreamSlot
from .config import CodecConfig, StageConfig

__all__ = ["Codec", "StreamDecoder", "StreamBatch", "StreamSlot", "CodecConfig", "StageConfig"]
