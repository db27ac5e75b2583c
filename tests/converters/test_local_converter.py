"""converters/local.py: the tiny upstream-named MossTTSLocal checkpoint (fixtures.make_local) →
GGUF: every tensor under its GGUF name with its values, the frozen duplicate text table
dropped, a tied text head stored once (and read as the head), the embedded tokenizer, --strict,
detection by local_num_layers (P26), and the types of --outtype."""

import numpy as np
import pytest

from converters.local import convert
from fixtures.make_local import make_state, make_tiny_local_checkpoint, tiny_config
from fixtures.reference import local as ref
from moss_tts.errors import ConfigError, ModelFileError
from moss_tts.ggml import F32, GGUFFile, Weights, get_backend
from moss_tts.ggml.types import GGMLType
from moss_tts.models.local import TEXT_HEAD, TOKENIZER_KEY, LocalConfig, LocalModel
from tests.converters.helpers import one_line

N_VQ = tiny_config()["n_vq"]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return make_tiny_local_checkpoint(tmp_path_factory.mktemp("local") / "hf", seed=1)


@pytest.fixture(scope="module")
def converted(checkpoint, tmp_path_factory):
    return convert(str(checkpoint), tmp_path_factory.mktemp("local_gguf") / "l.gguf", strict=True)


def variant(tmp_path, *, config=None, edit=None):
    state = make_state(tiny_config(), 1)
    if edit:
        edit(state)
    return make_tiny_local_checkpoint(tmp_path / "v", config=config, state=state)


def test_config_and_every_tensor_arrive_under_their_gguf_names(checkpoint, converted):
    state = make_state(tiny_config(), 1)
    with GGUFFile(converted) as f:
        cfg = LocalConfig.from_gguf(f)
        assert f[TOKENIZER_KEY] == (checkpoint / "tokenizer.json").read_text(encoding="utf-8")
        assert f["moss.kind"] == "local"
    assert (cfg.n_vq, cfg.local_num_layers, cfg.local_hidden_size, cfg.local_ffn_hidden_size,
            cfg.additional_mlp_ffn_hidden_size, cfg.tie_text_head) == (N_VQ, 2, 24, 40, 36, 0)
    w = Weights.load(converted)
    try:
        assert sorted(w.names()) == sorted(cfg.tensor_shapes())
        pairs = {"token_embd.weight": "model.embedding_list.0.weight",
                 "output.weight": "lm_heads.0.weight",
                 "blk.1.attn_k_norm.weight":
                     "model.language_model.layers.1.self_attn.k_norm.weight",
                 "local.blk.0.attn_q.weight": "local_transformer.layers.0.self_attn.q_proj.weight",
                 "local.blk.1.ffn_down.weight": "local_transformer.layers.1.mlp.down_proj.weight",
                 "local.output_norm.weight": "local_transformer.norm.weight",
                 "embedding_list.2.weight": "model.embedding_list.2.weight",
                 "lm_heads.4.weight": "lm_heads.4.weight",
                 "speech_embedding_to_local_mlp.up_proj.weight":
                     "speech_embedding_to_local_mlp.up_proj.weight",
                 "local_to_speech_embedding_mlps.3.down_proj.weight":
                     "local_to_speech_embedding_mlps.3.down_proj.weight",
                 "layer_norm_before_lm_heads.0.weight": "layer_norm_before_lm_heads.0.weight"}
        for gguf_name, source in pairs.items():
            np.testing.assert_array_equal(w.read(gguf_name), state[source], err_msg=gguf_name)
        # the depth stack's q is 4 heads × 16 = 64 wide on a 24-wide stream (P7)
        assert w.read("local.blk.0.attn_q.weight").shape == (64, 24)
        # the frozen duplicate of the text table is not stored
        assert not any("embed_tokens" in n for n in w.names())
    finally:
        w.close()


