"""converters/local_v15.py: the tiny upstream-named MOSS-TTS-Local-Transformer-v1.5 checkpoint
(fixtures.make_local_v15: bf16 shards + index, tokenizer.json) → GGUF: names and values of
every tensor, tied heads stored once, the duplicate text table dropped, the embedded tokenizer,
--strict, quantization of the block linears only, and checkpoints of other layouts."""

import json

import numpy as np
import pytest

from converters.local_v15 import convert
from converters.registry import convert_options as family_options
from moss_tts.models.registry import CONVERTIBLE as FAMILIES
from fixtures.make_delay import make_tokenizer_json
from fixtures.make_local_v15 import (AUDIO_VOCAB, N_VQ, make_state, make_tiny_local_v15_checkpoint,
                                     tiny_config)
from moss_tts.errors import ConfigError, ModelFileError
from moss_tts.ggml import GGUFFile, Weights
from moss_tts.ggml.types import GGMLType
from moss_tts.models.local_v15 import DECISION_HEAD, KIND, TOKENIZER_KEY, LocalV15Config


@pytest.fixture(scope="module")
def tokenizer_json():
    return make_tokenizer_json()


def make_variant(tmp_path, tokenizer_json, *, config=None, extra=None, drop=()):
    state = make_state(tiny_config(), 1) | (extra or {})
    for name in drop:
        del state[name]
    return make_tiny_local_v15_checkpoint(tmp_path / "v", config=config, state=state,
                                          tokenizer_json=tokenizer_json)


def with_tied_copies(state):
    """The state as an untied save writes it: the text head and each audio head a copy."""
    return {"text_lm_head.weight": state["transformer.embed_tokens.weight"].copy()} | {
        f"audio_lm_heads.{k}.weight": state[f"audio_embeddings.{k}.weight"].copy()
        for k in range(N_VQ)}


def test_config_and_every_tensor_arrive_under_their_gguf_names(tmp_path, tokenizer_json):
    state = make_state(tiny_config(), 1)
    ckpt = make_variant(tmp_path, tokenizer_json, extra=with_tied_copies(state))
    out = convert(str(ckpt), tmp_path / "m.gguf", strict=True)
    with GGUFFile(out) as f:
        cfg = LocalV15Config.from_gguf(f)
        assert f[TOKENIZER_KEY] == tokenizer_json
        f.check_kind(KIND, version=1)
    assert (cfg.n_vq, cfg.audio_vocab_size, cfg.audio_pad_token_id, cfg.audio_end_token_id) == \
        (N_VQ, AUDIO_VOCAB, AUDIO_VOCAB, 151670)
    assert (cfg.local.n_head, cfg.local.activation_function, cfg.local.ffn_dim,
            cfg.local.layer_norm_epsilon) == (2, "silu", 40, 1e-6)
    w = Weights.load(out)
    try:
        # tied heads stored once; the text head (a copy of the text table) is not stored
        assert sorted(w.names()) == sorted(cfg.tensor_shapes())
        assert not any("lm_heads" in n or n.startswith("text_lm_head") for n in w.names())
        for gguf_name, source in (
                ("token_embd.weight", "transformer.embed_tokens.weight"),
                ("blk.1.attn_k_norm.weight", "transformer.layers.1.self_attn.k_norm.weight"),
                ("blk.0.ffn_down.weight", "transformer.layers.0.mlp.down_proj.weight"),
                ("output_norm.weight", "transformer.norm.weight"),
                ("local_transformer.h.0.attn.c_attn.weight",
                 "local_transformer.h.0.attn.c_attn.weight"),
                ("local_transformer.ln_f.bias", "local_transformer.ln_f.bias"),
                (DECISION_HEAD, DECISION_HEAD), ("audio_embeddings.3.weight",
                                                 "audio_embeddings.3.weight")):
            np.testing.assert_array_equal(w.read(gguf_name), state[source], err_msg=gguf_name)
    finally:
        w.close()


