"""converters/codec.py: the tiny 48 kHz-family stereo checkpoints (MOSS-Audio-Tokenizer-Nano and
-v2 structure, fixtures/make_codec.py) → codec GGUF. Expected values are computed here from
config.json and the raw safetensors, not through the converter's own helpers (docs/upstream-notes.md
§codecs-1.5, §codecs-1.8, §codecs-3, §codecs-4)."""

import json
import shutil
from types import SimpleNamespace

import numpy as np
import pytest

from converters.codec import convert
from fixtures.compare import assert_close, assert_differs
from fixtures.make_codec import (load_config, load_state, make_tiny_nano_checkpoint,
                                 make_tiny_v2_checkpoint)
from moss_tts.codec import Codec
from moss_tts.errors import ModelFileError
from moss_tts.ggml import GGMLType, GGUFFile, Weights
from tests.converters.helpers import edited_checkpoint, one_line

MAKERS = {"nano": make_tiny_nano_checkpoint, "v2": make_tiny_v2_checkpoint}
WN_G, WN_V = ".parametrizations.weight.original0", ".parametrizations.weight.original1"
# The Nano / v2 layer load hook also accepts the v1 spellings (docs/upstream-notes.md §codecs-3.3);
# the fixture writes the Nano / v2 ones.
LEGACY_NAMES = {".self_attn.in_proj.weight": ".self_attn.in_projs.0.weight",
                ".self_attn.out_proj.weight": ".self_attn.out_projs.0.weight",
                ".ffn.0.weight": ".linear1.weight", ".ffn.2.weight": ".linear2.weight"}
# The fused weight is computed in float64 and stored as f32: one rounding (values ≤ ~1.5).
FUSED_ATOL = 1e-6
# f32 graph vs f32 graph of the same weights: identical computation (measured 0).
SAME_ATOL = 1e-6
# Decode with f16 weights vs f32, RMS error over RMS signal: f16 keeps ~11 bits (v1: 5e-4).
F16_REL_RMS = 2e-3
# The hand-computed windows of the tiny configs (module docstring of fixtures/make_codec.py).
CONTEXTS = {
    "nano": {"encoder.1": 160, "encoder.3": 100, "decoder.1": 114, "decoder.3": 120},
    "v2": {"encoder.1": 80, "encoder.3": 50, "encoder.5": 30,
           "decoder.0": 30, "decoder.2": 50, "decoder.4": 80},
}


@pytest.fixture(scope="session", params=sorted(MAKERS))
def stereo(request, tmp_path_factory):
    """One tiny stereo checkpoint per variant, converted once with strict=True."""
    name = request.param
    ckpt = MAKERS[name](tmp_path_factory.mktemp(f"stereo_{name}_ckpt") / "single", seed=0)
    gguf = convert(str(ckpt), tmp_path_factory.mktemp(f"stereo_{name}_gguf") / "codec.gguf",
                   strict=True)
    with Weights.load(gguf) as w:
        tensors = {n: w.read(n) for n in w.names()}
    return SimpleNamespace(name=name, checkpoint=ckpt, gguf=gguf, tensors=tensors,
                           state=load_state(ckpt), config=load_config(ckpt))


def to_legacy_names(state):
    for name in list(state):
        for new, old in LEGACY_NAMES.items():
            if name.endswith(new):
                state[name[: -len(new)] + old] = state.pop(name)


def transformer_modules(config):
    """(tower, index, kwargs) of every transformer module of both towers."""
    return [(tower, i, kw) for tower in ("encoder", "decoder")
            for i, kw in enumerate(config[f"{tower}_kwargs"]) if kw["module_type"] == "Transformer"]


def square_projections(config):
    """Names of the block projections whose input and output widths are equal (v1 would have an
    Identity there; Nano / v2 always have a Linear)."""
    names = []
    for tower, i, kw in transformer_modules(config):
        d = kw["d_model"]
        if kw["input_dimension"] == d:
            names.append(f"{tower}.{i}.input_proj.weight")
        if kw["output_dimension"] == d:
            names.append(f"{tower}.{i}.output_proj.weight")
    return names


# -- tensors ----------------------------------------------------------------------------------


def test_stereo_checkpoint_converts_strictly_with_every_tensor_kept(stereo):
    """The strict conversion (in the fixture) keeps every tensor under its own name, fusing only
    the weight-norm pairs."""
    state, tensors = stereo.state, stereo.tensors
    fused = sorted(n[: -len(WN_G)] for n in state if n.endswith(WN_G))
    assert len(fused) == 2 + 2 * stereo.config["quantizer_kwargs"]["num_quantizers"]
    plain = [n for n in state if not n.endswith((WN_G, WN_V))]
    assert set(tensors) == set(plain) | {b + ".weight" for b in fused}
    for name in plain:
        assert_close(tensors[name], state[name], atol=0.0, what=name)
    for base in fused:
        g = state[base + WN_G].astype(np.float64)[:, 0, :]   # (out, 1)
        v = state[base + WN_V].astype(np.float64)[:, :, 0]   # (out, in)
        want = g * v / np.sqrt((v * v).sum(axis=1, keepdims=True))
        assert_close(tensors[base + ".weight"], want, atol=FUSED_ATOL, what=base)
        assert_differs(tensors[base + ".weight"], v, atol=FUSED_ATOL, what=f"{base} vs raw v")


