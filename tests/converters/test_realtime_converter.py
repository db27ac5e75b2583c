"""converters/realtime.py: the tiny upstream-named MossTTSRealtime checkpoint
(fixtures.make_realtime: bf16 shards + index, the duplicate text table included) → GGUF: the
names and values of every tensor, the local tables kept with their index (P16), the padding
rows kept as stored, the duplicate text table dropped, the embedded tokenizer, --strict, the
type per group, and bad checkpoints."""

import json
import subprocess
import sys

import numpy as np
import pytest

from converters.realtime import convert
from fixtures.make_realtime import (AUDIO_VOCAB, CODEBOOK, RVQ, make_state,
                                    make_tiny_realtime_checkpoint, tiny_config)
from moss_tts.errors import ConfigError, ModelFileError
from moss_tts.ggml import GGUFFile, Weights
from moss_tts.ggml.types import GGMLType
from moss_tts.models.realtime import TOKENIZER_KEY, RealtimeConfig

from .helpers import one_line


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return make_tiny_realtime_checkpoint(tmp_path_factory.mktemp("rt") / "hf", seed=1)


@pytest.fixture(scope="module")
def converted(checkpoint, tmp_path_factory):
    return convert(str(checkpoint), tmp_path_factory.mktemp("rt_gguf") / "r.gguf", strict=True)


def test_config_and_every_tensor_arrive_under_their_gguf_names(checkpoint, converted):
    state = make_state(tiny_config(), 1)
    with GGUFFile(converted) as f:
        cfg = RealtimeConfig.from_gguf(f)
        assert f[TOKENIZER_KEY] == (checkpoint / "tokenizer.json").read_text(encoding="utf-8")
    assert (cfg.rvq, cfg.audio_pad_token, cfg.audio_vocab_size, cfg.text_pad) == \
        (RVQ, CODEBOOK, AUDIO_VOCAB, 151655)
    assert (cfg.local_config.num_hidden_layers, cfg.local_config.head_dim) == (2, 16)
    assert (cfg.audio_bos, cfg.audio_eos, cfg.delay_tokens_len) == (CODEBOOK + 1, CODEBOOK + 2, 12)
    with Weights.load(converted) as w:
        assert sorted(w.names()) == sorted(cfg.tensor_shapes())
        pairs = {"token_embd.weight": "embed_tokens.0.weight",
                 "blk.1.attn_k_norm.weight": "language_model.layers.1.self_attn.k_norm.weight",
                 "output_norm.weight": "language_model.norm.weight",
                 "local.blk.1.ffn_down.weight":
                     "local_transformer.model.layers.1.mlp.down_proj.weight",
                 "local.blk.0.attn_q.weight":
                     "local_transformer.model.layers.0.self_attn.q_proj.weight",
                 "local.output_norm.weight": "local_transformer.model.norm.weight"}
        pairs |= {f"embed_tokens.{k + 1}.weight": f"embed_tokens.{k + 1}.weight"
                  for k in range(RVQ)}
        # P16: local table j stays table j (the model shifts positions, not the file)
        pairs |= {f"local.embed_tokens.{j}.weight":
                  f"local_transformer.model.embed_tokens.{j}.weight" for j in range(RVQ - 1)}
        pairs |= {f"local.lm_heads.{j}.weight": f"local_transformer.local_lm_heads.{j}.weight"
                  for j in range(RVQ)}
        for name, source in pairs.items():
            np.testing.assert_array_equal(w.read(name), state[source], err_msg=name)
        for k in range(RVQ):   # padding rows kept as stored (zero: padding_idx)
            table = w.read(f"embed_tokens.{k + 1}.weight")
            assert not table[CODEBOOK].any() and table[CODEBOOK + 1].any()
        # the duplicate text table is not written a second time
        assert not any("language_model" in n for n in w.names())


def test_strict_rejects_an_unmapped_key(tmp_path):
    state = make_state(tiny_config(), 1) | {"local_transformer.extra.weight": np.ones((2, 2))}
    ckpt = make_tiny_realtime_checkpoint(tmp_path / "v", state=state)
    with pytest.raises(ModelFileError, match="local_transformer.extra.weight") as e:
        convert(str(ckpt), tmp_path / "x.gguf", strict=True)
    one_line(e)
    assert not (tmp_path / "x.gguf").exists()


