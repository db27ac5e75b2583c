"""MOSS-SoundEffect v2.0's WAN audio DiT (models/soundeffect_v2_dit.py): one forward of a tiny
seeded model against the float64 numpy reference (fixtures/reference/soundeffect_v2_dit.py) and
against upstream's own `WanAudioModel` (fixture from bench/soundeffect_v2_dit_upstream.py)."""

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest

from fixtures.compare import assert_close, assert_differs
from fixtures.reference import soundeffect_v2_dit as ref
from moss_tts.errors import ConfigError
from moss_tts.ggml.weights import TensorStore
from moss_tts.models.soundeffect_v2_dit import WanAudioConfig, WanAudioDiT, key_mask, padded_keys

UPSTREAM = Path(__file__).resolve().parents[2] / "fixtures" / "data" / \
    "soundeffect_v2_dit_upstream.npz"
N_FRAMES, N_CONTEXT = 12, 7
# f32 through two blocks (≤ 64-term dots, |v| ≲ 6, RoPE positions < 20) against float64:
# measured ≤ 8e-7
F32_ATOL = 2e-5
# f32 against upstream's PyTorch f32 (both round, in different orders): measured ≤ 1.5e-6
UPSTREAM_ATOL = 2e-5


def tiny_config(patch: int) -> WanAudioConfig:
    return WanAudioConfig(in_dim=8, out_dim=6, text_dim=24, freq_dim=16, eps=1e-6,
                          patch_size=(patch,), dim=48, ffn_dim=64, num_heads=4, num_layers=2)


def random_weights(cfg: WanAudioConfig, rng) -> dict:
    """Seeded weights, modulations and norm gains included (never the 0/1 init)."""
    w = {}
    for name, shape in cfg.tensor_shapes().items():
        scale = 0.5 if len(shape) == 1 or "modulation" in name else shape[-1] ** -0.5
        a = rng.standard_normal(shape) * scale
        w[name] = (a + 1.0 if "norm" in name and name.endswith("weight") else a).astype(np.float32)
    return w


@pytest.fixture(scope="module", params=[1, 2], ids=["patch1", "patch2"])
def tiny(request):
    cfg = tiny_config(request.param)
    w = random_weights(cfg, np.random.default_rng(340 + request.param))
    store = TensorStore(w)
    dit = WanAudioDiT(store, cfg)
    yield cfg, w, dit
    dit.close()
    store.close()


def test_config_rejects_heads_that_do_not_split_into_pairs():
    with pytest.raises(ConfigError, match="even size"):
        dataclasses.replace(tiny_config(1), dim=36, num_heads=4)   # head_dim 9


# 12 samples: frames (12, or 6 at patch 2) that the self-attention pads to 16 keys under a mask;
# 32: frames (32 or 16) it takes as they are
@pytest.mark.parametrize("n_samples", [N_FRAMES, 32])
def test_forward_matches_reference(tiny, rng, n_samples):
    cfg, w, dit = tiny
    latent = rng.standard_normal((2, n_samples, cfg.in_dim)).astype(np.float32)
    context = rng.standard_normal((2, N_CONTEXT, cfg.text_dim)).astype(np.float32)
    steps = np.array([937.5, 250.0], dtype=np.float32)
    want = ref.forward(latent, steps, context, w, dataclasses.asdict(cfg))
    got = dit.forward(latent, steps, context)
    assert_close(got, want, atol=F32_ATOL, what="DiT velocity vs reference")
    # guard: one context row of item 0 changed moves item 0's velocity
    moved = context.copy()
    moved[0, 3] += 1.0
    assert_differs(dit.forward(latent, steps, moved)[0], want[0], atol=F32_ATOL,
                   what="velocity after one changed context row")


def test_keys_are_padded_to_whole_gemm_lanes_under_a_mask():
    assert [padded_keys(n) for n in (1, 16, 17, 250, 1500)] == [16, 16, 32, 256, 1504]
    assert key_mask(3, 32) is None
    mask = key_mask(2, 1500)
    assert mask.shape == (2, 1504) and not mask[:, :1500].any()
    assert np.all(np.isneginf(mask[:, 1500:]))


def test_cfg_pair_in_one_graph_equals_two_single_passes(tiny, rng):
    cfg, _, dit = tiny
    latent = np.repeat(rng.standard_normal((1, N_FRAMES, cfg.in_dim)), 2, 0).astype(np.float32)
    context = rng.standard_normal((2, N_CONTEXT, cfg.text_dim)).astype(np.float32)
    pair = dit.forward(latent, 500.0, context)
    singles = np.concatenate([dit.forward(latent[i:i + 1], 500.0, context[i:i + 1])
                              for i in range(2)])
    assert_close(pair, singles, atol=F32_ATOL, what="batched CFG pair vs single passes")
    # guard: the two items really differ (each item reads its own context)
    assert_differs(pair[0], pair[1], atol=F32_ATOL, what="cond vs uncond velocity")


@pytest.fixture(scope="module")
def upstream():
    z = np.load(UPSTREAM)
    raw = json.loads(str(z["config"]))
    fields = {f.name for f in dataclasses.fields(WanAudioConfig)}
    cfg = WanAudioConfig(**{k: tuple(v) if k == "patch_size" else v
                            for k, v in raw.items() if k in fields})
    w = {k[2:]: z[k] for k in z.files if k.startswith("w.")}
    store = TensorStore(w)
    dit = WanAudioDiT(store, cfg)
    yield cfg, w, z, dit
    dit.close()
    store.close()


def test_fixture_holds_exactly_the_declared_tensors(upstream):
    cfg, w, _, _ = upstream
    assert {n: v.shape for n, v in w.items()} == cfg.tensor_shapes()


def test_forward_matches_upstream(upstream):
    _, _, z, dit = upstream
    # upstream's layout is (B, C, F); the port's (B, F, C)
    latent = z["latent"].transpose(0, 2, 1)
    got = dit.forward(latent, z["timestep"], z["context"]).transpose(0, 2, 1)
    assert_close(got, z["velocity"], atol=UPSTREAM_ATOL, what="DiT velocity vs upstream")
    # guard: trimming the zero padding rows changes the output (cross-attention sees them all)
    n_valid = int(np.flatnonzero(np.abs(z["context"][0]).sum(1))[-1]) + 1
    trimmed = dit.forward(latent[:1], z["timestep"][:1], z["context"][:1, :n_valid])
    assert_differs(trimmed.transpose(0, 2, 1), z["velocity"][:1], atol=UPSTREAM_ATOL,
                   what="velocity with the padding rows trimmed")