@pytest.mark.parametrize("how", ["absent", "equal"])
def test_tied_text_head_is_stored_once_and_read_as_the_head(tmp_path, how):
    def tie(state):
        if how == "absent":
            del state["lm_heads.0.weight"]
        else:
            state["lm_heads.0.weight"] = state["model.embedding_list.0.weight"].copy()
    ckpt = variant(tmp_path, edit=tie)
    gguf = convert(str(ckpt), tmp_path / "tied.gguf", strict=True)
    with GGUFFile(gguf) as f:
        assert LocalConfig.from_gguf(f).tie_text_head == 1
    state = make_state(tiny_config(), 1)
    tie(state)
    model = LocalModel(Weights.load(gguf, get_backend(None, 1)), kv_type=F32)
    try:
        assert TEXT_HEAD not in model.weights.names()
        g = np.random.default_rng(0).standard_normal(32).astype(np.float32)
        text, _ = model.depth_logits(g, [151656])
        want = ref.depth_logits(state, tiny_config(), g, [])[0]
        np.testing.assert_allclose(text, want, atol=1e-4)
    finally:
        model.close()


def test_untied_head_that_differs_is_kept(converted):
    with GGUFFile(converted) as f:
        assert LocalConfig.from_gguf(f).tie_text_head == 0
        assert TEXT_HEAD in f.tensors


def test_strict_fails_on_an_unknown_tensor(tmp_path):
    ckpt = variant(tmp_path, edit=lambda s: s.update(
        {"local_transformer.rotary_emb.extra": np.zeros(4, np.float32)}))
    with pytest.raises(ModelFileError) as e:
        convert(str(ckpt), tmp_path / "x.gguf", strict=True)
    assert "local_transformer.rotary_emb.extra" in one_line(e)
    assert not (tmp_path / "x.gguf").exists()


def test_missing_tensor_is_named(tmp_path):
    ckpt = variant(tmp_path, edit=lambda s: s.pop("layer_norm_before_lm_heads.2.weight"))
    with pytest.raises(ModelFileError, match="layer_norm_before_lm_heads.2.weight: missing"):
        convert(str(ckpt), tmp_path / "x.gguf")


def test_delay_and_v15_checkpoints_are_refused_with_the_right_command(tmp_path):
    from converters.delay import convert as convert_delay

    delay = {k: v for k, v in tiny_config().items() if not k.startswith(("local_", "additional_"))}
    with pytest.raises(ConfigError, match="no local_num_layers: this is MossTTSDelay"):
        convert(str(variant(tmp_path / "d", config=delay)), tmp_path / "x.gguf")
    v15 = tiny_config(model_type="moss_tts_local", gpt2_config={})
    with pytest.raises(ConfigError, match="convert local-v15"):
        convert(str(variant(tmp_path / "v", config=v15)), tmp_path / "x.gguf")
    # and the Delay converter refuses this checkpoint (P26: both say moss_tts_delay)
    with pytest.raises(ConfigError, match="has a local transformer"):
        convert_delay(str(variant(tmp_path / "l")), tmp_path / "y.gguf")


def test_outtype_quantizes_the_matmuls_only(checkpoint, tmp_path):
    gguf = convert(str(checkpoint), tmp_path / "q.gguf", outtype="q8_0", strict=True)
    with GGUFFile(gguf) as f:
        types = {n: i.type for n, i in f.tensors.items()}
    # widths of 24 / 36 / 40 are not whole q8_0 blocks (32): those rows fall back to f16
    assert types["blk.0.attn_q.weight"] == GGMLType.Q8_0
    assert types["output.weight"] == GGMLType.Q8_0
    assert types["local.blk.0.attn_q.weight"] == GGMLType.F16
    assert types["token_embd.weight"] == GGMLType.F32
    assert types["embedding_list.1.weight"] == GGMLType.F32
    assert types["layer_norm_before_lm_heads.0.weight"] == GGMLType.F32
    assert types["local.blk.0.attn_norm.weight"] == GGMLType.F32
