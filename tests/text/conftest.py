import pytest

from fixtures.make_spm import make_tiny_spm
from moss_tts.text.tokenizer import SentencePieceTokenizer


@pytest.fixture(scope="session")
def tiny_spm_bytes():
    """The tiny BPE model with the real Nano special ids (trained in memory, ~0.1 s)."""
    return make_tiny_spm()


@pytest.fixture(scope="session")
def tiny_tokenizer(tiny_spm_bytes):
    return SentencePieceTokenizer.from_bytes(tiny_spm_bytes, source="tiny-spm")
