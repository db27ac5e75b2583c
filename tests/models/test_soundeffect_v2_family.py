"""MOSS-SoundEffect v2.0 as a family: upstream's published directory (rebuilt without torch from
the pipeline fixture, whose directory upstream's own `WanAudioPipeline.from_pretrained` loaded
and ran: bench/soundeffect_v2_pipeline_upstream.py) through the real converter into one GGUF,
loaded by the registry, sampling upstream's audio from the same noise; the family contract
(numpy-seeded noise, progress, the short latent, one-line errors); and the converter's own
failures."""

import json
import shutil

import numpy as np
import pytest

from converters.checkpoint import TorchBinCheckpoint
from converters.naming import family_of_checkpoint
from converters.soundeffect_v2 import convert
from fixtures.compare import assert_close, assert_differs
from fixtures.make_soundeffect_v2 import make_tiny_sfx_v2, write_published_checkpoint
from fixtures.torch_zip import write_torch_zip
from moss_tts import load_tts
from moss_tts.errors import ConfigError, InputError, ModelFileError
from moss_tts.models.registry import family_of_model
from moss_tts.models.soundeffect_v2 import output_samples
from moss_tts.models.soundeffect_v2_tts import SoundEffectV2TTS
from moss_tts.sampling import DelaySamplingOptions, DiffusionOptions

# the whole pipeline from the converted GGUF against upstream's from_pretrained + __call__:
# the same measured 1.3e-6 as models/soundeffect_v2.py's sampler on the npz's own arrays
UPSTREAM_ATOL = 2e-5


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    return make_tiny_sfx_v2(tmp_path_factory.mktemp("sfx2_family"))


@pytest.fixture(scope="module")
def tts(made):
    with load_tts(str(made["gguf"]), threads=1) as t:
        yield t


def call_of(made) -> dict:
    return made["upstream"]["meta"]["call"]


def test_the_directory_is_recognized_and_converted_to_upstreams_pipeline(made, tts):
    assert family_of_checkpoint(made["dir"]).kind == "sfx-v2"
    assert family_of_model(str(made["gguf"])).kind == "sfx-v2"
    assert isinstance(tts, SoundEffectV2TTS) and tts.sample_rate == 60 and tts.channels == 1
    call, up = call_of(made), made["upstream"]
    got = tts.model.sampler(call["prompt"], call["seconds"], up["noise"],
                            negative_prompt=call["negative_prompt"], steps=call["steps"],
                            cfg_scale=call["cfg_scale"], shift=call["shift"])
    assert_close(got, up["audio"], atol=UPSTREAM_ATOL, what="audio vs upstream's pipeline")


def test_a_seed_is_numpys_noise_and_repeats(made, tts):
    call = call_of(made)
    kw = dict(sound=call["prompt"], seconds=call["seconds"], steps=call["steps"],
              negative=call["negative_prompt"],
              options=DiffusionOptions(cfg_scale=call["cfg_scale"], shift=call["shift"]))
    audio, sr = tts.synthesize(seed=3, **kw)
    assert sr == 60 and audio.shape == (output_samples(60, call["seconds"]), 1)
    # the documented noise: numpy's default_rng(seed), [in_dim, whole window's frames]
    noise = np.random.default_rng(3).standard_normal((6, 20), dtype=np.float32)
    want = tts.model.sampler(call["prompt"], call["seconds"], noise, steps=call["steps"],
                             cfg_scale=call["cfg_scale"], shift=call["shift"])
    np.testing.assert_array_equal(audio[:, 0], want)
    np.testing.assert_array_equal(tts.synthesize(seed=3, **kw)[0], audio)
    assert_differs(tts.synthesize(seed=4, **kw)[0], audio, atol=1e-4, what="another seed")
    # the description may be the text too
    np.testing.assert_array_equal(tts.synthesize(call["prompt"], seed=3, **{
        k: v for k, v in kw.items() if k != "sound"})[0], audio)


def test_progress_and_pieces(tts):
    seen = []
    pieces = list(tts.stream(sound="rain", seconds=1.5, steps=4, seed=1,
                             progress=lambda done, total: seen.append((done, total))))
    assert seen == [(1, 4), (2, 4), (3, 4), (4, 4)]
    # an empty piece after each step (the caller's thread back), then the audio
    assert [len(p) for p in pieces[:4]] == [0] * 4 and all(len(p) for p in pieces[4:])
    assert sum(len(p) for p in pieces) == 90 and all(p.shape[1:] == (1,) for p in pieces)