def test_a_missing_local_head_is_named(tmp_path):
    state = make_state(tiny_config(), 1)
    del state[f"local_transformer.local_lm_heads.{RVQ - 1}.weight"]
    ckpt = make_tiny_realtime_checkpoint(tmp_path / "v", state=state)
    with pytest.raises(ModelFileError, match=f"local.lm_heads.{RVQ - 1}.weight"):
        convert(str(ckpt), tmp_path / "x.gguf", strict=True)


def test_block_linears_take_outtype_and_tables_stay_f32(checkpoint, tmp_path):
    out = convert(str(checkpoint), tmp_path / "q.gguf", outtype="q8_0", strict=True)
    import gguf

    types = {t.name: GGMLType(int(t.tensor_type)) for t in gguf.GGUFReader(out).tensors}
    assert types["blk.0.attn_q.weight"] == GGMLType.Q8_0
    assert types["local.blk.1.ffn_up.weight"] == GGMLType.Q8_0
    assert types["local.lm_heads.0.weight"] == GGMLType.Q8_0
    for name in ("token_embd.weight", "embed_tokens.1.weight", "local.embed_tokens.0.weight",
                 "blk.0.attn_norm.weight", "local.output_norm.weight"):
        assert types[name] == GGMLType.F32, name


@pytest.mark.parametrize("edit, match", [
    (lambda c: c.update(model_type="moss_tts_delay"), "is not moss_tts_realtime"),
    (lambda c: c.update(audio_vocab_size=70), "audio_vocab_size 70 is not the codebook"),
    (lambda c: c["local_config"].update(hidden_size=48), "same width"),
    (lambda c: c.pop("language_config"), "lacks 'language_config'"),
])
def test_bad_configs_raise_config_error(tmp_path, edit, match):
    config = json.loads(json.dumps(tiny_config()))
    edit(config)
    ckpt = make_tiny_realtime_checkpoint(tmp_path / "v", state={"x": np.zeros(2)})
    (ckpt / "config.json").write_text(json.dumps(config))
    with pytest.raises(ConfigError, match=match):
        convert(str(ckpt), tmp_path / "x.gguf", strict=True)


def test_convert_command_takes_the_type_flags_for_realtime(checkpoint, tmp_path):
    import gguf

    out = tmp_path / "c.gguf"
    r = subprocess.run([sys.executable, "-m", "moss_tts", "convert", "realtime", "--model",
                        str(checkpoint), "--out", str(out), "--outtype", "q4_K", "--head-type",
                        "f16", "--embed-type", "q8_0", "--quiet"], capture_output=True)
    assert r.returncode == 0, r.stderr
    types = {t.name: GGMLType(int(t.tensor_type)) for t in gguf.GGUFReader(out).tensors}
    # the tiny rows (32 wide) are too narrow for q4_K's 256-blocks: `fitted` falls back
    assert types["local.lm_heads.2.weight"] == GGMLType.F16
    assert types["embed_tokens.3.weight"] == types["local.embed_tokens.0.weight"] == GGMLType.Q8_0
    assert types["local.blk.0.attn_norm.weight"] == GGMLType.F32


def test_transformers_5_rope_parameters_are_read(tmp_path):
    """transformers 5 writes `rope_theta: null` and the base inside `rope_parameters` (the
    local config always carries both); a scaled RoPE is refused."""
    config = json.loads(json.dumps(tiny_config()))
    for c in (config["language_config"], config["local_config"]):
        c["rope_parameters"] = {"rope_type": "default", "rope_theta": 5000.0, "factor": 1.0}
        c["rope_theta"] = None
    ckpt = make_tiny_realtime_checkpoint(tmp_path / "v", config=config,
                                         state=make_state(tiny_config(), 1))
    with GGUFFile(convert(str(ckpt), tmp_path / "x.gguf", strict=True)) as f:
        cfg = RealtimeConfig.from_gguf(f)
    assert cfg.language_config.rope_theta == cfg.local_config.rope_theta == 5000.0
    config["local_config"]["rope_parameters"]["factor"] = 2.0
    (ckpt / "config.json").write_text(json.dumps(config))
    with pytest.raises(ConfigError, match="RoPE scaling"):
        convert(str(ckpt), tmp_path / "y.gguf", strict=True)