def test_single_file_and_sharded_stereo_checkpoints_give_identical_gguf(stereo, tmp_path):
    sharded = MAKERS[stereo.name](tmp_path / "sharded", seed=0, sharded=True)
    assert (sharded / "model.safetensors.index.json").exists()
    assert len(list(sharded.glob("*.safetensors"))) == 2
    other = convert(str(sharded), tmp_path / "sharded.gguf", strict=True)
    with GGUFFile(stereo.gguf) as a, GGUFFile(other) as b:
        assert list(a.tensors) == list(b.tensors)
        types = {n: t.type for n, t in a.tensors.items()}
        assert types == {n: t.type for n, t in b.tensors.items()}
        assert a.keys() == b.keys()
        for key in a.keys():
            assert np.array_equal(np.asarray(a[key]), np.asarray(b[key])), key
    with Weights.load(other) as w:
        for name, want in stereo.tensors.items():
            assert_close(w.read(name), want, atol=0.0, what=name)


# -- metadata ---------------------------------------------------------------------------------


def test_stereo_metadata_rounds_each_modules_own_context_duration(stereo):
    """A transformer's window is int(round(rate entering it × its own context_duration)); the
    rate starts at sampling_rate × 2 (the interleaved L R stream), is divided by each encoder
    patch and multiplied by each decoder patch. The global causal_transformer_context_duration
    is only a fallback."""
    config = stereo.config
    assert config["number_channels"] == 2 and config["enable_channel_interleave"] is True
    rate = float(config["sampling_rate"] * config["number_channels"])
    contexts, truncated = {}, {}
    with GGUFFile(stereo.gguf) as f:
        for tower in ("encoder", "decoder"):
            meta = {k: [int(x) for x in f[f"moss.codec.{tower}.{k}"]]
                    for k in ("kind", "patch", "in_dim", "d_model", "out_dim", "n_heads",
                              "n_layers", "ffn", "context", "has_input_proj", "has_output_proj")}
            modules = config[f"{tower}_kwargs"]
            assert len(meta["kind"]) == len(modules)
            for i, kw in enumerate(modules):
                if kw["module_type"] == "PatchedPretransform":
                    assert (meta["kind"][i], meta["patch"][i]) == (0, kw["patch_size"])
                    h = kw["patch_size"]
                    rate = rate / h if tower == "encoder" else rate * h
                    continue
                contexts[f"{tower}.{i}"] = int(round(rate * kw["context_duration"]))
                truncated[f"{tower}.{i}"] = int(rate * kw["context_duration"])
                got = {k: meta[k][i] for k in meta if k != "patch"}
                assert got == {"kind": 1, "in_dim": kw["input_dimension"],
                               "d_model": kw["d_model"], "out_dim": kw["output_dimension"],
                               "n_heads": kw["num_heads"], "n_layers": kw["num_layers"],
                               "ffn": kw["dim_feedforward"], "context": contexts[f"{tower}.{i}"],
                               "has_input_proj": 1, "has_output_proj": 1}, f"{tower}.{i}"
        q = config["quantizer_kwargs"]
        assert f["moss.codec.variant"] in ("nano", "v2")
        assert f["moss.codec.channels"] == 2
        assert f["moss.codec.sample_rate"] == config["sampling_rate"] == 1600
        assert f["moss.codec.downsample_rate"] == config["downsample_rate"] == 32  # per channel
        assert f["moss.codec.code_dim"] == config["code_dim"]
        assert (f["moss.codec.quantizer.n_quantizers"], f["moss.codec.quantizer.codebook_size"],
                f["moss.codec.quantizer.codebook_dim"], f["moss.codec.quantizer.rvq_dim"]) == \
            (q["num_quantizers"], q["codebook_size"], q["codebook_dim"], q["rvq_dim"])
        for tower in ("encoder", "decoder"):  # a code frame is 2 × 32 interleaved samples
            assert np.prod([p for p in f[f"moss.codec.{tower}.patch"]]) == 64
    assert contexts == CONTEXTS[stereo.name]
    if stereo.name == "nano":  # 200 Hz × 0.57 s = 113.99999…: only rounding gives 114
        assert truncated["decoder.1"] == 113 and contexts["decoder.1"] == 114


