"""The DAC VAE decoder of MOSS-SoundEffect v2.0 (moss_tts/models/soundeffect_v2_vae.py) against
the float64 reference fixtures/reference/soundeffect_v2.py on a seeded tiny config, and against
upstream's own DAC.decode: fixtures/data/soundeffect_v2_upstream.npz, written by
`bench/soundeffect_v2_upstream.py` (its docstring has the command); each with a sensitivity guard
(style C28)."""

import math
from pathlib import Path

import numpy as np
import pytest

from fixtures.compare import assert_close, assert_differs
from fixtures.make_soundeffect_v2 import dac_port_arrays as port_arrays
from fixtures.make_soundeffect_v2 import load_upstream_npz
from fixtures.reference import soundeffect_v2 as ref
from moss_tts.errors import ConfigError, InputError, ModelFileError
from moss_tts.ggml import TensorStore
from moss_tts.models.soundeffect_v2_vae import DILATIONS, DACConfig, DACDecoder, tensor_shapes

UPSTREAM = Path(__file__).resolve().parents[2] / "fixtures/data/soundeffect_v2_upstream.npz"
# f32 ggml vs float64 through ~20 convolutions (≤ 7 taps of ≤ 16-term dots), Snake (sinf) and
# residual sums, then tanh (|audio| ≲ 0.8): measured ≤ 5e-8 on these configs; 2e-6 leaves room
# for other summation orders (thread counts, CPU kernels) and is still 1e-4 of the guards' moves.
AUDIO_ATOL = 2e-6
# upstream's torch f32 vs ggml f32: the same math rounded in another order; measured 1.2e-7.
UPSTREAM_ATOL = 2e-6
# a chunk's graph multiplies fewer rows than the whole one: ggml may pick another matmul
# kernel by the row count (~1e-7 apart per product, issue 31), so not bit-equal
CHUNK_ATOL = 1e-6
TINY = {"encoder_dim": 4, "encoder_rates": [2, 3], "latent_dim": 6, "decoder_dim": 16,
        "decoder_rates": [3, 2], "sample_rate": 48000, "continuous": True}


def random_state(cfg: DACConfig, seed: int) -> dict:
    """An upstream-named decoder state dict (weight_g / weight_v for weight-normed convs)."""
    rng = np.random.default_rng(seed)
    z, d, n = cfg.latent_dim, cfg.decoder_dim, len(cfg.decoder_rates)

    def conv(name, shape):
        return {name + ".weight_g": rng.uniform(0.3, 0.8, (shape[0], 1, 1)),
                name + ".weight_v": rng.standard_normal(shape),
                name + ".bias": 0.1 * rng.standard_normal(shape[0])}

    def alpha(name, c):
        return {name: rng.uniform(0.5, 1.5, (1, c, 1))}

    state = {"post_quant_conv.weight": rng.standard_normal((z, z, 1)) / math.sqrt(z),
             "post_quant_conv.bias": 0.1 * rng.standard_normal(z)}
    state |= conv("decoder.model.0", (d, z, 7))
    for i, s in enumerate(cfg.decoder_rates):
        p, c_in, c_out = f"decoder.model.{i + 1}.block.", cfg.channels(i - 1), cfg.channels(i)
        state |= alpha(p + "0.alpha", c_in)
        # ConvTranspose1d: (in, out, k), weight norm per input channel
        state |= {p + "1.weight_g": rng.uniform(0.3, 0.8, (c_in, 1, 1)),
                  p + "1.weight_v": rng.standard_normal((c_in, c_out, 2 * s)),
                  p + "1.bias": 0.1 * rng.standard_normal(c_out)}
        for u in range(len(DILATIONS)):
            q = f"{p}{u + 2}.block."
            state |= alpha(q + "0.alpha", c_out) | conv(q + "1", (c_out, c_out, 7))
            state |= alpha(q + "2.alpha", c_out) | conv(q + "3", (c_out, c_out, 1))
    c = cfg.channels(n - 1)
    state |= alpha(f"decoder.model.{n + 1}.alpha", c) | conv(f"decoder.model.{n + 2}", (1, c, 7))
    return {k: np.asarray(v, dtype=np.float32) for k, v in state.items()}


def decoder(state: dict, cfg: DACConfig):
    store = TensorStore(port_arrays(state), "cpu")
    return store, DACDecoder(store, cfg)


@pytest.mark.parametrize("rates", [(3, 2), (2, 4), (5,)])
def test_decode_matches_reference(rates):
    cfg = DACConfig.from_kwargs(TINY | {"decoder_rates": list(rates), "encoder_rates": list(rates)})
    state = random_state(cfg, seed=34 + len(rates))
    latent = np.random.default_rng(7).standard_normal((11, cfg.latent_dim)).astype(np.float32)
    store, vae = decoder(state, cfg)
    with store, vae:
        got = vae.decode(latent)
        want = ref.dac_decode(latent, state, cfg.decoder_rates)
        assert got.shape == (11 * cfg.hop_length,)
        assert_close(got, want, atol=AUDIO_ATOL, what="audio")
        assert np.abs(want).max() < 0.99      # not saturated: tanh would hide errors
        # guard: one latent value changed must move the audio
        wrong = latent.copy()
        wrong[5, 2] += 0.5
        assert_differs(vae.decode(wrong), want, atol=AUDIO_ATOL, what="audio of another latent")