def test_q8_0_quantizes_block_linears_only(tmp_path, tokenizer_json):
    out = convert(str(make_variant(tmp_path, tokenizer_json)), tmp_path / "q.gguf",
                  outtype="q8_0", strict=True)
    with GGUFFile(out) as f:
        types = {n: i.type for n, i in f.tensors.items()}
    assert types["blk.0.attn_q.weight"] == GGMLType.Q8_0
    assert types["local_transformer.h.0.mlp.fc_in.weight"] == GGMLType.Q8_0
    for name in ("token_embd.weight", "audio_embeddings.0.weight", DECISION_HEAD,
                 "local_transformer.h.0.attn.c_attn.bias", "local_transformer.ln_f.weight"):
        assert types[name] == GGMLType.F32, name


def test_embed_type_flag_reaches_local_v15(tmp_path, tokenizer_json):
    assert "local-v15" in FAMILIES
    opts = family_options("local-v15", {"embed_type": "f16"})
    out = convert(str(make_variant(tmp_path, tokenizer_json)), tmp_path / "e.gguf", **opts)
    with GGUFFile(out) as f:
        assert f.tensors["audio_embeddings.0.weight"].type == GGMLType.F16
    with pytest.raises(ConfigError, match="--head-type"):
        family_options("local-v15", {"head_type": "q8_0"})


def test_untied_audio_head_is_refused(tmp_path, tokenizer_json):
    state = make_state(tiny_config(), 1)
    copies = with_tied_copies(state)
    copies["audio_lm_heads.2.weight"] = copies["audio_lm_heads.2.weight"] + 1
    ckpt = make_variant(tmp_path, tokenizer_json, extra=copies)
    with pytest.raises(ModelFileError, match="audio_lm_heads.2.weight is not tied"):
        convert(str(ckpt), tmp_path / "x.gguf")


def test_missing_2_way_head_is_the_text_heads_continue_stop_rows(tmp_path, tokenizer_json):
    """Upstream initialises the 2-way head from text rows 151656 / 151670 (and full_vocab mode
    decides with exactly those), so a checkpoint without it gets them."""
    state = make_state(tiny_config(), 1)
    ckpt = make_variant(tmp_path, tokenizer_json, drop=[DECISION_HEAD],
                        config=tiny_config(local_text_head_mode="full_vocab"))
    out = convert(str(ckpt), tmp_path / "m.gguf", strict=True)
    with Weights.load(out) as w:
        np.testing.assert_array_equal(w.read(DECISION_HEAD),
                                      state["transformer.embed_tokens.weight"][[151656, 151670]])


def test_strict_rejects_an_unknown_key_and_writes_nothing(tmp_path, tokenizer_json):
    ckpt = make_variant(tmp_path, tokenizer_json, extra={"mystery.weight": np.ones(3, np.float32)})
    with pytest.raises(ModelFileError, match="not used: mystery.weight .*--strict"):
        convert(str(ckpt), tmp_path / "x.gguf", strict=True)
    assert not (tmp_path / "x.gguf").exists()


@pytest.mark.parametrize("edit, match", [
    (lambda c: c.update(local_num_layers=4), "convert local"),                # P26: V2
    (lambda c: c.update(model_type="moss_tts_delay"), "moss_tts_local"),
    (lambda c: c["gpt2_config"].update(position_embedding_type="absolute"), "absolute"),
    (lambda c: c["gpt2_config"].update(activation_function="relu"), "relu"),
    (lambda c: c["gpt2_config"].update(n_embd=64), "width 64"),
    (lambda c: c.update(audio_codebook_sizes=[64, 64]), "audio_codebook_sizes"),
    (lambda c: c.pop("qwen3_config"), "lacks 'language_config'"),
])
def test_other_layouts_are_one_line_config_errors(tmp_path, edit, match):
    cfg = tiny_config()
    edit(cfg)
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ConfigError, match=match) as e:
        convert(str(tmp_path / "c"), tmp_path / "x.gguf")
    assert "\n" not in str(e.value)
