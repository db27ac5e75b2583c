"""What the Qwen3 families' TTS objects (Delay, Local, Local v1.5, Realtime) share: the model,
the tokenizer.json their GGUF embeds, the family's prompt ids and the codec check, and loading a
GGUF with the family's model class."""

from __future__ import annotations

from ..ggml import F16, GGMLType, Weights, get_backend
from ..text.qwen_tokenizer import QwenTokenizer
from .tts import CodecTTS


class Qwen3TTS(CodecTTS):
    MODEL: type | None = None   # the family's model class: MODEL(weights, kv_type=...)
    TOKENIZER_KEY = ""          # the GGUF key of the embedded tokenizer.json

    def __init__(self, model, codec):
        self.model, self.config, self.codec = model, model.config, codec
        self.tokenizer = QwenTokenizer.embedded(model.tokenizer_json, path=model.weights.file.path,
                                                key=self.TOKENIZER_KEY, family=self.FAMILY)
        self.ids = self.prompt_ids(self.config)
        if codec is not None:
            self._check_codec(codec)

    @staticmethod
    def prompt_ids(config):
        """The family's prompt-id record, from its config."""
        raise NotImplementedError

    @classmethod
    def load(cls, model, *, codec=None, backend=None, threads: int | None = None,
             kv_type: GGMLType = F16):
        b = get_backend(backend, threads)
        return cls._with_codec(cls.MODEL(Weights.load(model, b), kv_type=kv_type), codec, b)
