"""converters/nano.py: tiny MOSS-TTS-Nano checkpoints (fixtures.make_nano) → GGUF. Both checkpoint
formats, the tied heads, the ignored and unknown keys, the embedded SentencePiece model, and
q8_0 quantization of the block linears only."""

import json
import logging
import re
import shutil

import numpy as np
import pytest
from safetensors.numpy import save_file

from converters.nano import convert, nano_config
from fixtures.make_nano import load_config, load_state, make_tiny_nano_tts_checkpoint
from fixtures.make_spm import make_tiny_spm
from fixtures.torch_zip import write_torch_zip
from moss_tts.errors import ConfigError, ModelFileError
from moss_tts.ggml import GGUFFile, Weights
from moss_tts.ggml.types import GGMLType
from moss_tts.models.nano import TOKENIZER_KEY, NanoConfig

BLOCK_LINEAR = re.compile(r"^(transformer|local_transformer)\.h\.\d+\."
                          r"(attn\.c_attn|attn\.c_proj|mlp\.fc_in|mlp\.fc_out)\.weight$")
EXTRA = "transformer.h.0.attn.rotary_scale"   # not a Nano tensor, not on the ignore list


@pytest.fixture(scope="module")
def spm_bytes():
    return make_tiny_spm()


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory, spm_bytes):
    """The default tiny checkpoint: tied head copies and a stale local wte included."""
    return make_tiny_nano_tts_checkpoint(tmp_path_factory.mktemp("nano") / "hf", seed=3,
                                         tokenizer_model_bytes=spm_bytes)


@pytest.fixture(scope="module")
def converted(checkpoint, tmp_path_factory):
    return convert(str(checkpoint), tmp_path_factory.mktemp("nano_gguf") / "nano.gguf", strict=True)


def gguf_tensors(path):
    """name → (type, shape, raw bytes) straight from the file."""
    with GGUFFile(path) as f:
        infos, start = dict(f.tensors), f.data_offset
    data = path.read_bytes()
    return {n: (i.type, i.shape, data[start + i.offset:start + i.offset + i.nbytes])
            for n, i in infos.items()}


def gguf_metadata(path):
    with GGUFFile(path) as f:
        names = f.keys()  # a GGUFFile, not a dict
        return {k: (v.tolist() if isinstance(v, np.ndarray) else v) for k in names for v in [f[k]]}


def variant(checkpoint, dst, *, state=None, tokenizer=True):
    """A copy of `checkpoint` in dst with another state dict (safetensors) or no tokenizer."""
    dst.mkdir(parents=True)
    shutil.copy(checkpoint / "config.json", dst / "config.json")
    if tokenizer:
        shutil.copy(checkpoint / "tokenizer.model", dst / "tokenizer.model")
    save_file(load_state(checkpoint) if state is None else state, str(dst / "model.safetensors"))
    return dst


# --- formats ------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_safetensors_and_pytorch_bin_convert_to_identical_gguf(tmp_path, spm_bytes, dtype):
    st_dir = make_tiny_nano_tts_checkpoint(tmp_path / "st", seed=5, dtype=dtype,
                                           tokenizer_model_bytes=spm_bytes)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in ("config.json", "tokenizer.model"):
        shutil.copy(st_dir / name, bin_dir / name)
    state = load_state(st_dir)
    write_torch_zip(bin_dir / "pytorch_model.bin", state)
    a = gguf_tensors(convert(str(st_dir), tmp_path / "st.gguf", strict=True))
    b = gguf_tensors(convert(str(bin_dir), tmp_path / "bin.gguf", strict=True))
    assert sorted(a) == sorted(b)
    for name in a:
        assert a[name] == b[name], f"{name} differs between the two formats"
    assert gguf_metadata(tmp_path / "st.gguf") == gguf_metadata(tmp_path / "bin.gguf")
    # and the stored values are the checkpoint's (f16 widened exactly to f32)
    _, shape, raw = a["transformer.wte.weight"]
    wte = np.frombuffer(raw, np.float32).reshape(shape)
    np.testing.assert_array_equal(wte, state["transformer.wte.weight"].astype(np.float32))