def test_the_short_latent_denoises_only_the_seconds(tts):
    kw = dict(sound="rain", seconds=0.7, steps=3, seed=5)
    short, _ = tts.synthesize(short_latent=True, **kw)
    assert short.shape == (42, 1)
    noise = np.random.default_rng(5).standard_normal((6, 7), dtype=np.float32)   # ⌈42 / 6⌉
    np.testing.assert_array_equal(short[:, 0], tts.model.sampler("rain", 0.7, noise, steps=3))
    assert_differs(short, tts.synthesize(**kw)[0], atol=1e-4, what="the whole window's")


@pytest.mark.parametrize("kw, match", [
    ({"sound": "rain", "seconds": 2.1}, "exceeds max_inference_seconds=2"),
    ({"sound": "rain", "seconds": 31}, "seconds must be at most 30"),
    ({"sound": "rain", "seconds": 0.04}, "seconds must be > 0"),
    ({"sound": "rain", "steps": 0}, "steps must be"),
    ({"sound": "rain", "steps": 1001}, "steps must be"),
    ({"sound": "rain", "options": DelaySamplingOptions()},
     "options must be a DiffusionOptions"),
    ({"sound": "  "}, "sound is empty"),
    ({}, "describe the sound once"),
    ({"sound": "rain", "negative": "x" * 1025}, "negative must be at most 1024"),
    ({"sound": "rain", "short_latent": "yes"}, "short_latent must be true or false"),
    ({"sound": "rain", "reference": np.zeros((4, 6))}, "unexpected keyword"),
])
def test_a_bad_request_is_one_line(tts, kw, match):
    with pytest.raises(InputError, match=match) as e:
        tts.stream(**kw)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("kw, match", [({"cfg_scale": -1.0}, "cfg_scale must lie"),
                                       ({"shift": 0.0}, "shift must lie"),
                                       ({"cfg_scale": float("nan")}, "finite")])
def test_bad_options_are_one_line(kw, match):
    with pytest.raises(InputError, match=match):
        DiffusionOptions(**kw)


def test_it_takes_no_codec_and_no_reference(made, tts):
    with pytest.raises(InputError, match="its own VAE"):
        SoundEffectV2TTS.load(str(made["gguf"]), codec="codec.gguf")
    with pytest.raises(InputError, match="takes no reference"):
        tts.encode_reference(np.zeros(100, np.float32), 60)


# -- the converter's failures -----------------------------------------------------------------
@pytest.fixture
def ckpt(made, tmp_path):
    return write_published_checkpoint(made["upstream"], tmp_path / "ckpt")


def test_the_new_weight_norm_spelling_converts_the_same(made, ckpt, tmp_path):
    vae = ckpt / "vae" / "vae_128d_48k.pth"
    with TorchBinCheckpoint(vae) as old:
        state = {k: old[k] for k in old.keys()}
        kwargs = old.metadata["kwargs"]
    renamed = {k.replace(".weight_g", ".parametrizations.weight.original0")
               .replace(".weight_v", ".parametrizations.weight.original1"): v
               for k, v in state.items()}
    write_torch_zip(vae, renamed, metadata={"kwargs": kwargs})
    out = convert(str(ckpt), tmp_path / "new.gguf", strict=True)
    with load_tts(str(out), threads=1) as again, load_tts(str(made["gguf"]), threads=1) as first:
        kw = dict(sound="rain", seconds=0.5, steps=2, seed=1)
        np.testing.assert_array_equal(again.synthesize(**kw)[0], first.synthesize(**kw)[0])


def edit_json(path, change):
    path.write_text(json.dumps(change(json.loads(path.read_text()))))