def test_square_projections_are_present_and_applied(stereo, tmp_path):
    """Nano / v2 build both block projections in every stage, square ones included; the runtime
    applies them: replacing each square one by the identity changes the codes and the decode."""
    squares = square_projections(stereo.config)
    assert squares, "the tiny config has no square projection"
    assert any(n.startswith("encoder.") for n in squares)
    assert any(n.startswith("decoder.") for n in squares)
    for name in squares:
        assert_close(stereo.tensors[name], stereo.state[name], atol=0.0, what=name)

    def identity(state):
        for name in squares:
            state[name] = np.eye(state[name].shape[0], dtype=np.float32)
    src = edited_checkpoint(stereo.checkpoint, tmp_path / "identity", identity)
    plain = convert(str(src), tmp_path / "identity.gguf", strict=True)
    rng = np.random.default_rng(8)
    codes = rng.integers(0, 64, (8, 20), dtype=np.int32)
    audio = (0.3 * rng.standard_normal((20 * 32, 2))).astype(np.float32)
    with Codec.load(stereo.gguf, threads=1) as a, Codec.load(plain, threads=1) as b:
        assert not np.array_equal(a.encode(audio, 1600), b.encode(audio, 1600))
        assert_differs(a.decode(codes), b.decode(codes), atol=SAME_ATOL,
                       what="square projections replaced by identity")


def test_f16_outtype_covers_square_projections_and_decodes_close_to_f32(stereo, tmp_path):
    path = convert(str(stereo.checkpoint), tmp_path / "codec-f16.gguf", outtype="f16",
                   strict=True)
    with GGUFFile(path) as f:
        types = {n: t.type for n, t in f.tensors.items()}
    for name in square_projections(stereo.config):
        assert types[name] == GGMLType.F16, name
    assert all(t == GGMLType.F32 for n, t in types.items() if n.startswith("quantizer."))
    codes = np.random.default_rng(8).integers(0, 64, (8, 40), dtype=np.int32)
    with Codec.load(stereo.gguf, threads=1) as ref_codec, Codec.load(path, threads=1) as codec:
        want, got = ref_codec.decode(codes), codec.decode(codes)
    assert got.shape == want.shape == (40 * 32, 2)
    rel = np.sqrt(np.mean((got - want) ** 2) / np.mean(want ** 2))
    assert np.isfinite(got).all() and 0 < rel < F16_REL_RMS, rel


# -- broken and legacy-spelled checkpoints ------------------------------------------------------


@pytest.mark.parametrize("spelling", ["nano_v2_names", "legacy_v1_names"])
def test_stereo_config_with_missing_square_input_proj_is_reported_by_name(stereo, tmp_path,
                                                                          spelling):
    """encoder.3 is 32 → 32 → …: v1 would build an Identity there, but the config has the
    stereo keys (number_channels, enable_channel_interleave, per-module context_duration), so
    upstream builds a Linear and the checkpoint must hold its weight — whichever spelling the
    layer tensors use (the Nano / v2 load hook accepts both, docs/upstream-notes.md §codecs-3.3)."""
    name = "encoder.3.input_proj.weight"
    assert name in square_projections(stereo.config)

    def edit(state):
        state.pop(name)
        if spelling == "legacy_v1_names":
            to_legacy_names(state)
    src = edited_checkpoint(stereo.checkpoint, tmp_path / spelling, edit)
    with pytest.raises(ModelFileError) as e:
        convert(str(src), tmp_path / "out.gguf")
    assert name in one_line(e)
    assert not (tmp_path / "out.gguf").exists()


def test_legacy_v1_spelled_stereo_checkpoint_converts_like_the_nano_v2_spelling(stereo, tmp_path):
    """The same weights with the v1 layer spellings (`in_projs.0`, `linear1`, …) are still a
    stereo Nano / v2 checkpoint (its config says so): same tensors, same metadata."""
    src = edited_checkpoint(stereo.checkpoint, tmp_path / "legacy", to_legacy_names)
    out = convert(str(src), tmp_path / "legacy.gguf", strict=True)
    with GGUFFile(stereo.gguf) as a, GGUFFile(out) as b:
        assert a.keys() == b.keys()
        for key in a.keys():
            assert np.array_equal(np.asarray(a[key]), np.asarray(b[key])), key
        assert list(a.tensors) == list(b.tensors)
    with Weights.load(out) as w:
        for name, want in stereo.tensors.items():
            assert_close(w.read(name), want, atol=0.0, what=name)


def test_stereo_config_without_channel_keys_or_model_type_is_still_stereo(stereo, tmp_path):
    """Channels come from the towers (patches multiply to 2 × downsample_rate), not from the
    channel keys or `model_type` a re-save may drop or rewrite."""
    src = tmp_path / "bare"
    shutil.copytree(stereo.checkpoint, src)
    config = {k: v for k, v in stereo.config.items()
              if k not in ("number_channels", "enable_channel_interleave")}
    config["model_type"] = "speech_tokenizer"
    (src / "config.json").write_text(json.dumps(config))
    out = convert(str(src), tmp_path / "bare.gguf", strict=True)
    with GGUFFile(stereo.gguf) as a, GGUFFile(out) as b:
        for key in a.keys():
            if key != "moss.codec.config_json":
                assert np.array_equal(np.asarray(a[key]), np.asarray(b[key])), key
        assert b["moss.codec.channels"] == 2