def test_converted_config_matches_config_json(checkpoint, converted):
    with GGUFFile(converted) as f:
        cfg = NanoConfig.from_gguf(f)
        assert f.check_kind("nano") == "nano"
    assert cfg == nano_config(load_config(checkpoint))
    assert (cfg.audio_end_token_id, cfg.audio_user_slot_token_id,
            cfg.audio_assistant_slot_token_id, cfg.audio_pad_token_id) == (7, 8, 9, 64)
    dims = (cfg.n_vq, cfg.audio_vocab_size, cfg.local.n_layer, cfg.backbone.n_layer)
    assert dims == (4, 64, 1, 2)


def test_every_runtime_tensor_is_stored_once_under_its_upstream_name(converted, checkpoint):
    tensors = gguf_tensors(converted)
    with GGUFFile(converted) as f:
        expected = NanoConfig.from_gguf(f).tensor_shapes()
    assert sorted(tensors) == sorted(expected)
    assert all(tensors[n][1] == s for n, s in expected.items())
    assert not any(n.startswith(("text_lm_head", "audio_lm_heads")) for n in tensors)
    state = load_state(checkpoint)
    for name, (_, shape, raw) in tensors.items():
        np.testing.assert_array_equal(np.frombuffer(raw, np.float32).reshape(shape), state[name])


# --- tied heads, ignored and unknown keys ---------------------------------------------------------


def test_checkpoint_without_head_copies_converts_identically(checkpoint, converted, tmp_path):
    state = {k: v for k, v in load_state(checkpoint).items()
             if not k.startswith(("text_lm_head", "audio_lm_heads"))}
    src = variant(checkpoint, tmp_path / "untied_copies_absent", state=state)
    assert gguf_tensors(convert(str(src), tmp_path / "out.gguf", strict=True)) == \
        gguf_tensors(converted)


@pytest.mark.parametrize("head", ["text_lm_head.weight", "audio_lm_heads.2.weight"])
def test_head_copy_that_is_not_tied_raises_model_file_error(checkpoint, tmp_path, head):
    state = load_state(checkpoint)
    state[head] = state[head].copy()
    state[head][0, 0] += 0.5
    src = variant(checkpoint, tmp_path / "untied", state=state)
    with pytest.raises(ModelFileError, match=re.escape(head) + ".*not tied"):
        convert(str(src), tmp_path / "out.gguf")


def test_stale_local_wte_is_ignored_even_when_strict(checkpoint, converted, caplog):
    assert "local_transformer.wte.weight" in load_state(checkpoint)
    with caplog.at_level(logging.WARNING, logger="converters.nano"):
        convert(str(checkpoint), converted.parent / "again.gguf", strict=False)
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert "local_transformer.wte.weight" not in gguf_tensors(converted)


def test_converter_strict_rejects_unknown_key(checkpoint, tmp_path):
    state = load_state(checkpoint) | {EXTRA: np.ones(4, np.float32)}
    src = variant(checkpoint, tmp_path / "extra", state=state)
    with pytest.raises(ModelFileError, match=re.escape(EXTRA)):
        convert(str(src), tmp_path / "out.gguf", strict=True)
    assert not (tmp_path / "out.gguf").exists()


def test_converter_without_strict_warns_and_skips_unknown_key(checkpoint, converted, tmp_path,
                                                               caplog):
    state = load_state(checkpoint) | {EXTRA: np.ones(4, np.float32)}
    src = variant(checkpoint, tmp_path / "extra", state=state)
    with caplog.at_level(logging.WARNING, logger="converters.nano"):
        out = convert(str(src), tmp_path / "out.gguf", strict=False)
    assert any(EXTRA in r.getMessage() for r in caplog.records if r.levelno == logging.WARNING)
    assert gguf_tensors(out) == gguf_tensors(converted)