@pytest.mark.parametrize("damage, error, match", [
    (lambda d: (d / "vae" / "vae_128d_48k.pth").unlink(), ModelFileError,
     "no vae/vae_128d_48k.pth"),
    (lambda d: edit_json(d / "transformer" / "config.json", lambda c: c | {"vae_type": "oobleck"}),
     ConfigError, "vae_type 'oobleck'"),
    (lambda d: edit_json(d / "transformer" / "config.json", lambda c: c | {"has_image_input": True}),
     ConfigError, "has_image_input"),
    (lambda d: edit_json(d / "transformer" / "config.json", lambda c: c | {"text_dim": 16}),
     ConfigError, "text_dim 16 is not the text encoder's width 32"),
    (lambda d: edit_json(d / "transformer" / "config.json",
                         lambda c: {k: v for k, v in c.items() if k != "ffn_dim"}),
     ConfigError, "lacks 'ffn_dim'"),
    (lambda d: edit_json(d / "model_index.json", lambda c: c | {"sample_rate": "fast"}),
     ConfigError, "whole numbers"),
    (lambda d: shutil.rmtree(d / "tokenizer") or (d / "text_encoder" / "tokenizer.json").unlink(),
     ModelFileError, "no tokenizer.json"),
])
def test_a_damaged_directory_is_one_error_and_nothing_written(ckpt, tmp_path, damage, error,
                                                               match):
    damage(ckpt)
    with pytest.raises(error, match=match):
        convert(str(ckpt), tmp_path / "out.gguf")
    assert not (tmp_path / "out.gguf").exists()


def test_an_unused_tensor_fails_strict_only(made, ckpt, tmp_path):
    from safetensors.numpy import load_file, save_file

    path = ckpt / "transformer" / "diffusion_pytorch_model.safetensors"
    save_file(load_file(path) | {"blocks.0.extra.weight": np.zeros(3, np.float32)}, path)
    with pytest.raises(ModelFileError, match="blocks.0.extra.weight"):
        convert(str(ckpt), tmp_path / "strict.gguf", strict=True)
    assert convert(str(ckpt), tmp_path / "lenient.gguf").is_file()


def test_quantized_types_reach_the_linears_only(ckpt, tmp_path):
    from moss_tts.ggml.weights import GGUFFile

    out = convert(str(ckpt), tmp_path / "q.gguf", outtype="f16", embed_type="f16")
    with GGUFFile(out) as f:
        types = {name: info.type.name for name, info in f.tensors.items()}
    assert types["blocks.0.self_attn.q.weight"] == types["blk.0.attn_q.weight"] == "F16"
    assert types["token_embd.weight"] == "F16"
    for kept in ("blocks.0.modulation", "head.modulation", "patch_embedding.weight",
                 "decoder.model.0.weight", "blocks.0.norm3.weight"):
        assert types[kept] == "F32", kept


@pytest.mark.parametrize("kind", ["nano", "sfx", "local"])
def test_converting_it_as_another_family_says_which_it_is(made, tmp_path, kind):
    from converters.registry import convert as convert_as
    from moss_tts.models.registry import family

    with pytest.raises(ConfigError, match=r"is MOSS-SoundEffect-v2.0 \(its model_index.json's "
                                          r"_class_name 'MossSoundEffectPipeline'\), not .*: "
                                          r"convert it with `python -m moss_tts convert sfx-v2`"):
        convert_as(family(kind), str(made["dir"]), tmp_path / "x.gguf")
    assert not (tmp_path / "x.gguf").exists()


def test_the_vae_stops_at_the_crop(tts, monkeypatch):
    """0.7 s is 7 of the window's 20 latent frames: in chunks of 5, two are decoded, not the
    four of the whole window (nor a third pulled and thrown away)."""
    import moss_tts.models.soundeffect_v2 as sfx

    vae, pulled = tts.model.vae, []

    def counted(latent, *, chunk_frames=None):
        for piece in type(vae).decode_chunks(vae, latent, chunk_frames=chunk_frames):
            pulled.append(len(piece))
            yield piece

    whole, _ = tts.synthesize(sound="rain", seconds=0.7, steps=2, seed=1)
    monkeypatch.setattr(sfx, "VAE_CHUNK_FRAMES", 5)
    monkeypatch.setattr(vae, "decode_chunks", counted)
    chunked, _ = tts.synthesize(sound="rain", seconds=0.7, steps=2, seed=1)
    assert pulled == [30, 30]
    assert_close(chunked, whole, atol=1e-6, what="audio decoded in chunks up to the crop")
