"""converters/delay.py: the tiny upstream-named MossTTSDelay checkpoint (fixtures.make_delay:
bf16 shards + index, tokenizer.json with the specials at their upstream ids) → GGUF: names and
values of every tensor, the stacked audio heads, the learned pad rows (P1), the embedded
tokenizer, --strict, quantization of the matmul weights only, and bad checkpoints."""

import json

import numpy as np
import pytest

from converters.delay import convert
from fixtures.make_delay import AUDIO_VOCAB, make_state, make_tiny_delay_checkpoint, tiny_config
from moss_tts.errors import ConfigError, ModelFileError
from moss_tts.ggml import GGUFFile, Weights
from moss_tts.ggml.types import GGMLType
from moss_tts.models.delay import AUDIO_HEADS, TOKENIZER_KEY, DelayConfig

N_VQ = tiny_config()["n_vq"]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return make_tiny_delay_checkpoint(tmp_path_factory.mktemp("delay") / "hf", seed=1)


@pytest.fixture(scope="module")
def converted(checkpoint, tmp_path_factory):
    return convert(str(checkpoint), tmp_path_factory.mktemp("delay_gguf") / "d.gguf", strict=True)


def make_variant(tmp_path, *, config=None, extra=None, tokenizer=True):
    state = make_state(tiny_config(), 1) | (extra or {})
    out = make_tiny_delay_checkpoint(tmp_path / "v", config=config, state=state)
    if not tokenizer:
        (out / "tokenizer.json").unlink()
    return out


def test_config_and_every_tensor_arrive_under_their_gguf_names(checkpoint, converted):
    state = make_state(tiny_config(), 1)
    with GGUFFile(converted) as f:
        cfg = DelayConfig.from_gguf(f)
        assert f[TOKENIZER_KEY] == (checkpoint / "tokenizer.json").read_text(encoding="utf-8")
    lc = tiny_config()["language_config"]
    assert (cfg.vocab_size, cfg.n_vq, cfg.audio_pad_code, cfg.language_config.head_dim) == \
        (lc["vocab_size"], N_VQ, AUDIO_VOCAB, 16)
    assert cfg.audio_assistant_delay_slot_token_id == 151662
    w = Weights.load(converted)
    try:
        assert sorted(w.names()) == sorted(cfg.tensor_shapes())
        np.testing.assert_array_equal(w.read("token_embd.weight"),
                                      state["language_model.embed_tokens.weight"])
        np.testing.assert_array_equal(w.read("output.weight"), state["lm_heads.0.weight"])
        np.testing.assert_array_equal(w.read("blk.1.attn_k_norm.weight"),
                                      state["language_model.layers.1.self_attn.k_norm.weight"])
        np.testing.assert_array_equal(w.read("blk.0.ffn_down.weight"),
                                      state["language_model.layers.0.mlp.down_proj.weight"])
        heads = np.concatenate([state[f"lm_heads.{k + 1}.weight"] for k in range(N_VQ)])
        np.testing.assert_array_equal(w.read(AUDIO_HEADS), heads)
        for k in range(N_VQ):   # the learned pad row (P1) is kept, not zeroed
            table = w.read(f"emb_ext.{k}.weight")
            np.testing.assert_array_equal(table, state[f"emb_ext.{k}.weight"])
            assert np.abs(table[AUDIO_VOCAB]).sum() > 0
    finally:
        w.close()


def test_q8_0_quantizes_block_linears_and_heads_only(checkpoint, tmp_path):
    out = convert(str(checkpoint), tmp_path / "q.gguf", outtype="q8_0", strict=True)
    with GGUFFile(out) as f:
        types = {n: i.type for n, i in f.tensors.items()}
    assert types["blk.0.attn_q.weight"] == GGMLType.Q8_0 == types[AUDIO_HEADS]
    assert types["output.weight"] == GGMLType.Q8_0
    for name in ("token_embd.weight", "emb_ext.0.weight", "blk.0.attn_norm.weight",
                 "blk.0.attn_q_norm.weight", "output_norm.weight"):
        assert types[name] == GGMLType.F32, name


def test_strict_rejects_an_unknown_key_and_writes_nothing(tmp_path):
    ckpt = make_variant(tmp_path, extra={"mystery.weight": np.ones(3, np.float32)})
    with pytest.raises(ModelFileError, match="not used: mystery.weight .*--strict"):
        convert(str(ckpt), tmp_path / "x.gguf", strict=True)
    assert not (tmp_path / "x.gguf").exists()
    assert convert(str(ckpt), tmp_path / "y.gguf").exists()    # without --strict: a warning


def test_rotary_inv_freq_is_ignored_even_when_strict(tmp_path):
    ckpt = make_variant(tmp_path, extra={"language_model.rotary_emb.inv_freq":
                                         np.ones(8, np.float32)})
    assert convert(str(ckpt), tmp_path / "x.gguf", strict=True).exists()


def test_missing_audio_head_is_reported(tmp_path):
    state = make_state(tiny_config(), 1)
    del state["lm_heads.2.weight"]
    ckpt = make_tiny_delay_checkpoint(tmp_path / "v", state=state)
    with pytest.raises(ModelFileError, match="audio_heads.weight: missing"):
        convert(str(ckpt), tmp_path / "x.gguf")


def test_local_transformer_checkpoint_is_rejected(tmp_path):
    """P26: MOSS-TTS-Local says model_type moss_tts_delay too; its local_num_layers tells."""
    ckpt = make_variant(tmp_path, config=tiny_config(local_num_layers=4))
    with pytest.raises(ConfigError, match="local transformer"):
        convert(str(ckpt), tmp_path / "x.gguf")


def test_missing_tokenizer_raises_model_file_error(tmp_path):
    with pytest.raises(ModelFileError, match="no tokenizer.json"):
        convert(str(make_variant(tmp_path, tokenizer=False)), tmp_path / "x.gguf")


def test_config_without_language_config_raises_config_error(tmp_path):
    cfg = tiny_config()
    del cfg["language_config"]
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ConfigError, match="lacks 'language_config'"):
        convert(str(tmp_path / "c"), tmp_path / "x.gguf")