def test_missing_or_misshapen_tensor_raises_model_file_error(checkpoint, tmp_path):
    state = load_state(checkpoint)
    del state["audio_embeddings.3.weight"], state["audio_lm_heads.3.weight"]
    with pytest.raises(ModelFileError, match=r"audio_embeddings\.3\.weight: missing"):
        convert(str(variant(checkpoint, tmp_path / "missing", state=state)), tmp_path / "a.gguf")
    state = load_state(checkpoint)
    state["transformer.ln_f.bias"] = state["transformer.ln_f.bias"][:-1].copy()
    with pytest.raises(ModelFileError, match=r"transformer\.ln_f\.bias: shape"):
        convert(str(variant(checkpoint, tmp_path / "shape", state=state)), tmp_path / "b.gguf")


def test_unequal_codebook_sizes_raise_config_error(checkpoint, tmp_path):
    src = variant(checkpoint, tmp_path / "sizes")
    config = load_config(checkpoint)
    config["audio_codebook_sizes"] = [64, 64, 64, 32]
    (src / "config.json").write_text(json.dumps(config))
    with pytest.raises(ConfigError, match="audio_codebook_sizes"):
        convert(str(src), tmp_path / "out.gguf")


# --- tokenizer ----------------------------------------------------------------------------------


def test_sentencepiece_model_is_embedded_byte_for_byte(checkpoint, converted):
    with GGUFFile(converted) as f:
        blob = f[TOKENIZER_KEY]
    assert bytes(np.asarray(blob, dtype=np.uint8)) == (checkpoint / "tokenizer.model").read_bytes()


def test_sentencepiece_model_is_found_in_its_upstream_subfolder(checkpoint, converted, tmp_path):
    src = variant(checkpoint, tmp_path / "subfolder", tokenizer=False)
    (src / "sentencepiece").mkdir()
    shutil.copy(checkpoint / "tokenizer.model", src / "sentencepiece" / "mossttsnano_spm_bpe.model")
    out = convert(str(src), tmp_path / "out.gguf")
    assert gguf_metadata(out)[TOKENIZER_KEY] == gguf_metadata(converted)[TOKENIZER_KEY]


def test_missing_tokenizer_raises_model_file_error(checkpoint, tmp_path):
    src = variant(checkpoint, tmp_path / "no_tokenizer", tokenizer=False)
    with pytest.raises(ModelFileError, match="SentencePiece"):
        convert(str(src), tmp_path / "out.gguf")
    assert not (tmp_path / "out.gguf").exists()


# --- quantization -------------------------------------------------------------------------------


def test_q8_0_quantizes_block_linears_only(checkpoint, tmp_path):
    out = convert(str(checkpoint), tmp_path / "q8.gguf", outtype="q8_0", strict=True)
    tensors = gguf_tensors(out)
    linears = [n for n in tensors if BLOCK_LINEAR.match(n)]
    assert len(linears) == 4 * (2 + 1)  # 4 per block, 2 global blocks + 1 local block
    for name, (ggml_type, _, _) in tensors.items():
        want = GGMLType.Q8_0 if BLOCK_LINEAR.match(name) else GGMLType.F32
        assert ggml_type == want, f"{name}: {ggml_type.name}, expected {want.name}"
    # the quantized weights read back within q8_0's error: half a step of absmax/127 per block
    state = load_state(checkpoint)
    with Weights.load(out) as w:
        for name in linears:
            x = state[name].astype(np.float32)
            blocks = x.reshape(-1, 32)
            step = np.abs(blocks).max(axis=1, keepdims=True) / 127
            err = np.abs(w.read(name).reshape(-1, 32) - blocks)
            assert (err <= (0.5 + 127 * 2.0**-11) * step + 1e-7).all(), name
            assert err.max() > 0, f"{name} was not quantized at all"
        np.testing.assert_array_equal(w.read("transformer.wte.weight"),
                                      state["transformer.wte.weight"])
