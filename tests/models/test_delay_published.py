"""The published llama.cpp layout (models/delay_published.py), written by the `gguf` package in
that layout (fixtures.make_delay.write_published_layout): loaded as it is, it gives the model
of the f16-rounded weights — forward and greedy generation against the float64 reference."""

import numpy as np
import pytest

from fixtures.compare import assert_close
from fixtures.make_delay import make_state, make_tokenizer_json, tiny_config, write_published_layout
from fixtures.reference import delay as ref
from moss_tts.errors import ModelFileError
from moss_tts.models.delay_published import is_published_dir, load_published
from moss_tts.models.delay_tts import DelayTTS
from moss_tts.sampling import DelaySamplingOptions

from .test_delay import prompt_rows

# f16 weights: the matmuls round activations to f16 (rel. 2^-11) against the float64
# reference of the same f16-rounded weights; through 2 blocks measured ≤ 2e-3 on |h| ≲ 4
F16_ATOL = 1e-2
GREEDY = DelaySamplingOptions().greedy()


def f16(state):
    return {n: (a.astype(np.float16).astype(np.float32) if a.ndim == 2 else a)
            for n, a in state.items()}


@pytest.fixture(scope="module")
def published(tmp_path_factory):
    state, cfg = make_state(tiny_config(), 2, 4.0), tiny_config()
    d = write_published_layout(tmp_path_factory.mktemp("published"), state, cfg,
                               make_tokenizer_json())
    model = load_published(d, None)
    yield d, f16(state), cfg, model
    model.close()


def test_config_comes_from_the_llama_cpp_keys_and_the_tables(published):
    d, _, cfg, model = published
    assert is_published_dir(d)
    c = model.config
    assert (c.n_vq, c.audio_vocab_size, c.audio_pad_code, c.vocab_size) == \
        (cfg["n_vq"], cfg["audio_vocab_size"], cfg["audio_vocab_size"],
         cfg["language_config"]["vocab_size"])
    assert c.language_config.num_key_value_heads == 2 and c.language_config.head_dim == 16


def test_forward_and_greedy_generation_match_reference(published):
    _, state, cfg, model = published
    rows = prompt_rows()
    hidden, text, _ = model.forward(rows)
    want_h = ref.hidden(state, cfg, rows)
    assert_close(hidden, want_h, atol=F16_ATOL, what="hidden (published layout)")
    got = model.generate(rows, options=GREEDY, max_new_rows=10)
    np.testing.assert_array_equal(got, ref.generate_greedy(state, cfg, rows, 10))


def test_the_published_directory_serves_delay_tts(published):
    """Its tokenizer/tokenizer.json builds the prompts (the codec is loaded separately)."""
    with DelayTTS.load(published[0], threads=1) as tts:     # a directory, not a GGUF
        rows = tts.plan("Hello.")
        assert rows[0, 0] == tts.config.im_start_token_id      # ends at assistant\n (HF)
        assert list(rows[-3:, 0]) == [tts.config.im_start_token_id] + \
            tts.tokenizer.encode("assistant\n")


def test_missing_tables_or_two_ggufs_raise_model_file_error(published, tmp_path):
    d = published[0]
    (tmp_path / "embeddings").mkdir()
    (tmp_path / "lm_heads").mkdir()
    (tmp_path / "x.gguf").write_bytes((d / "MOSS_TTS_F16.gguf").read_bytes())
    with pytest.raises(ModelFileError, match="no embeddings/emb_ext_00.npy"):
        load_published(tmp_path)
    (tmp_path / "y.gguf").write_bytes(b"GGUF")
    with pytest.raises(ModelFileError, match="expected one backbone .gguf, found 2"):
        load_published(tmp_path)