def test_decode_replays_its_graph_and_takes_other_lengths():
    cfg = DACConfig.from_kwargs(TINY)
    state = random_state(cfg, seed=1)
    rng = np.random.default_rng(2)
    store, vae = decoder(state, cfg)
    with store, vae:
        for frames in (4, 1, 4):
            latent = rng.standard_normal((frames, cfg.latent_dim)).astype(np.float32)
            assert_close(vae.decode(latent), ref.dac_decode(latent, state, cfg.decoder_rates),
                         atol=AUDIO_ATOL, what=f"audio of {frames} frames")
        assert len(vae._graphs) == 2


@pytest.mark.parametrize("rates", [(3, 2), (5,)])
def test_a_decode_in_chunks_equals_the_whole_decode(rates, monkeypatch):
    """Each chunk decoded with `context_frames` of latent on either side gives the whole
    decode's samples (f32 kernel order aside), for chunks smaller and larger than the context;
    a context of 2 frames moves them (the guard: chunk seams are where a short context shows;
    `context_frames` is the field's upper bound, far samples' influence fading below the
    tolerance before it)."""
    cfg = DACConfig.from_kwargs(TINY | {"decoder_rates": list(rates), "encoder_rates": list(rates)})
    state = random_state(cfg, seed=5)
    latent = np.random.default_rng(3).standard_normal((70, cfg.latent_dim)).astype(np.float32)
    store, vae = decoder(state, cfg)
    with store, vae:
        whole = vae.decode(latent)
        for chunk in (1, 7, cfg.context_frames + 3, 69):
            assert_close(vae.decode(latent, chunk_frames=chunk), whole, atol=CHUNK_ATOL,
                         what=f"audio decoded {chunk} frames at a time")
        with pytest.raises(InputError, match="chunk_frames must be a whole number"):
            vae.decode(latent, chunk_frames=0)
        monkeypatch.setattr(DACConfig, "context_frames", property(lambda self: 2))
        assert_differs(vae.decode(latent, chunk_frames=7), whole, atol=CHUNK_ATOL,
                       what="audio decoded with a context of 2 frames")


@pytest.fixture(scope="module")
def upstream():
    return load_upstream_npz(UPSTREAM)


def test_decode_matches_upstream(upstream):
    cfg = DACConfig.from_kwargs(upstream["meta"]["dac_kwargs"])
    state = {k[len("vae.state."):]: v for k, v in upstream.items() if k.startswith("vae.state.")}
    assert set(port_arrays(state)) == set(tensor_shapes(cfg))   # upstream's names, all of them
    store, vae = decoder(state, cfg)
    with store, vae:
        want = upstream["vae.audio"]
        assert_close(vae.decode(upstream["vae.latent"]), want, atol=UPSTREAM_ATOL,
                     what="audio vs upstream")
        wrong = upstream["vae.latent"].copy()
        wrong[0, 0] -= 0.5
        assert_differs(vae.decode(wrong), want, atol=UPSTREAM_ATOL, what="audio, latent changed")


def test_missing_or_misshapen_tensor_is_one_error():
    cfg = DACConfig.from_kwargs(TINY)
    arrays = port_arrays(random_state(cfg, seed=3))
    del arrays["decoder.model.0.bias"]
    arrays["post_quant_conv.weight"] = arrays["post_quant_conv.weight"][:, :3]
    with TensorStore(arrays, "cpu") as store:
        with pytest.raises(ModelFileError, match="2 tensor problem.*post_quant_conv.weight"):
            DACDecoder(store, cfg)


def test_config_reads_kwargs_and_refuses_what_it_cannot_decode():
    cfg = DACConfig.from_kwargs(TINY | {"n_codebooks": 9})
    assert (cfg.hop_length, cfg.upsampling, cfg.channels(1)) == (6, 6, 4)
    assert DACConfig.from_kwargs({"continuous": True}).latent_dim == 64 * 16   # upstream's rule
    with pytest.raises(ConfigError, match="continuous"):
        DACConfig.from_kwargs(TINY | {"continuous": False})
    # a key DAC's constructor lacks is dropped, as audiotools' BaseModel.load drops it
    assert DACConfig.from_kwargs(TINY | {"hop": 6}) == DACConfig.from_kwargs(TINY)


def test_bad_latent_is_one_line_error():
    cfg = DACConfig.from_kwargs(TINY)
    store, vae = decoder(random_state(cfg, seed=4), cfg)
    with store, vae:
        with pytest.raises(InputError, match="frames, 6"):
            vae.decode(np.zeros((6, 4), np.float32))
        with pytest.raises(InputError, match="non-finite"):
            vae.decode(np.full((3, 6), np.nan, np.float32))
