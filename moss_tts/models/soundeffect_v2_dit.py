"""MOSS-SoundEffect v2.0's WAN-style audio DiT (upstream `WanAudioModel` in moss_soundeffect_v2/
diffsynth/models/wan_audio_dit.py, its blocks from wan_video_dit.py, run as the pipeline's
model_fn_wan_video does): one velocity prediction for a batch of latents (the CFG pair) through
one ggml graph.
Tensor names are upstream's native ones (`blocks.<i>.self_attn.q.weight`, ...)."""

from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np

from ..errors import ConfigError, ShapeError
from ..ggml import ops
from ..ggml.graph import Graph, Tensor
from ..ggml.types import GGMLType
from ..nn import attention, layer_norm, linear, mlp, patchify, rms_norm, rope, split_heads
from . import spec
from .soundeffect_v2_vae import whole_numbers

PREFIX = "moss.soundeffect_v2.dit"     # its GGUF metadata keys
LAYER_PREFIX = "blocks.{}."
ROPE_BASE = 10000.0        # the "dac" 1-D RoPE (wan_audio_dit.py precompute_freqs_cis_1d)
TIME_BASE = 10000.0        # the sinusoidal timestep embedding
N_MOD = 6                  # shift/scale/gate for self-attention, then for the FFN
KEY_LANES = 16             # tinyBLAS's f32 lanes on AVX-512 (a multiple of AVX2's 8): `padded_keys`


@dataclass(frozen=True)
class WanAudioConfig:
    """transformer/config.json (field names as upstream's); vae_type "dac" only (the 1-D RoPE
    over the whole head; "oobleck"'s scaled partial RoPE is not MOSS-SoundEffect v2's)."""

    in_dim: int
    out_dim: int
    text_dim: int
    freq_dim: int
    eps: float
    patch_size: tuple
    dim: int
    ffn_dim: int
    num_heads: int
    num_layers: int

    def __post_init__(self):
        if isinstance(self.patch_size, (tuple, list, np.ndarray)):    # JSON's list, GGUF's array
            object.__setattr__(self, "patch_size", whole_numbers(self.patch_size))
        p = self.patch_size
        if not isinstance(p, tuple) or len(p) != 1 or not isinstance(p[0], int) or p[0] < 1:
            raise ConfigError(f"WanAudio: patch_size must be one positive size, got {p}")
        if self.dim % self.num_heads or (self.dim // self.num_heads) % 2:
            raise ConfigError(f"WanAudio: dim {self.dim} must split into {self.num_heads} heads "
                              "of an even size (RoPE rotates pairs)")
        if self.freq_dim % 2:
            raise ConfigError(f"WanAudio: freq_dim must be even, got {self.freq_dim}")

    @classmethod
    def from_config(cls, config: dict) -> "WanAudioConfig":
        """transformer/config.json: its fields by upstream's names; `has_image_input` and a
        `vae_type` other than "dac" are another model's (§family-10.4)."""
        if config.get("has_image_input"):
            raise ConfigError("transformer/config.json: has_image_input is set — an image-"
                              "conditioned WAN model, not MOSS-SoundEffect v2.0's audio DiT")
        if config.get("vae_type", "dac") != "dac":
            raise ConfigError(f"transformer/config.json: vae_type {config['vae_type']!r}; only "
                              "\"dac\" (MOSS-SoundEffect v2.0's 1-D RoPE) is supported")
        try:
            return cls(**{f.name: config[f.name] for f in fields(cls)})
        except KeyError as e:
            raise ConfigError(f"transformer/config.json lacks {e.args[0]!r}") from None

    @classmethod
    def from_gguf(cls, meta) -> "WanAudioConfig":
        return spec.config_from_gguf(cls, meta, PREFIX)

    def to_metadata(self) -> dict:
        return spec.config_to_metadata(self, PREFIX)

    @property
    def head_dim(self) -> int:
        return self.dim // self.num_heads

    @property
    def patch(self) -> int:
        return self.patch_size[0]

    def layer_spec(self) -> tuple[spec.TensorSpec, ...]:
        """One block below `blocks.<i>.`; Linear weights (out, in)."""
        d, f = self.dim, self.ffn_dim
        T = spec.TensorSpec
        attn = tuple(T(f"{kind}.{p}.{w}", (d, d) if w == "weight" else (d,))
                     for kind in ("self_attn", "cross_attn") for p in "qkvo"
                     for w in ("weight", "bias"))
        norms = tuple(T(f"{kind}.norm_{p}.weight", (d,))
                      for kind in ("self_attn", "cross_attn") for p in "qk")
        return attn + norms + (T("norm3.weight", (d,)), T("norm3.bias", (d,)),
                               T("ffn.0.weight", (f, d)), T("ffn.0.bias", (f,)),
                               T("ffn.2.weight", (d, f)), T("ffn.2.bias", (d,)),
                               T("modulation", (1, N_MOD, d)))

    def tensor_shapes(self) -> dict[str, tuple]:
        d, p = self.dim, self.patch
        shapes = {"patch_embedding.weight": (d, self.in_dim, p), "patch_embedding.bias": (d,),
                  "text_embedding.0.weight": (d, self.text_dim), "text_embedding.0.bias": (d,),
                  "text_embedding.2.weight": (d, d), "text_embedding.2.bias": (d,),
                  "time_embedding.0.weight": (d, self.freq_dim), "time_embedding.0.bias": (d,),
                  "time_embedding.2.weight": (d, d), "time_embedding.2.bias": (d,),
                  "time_projection.1.weight": (N_MOD * d, d),
                  "time_projection.1.bias": (N_MOD * d,),
                  "head.head.weight": (self.out_dim * p, d), "head.head.bias": (self.out_dim * p,),
                  "head.modulation": (1, 2, d)}
        for i in range(self.num_layers):
            shapes |= spec.shapes(self.layer_spec(), LAYER_PREFIX.format(i))
        return shapes


@dataclass(frozen=True)
class WanAudioBlock:
    """One block's weights; attribute = native name below `blocks.<i>.` (C20)."""

    self_attn_q_weight: Tensor
    self_attn_q_bias: Tensor
    self_attn_k_weight: Tensor
    self_attn_k_bias: Tensor
    self_attn_v_weight: Tensor
    self_attn_v_bias: Tensor
    self_attn_o_weight: Tensor
    self_attn_o_bias: Tensor
    cross_attn_q_weight: Tensor
    cross_attn_q_bias: Tensor
    cross_attn_k_weight: Tensor
    cross_attn_k_bias: Tensor
    cross_attn_v_weight: Tensor
    cross_attn_v_bias: Tensor
    cross_attn_o_weight: Tensor
    cross_attn_o_bias: Tensor
    self_attn_norm_q_weight: Tensor
    self_attn_norm_k_weight: Tensor
    cross_attn_norm_q_weight: Tensor
    cross_attn_norm_k_weight: Tensor
    norm3_weight: Tensor
    norm3_bias: Tensor
    ffn_0_weight: Tensor
    ffn_0_bias: Tensor
    ffn_2_weight: Tensor
    ffn_2_bias: Tensor
    modulation: Tensor


def time_sinusoid(timesteps, freq_dim: int) -> np.ndarray:
    """(B,) timesteps (σ·1000) → (B, freq_dim) f32: [cos(t·w_i) | sin(t·w_i)], cos first,
    w_i = 10000^(−i/half); in float64 on the host as upstream (angles reach ~1000 rad)."""
    half = freq_dim // 2
    w = TIME_BASE ** (-np.arange(half, dtype=np.float64) / half)
    angles = np.outer(np.asarray(timesteps, dtype=np.float32).astype(np.float64), w)
    return np.concatenate([np.cos(angles), np.sin(angles)], axis=1).astype(np.float32)


def row_of(table: Tensor, k: int, n_rows: int) -> Tensor:
    """Row block k of `table` [n_rows·D, B] → [D, B] (contiguous)."""
    d = table.ne[0] // n_rows
    return ops.cont(ops.view(table, (d, table.ne[1]), (table.nb[1],), k * table.nb[0] * d))


def table_row(table: Tensor, k: int, g: Graph) -> Tensor:
    """Row k [D] of a modulation parameter (1, n, D) = [D, n, 1]."""
    return ops.view(table, (table.ne[0],), None, k * table.nb[1], graph=g)


def modulate(x: Tensor, shift: Tensor, scale: Tensor) -> Tensor:
    """x [D, T·B] · (1 + scale) + shift, scale and shift [D, B] per batch item."""
    d, b = shift.ne[0], shift.ne[1]
    one_plus = ops.reshape(ops.scale_bias(scale, 1.0, 1.0), d, 1, b)
    y = ops.add(ops.mul(per_item(x, x.ne[1] // b), one_plus), ops.reshape(shift, d, 1, b))
    return ops.reshape(y, d, x.ne[1])


def per_item(x: Tensor, n: int) -> Tensor:
    """[D, n·B] → [D, n, B] (rows of each batch item together)."""
    return ops.reshape(x, x.ne[0], n, x.ne[1] // n)


def heads_attention(q: Tensor, k: Tensor, v: Tensor, *, n_items: int, n_head: int,
                    key_mask: Tensor | None = None) -> Tensor:
    """q [D, Tq·B], k and v [D, Tk·B] → softmax(q·kᵀ/√Dh)·v per item and head [D, Tq·B]:
    no mask, not causal (SDPA defaults). `key_mask` [Tk', Tq] (Tk' = `padded_keys(Tk)`): the
    keys are zero-padded to Tk' and the mask's −inf gives the padding no weight."""
    tq, tk = q.ne[1] // n_items, k.ne[1] // n_items
    q, k, v = (split_heads(a, n_head) for a in (q, k, v))        # [Dh, H, T·B]
    dh = q.ne[0]
    out = None
    for b in range(n_items):
        qb, kb, vb = (ops.view(a, (dh, n_head, n), a.nb[1:3], b * n * a.nb[2])
                      for a, n in ((q, tq), (k, tk), (v, tk)))
        if key_mask is not None:
            extra = key_mask.ne[0] - tk
            kb, vb = (ops.pad(a, (0, 0), (0, 0), (0, extra)) for a in (kb, vb))
        part = attention(qb, kb, vb, key_mask, scale=dh ** -0.5)   # [D, Tq]
        out = part if out is None else ops.concat(out, part, 1)
    return out


def padded_keys(n: int) -> int:
    """Keys a softmax·V product contracts over, rounded up to what ggml's f32 GEMM (llamafile's
    tinyBLAS) takes: a length not a multiple of its 16 lanes falls back to one dot product a row
    (the p·V of 1500 frames ran 1.24× slower, 8-9 % of a step; docs/performance.md)."""
    return -(-n // KEY_LANES) * KEY_LANES


def key_mask(n_queries: int, n_keys: int) -> np.ndarray | None:
    """The additive mask [n_queries, padded_keys(n_keys)] of the zero padding (−inf), or None
    where no padding is needed."""
    width = padded_keys(n_keys)
    if width == n_keys:
        return None
    mask = np.zeros((n_queries, width), np.float32)
    mask[:, n_keys:] = -np.inf
    return mask


def attention_branch(x: Tensor, source: Tensor, blk: WanAudioBlock, kind: str,
                     cfg: WanAudioConfig, *, n_items: int, positions: Tensor | None = None,
                     key_mask: Tensor | None = None):
    """q from x [D, T·B], k and v from source [D, S·B] (x itself, or the projected context) →
    o(attention) [D, T·B], each item attending to its own rows. kind "self_attn" or
    "cross_attn": q/k RMSNorm over the whole D (all heads jointly, before the split); RoPE only
    with positions (self-attention); no mask (cross-attention sees the zero-padding rows too)."""
    def weight(name: str) -> Tensor:
        return getattr(blk, f"{kind}_{name}")

    eps, h = cfg.eps, cfg.num_heads
    q = rms_norm(linear(x, weight("q_weight"), weight("q_bias")), weight("norm_q_weight"), eps=eps)
    k = rms_norm(linear(source, weight("k_weight"), weight("k_bias")), weight("norm_k_weight"),
                 eps=eps)
    v = linear(source, weight("v_weight"), weight("v_bias"))
    if positions is not None:
        # RoPE rotates interleaved pairs (x[2i], x[2i+1]): ggml's "normal" mode
        q, k = (ops.reshape(rope(split_heads(a, h), positions, mode="normal", base=ROPE_BASE),
                            cfg.dim, a.ne[1]) for a in (q, k))
    o = heads_attention(q, k, v, n_items=n_items, n_head=h, key_mask=key_mask)
    return linear(o, weight("o_weight"), weight("o_bias"))


def gated_residual(x: Tensor, y: Tensor, gate: Tensor, n_items: int) -> Tensor:
    """x + gate · y for x, y [D, T·B] and a gate [D, B] per item."""
    d, n = x.ne[0], x.ne[1] // n_items
    return ops.add(x, ops.reshape(ops.mul(per_item(y, n), ops.reshape(gate, d, 1, n_items)),
                                  d, x.ne[1]))


def block(x: Tensor, context: Tensor, tmod: Tensor, blk: WanAudioBlock, cfg: WanAudioConfig,
          positions: Tensor, *, il: int, n_items: int,
          frame_mask: Tensor | None = None) -> Tensor:
    """One DiT block, x [D, T·B] → [D, T·B]; tmod [6·D, B] the time projection; frame_mask the
    self-attention's `key_mask` where the frames need padding."""
    eps = cfg.eps
    # block.modulation [1, 6, D] + t_mod, chunked: shift_msa, scale_msa, gate_msa, shift_mlp,
    # scale_mlp, gate_mlp
    mod = [ops.add(row_of(tmod, k, N_MOD), table_row(blk.modulation, k, x.graph))
           for k in range(N_MOD)]
    shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp = mod
    h = modulate(layer_norm(x, eps=eps), shift_msa, scale_msa)
    x = gated_residual(x, attention_branch(h, h, blk, "self_attn", cfg, n_items=n_items,
                                           positions=positions, key_mask=frame_mask),
                       gate_msa, n_items)
    h = layer_norm(x, blk.norm3_weight, blk.norm3_bias, eps=eps)
    x = ops.add(x, attention_branch(h, context, blk, "cross_attn", cfg, n_items=n_items))
    h = modulate(layer_norm(x, eps=eps), shift_mlp, scale_mlp)
    f = mlp(h, blk.ffn_0_weight, blk.ffn_2_weight, activation="gelu_tanh", b_in=blk.ffn_0_bias,
            b_out=blk.ffn_2_bias)
    x = gated_residual(x, f, gate_mlp, n_items)
    return ops.name(x, f"dit.{il}.out")


@dataclass(frozen=True)
class WanAudioWeights:
    """Every weight of the DiT by native name; blocks as records."""

    tensors: object
    blocks: tuple

    @classmethod
    def from_tensors(cls, tensors, cfg: WanAudioConfig) -> "WanAudioWeights":
        return cls(tensors, tuple(spec.fill_record(WanAudioBlock, tensors, LAYER_PREFIX.format(i),
                                                   cfg.layer_spec())
                                  for i in range(cfg.num_layers)))

    def __getitem__(self, name: str) -> Tensor:
        return self.tensors[name]


def embed_inputs(latent: Tensor, sinusoid: Tensor, context: Tensor, w: WanAudioWeights,
                 cfg: WanAudioConfig):
    """The three stems: patch embedding of latent [in_dim, F·p, B] → x [D, F·B]; the time MLP of
    sinusoid [freq_dim, B] → temb [D, B] and tmod [6·D, B]; the text MLP of context
    [text_dim, L, B] → [D, L·B]."""
    p, d, b = cfg.patch, cfg.dim, latent.ne[2]
    frames = ops.reshape(latent, cfg.in_dim, latent.ne[1] * b)
    # Conv1d with kernel = stride = p: a linear map of each patch (channel c, offset j at c·p + j)
    kernel = w["patch_embedding.weight"]                     # [p, in_dim, D]
    x = linear(patchify(frames, p),
               ops.view(kernel, (cfg.in_dim * p, d), (kernel.nb[2],), graph=latent.graph),
               w["patch_embedding.bias"])
    temb = linear(ops.silu(linear(sinusoid, w["time_embedding.0.weight"],
                                  w["time_embedding.0.bias"])),
                  w["time_embedding.2.weight"], w["time_embedding.2.bias"])
    tmod = linear(ops.silu(temb), w["time_projection.1.weight"], w["time_projection.1.bias"])
    rows = ops.reshape(context, cfg.text_dim, context.ne[1] * b)
    ctx = mlp(rows, w["text_embedding.0.weight"], w["text_embedding.2.weight"],
              activation="gelu_tanh", b_in=w["text_embedding.0.bias"],
              b_out=w["text_embedding.2.bias"])
    return x, temb, tmod, ctx


def head(x: Tensor, temb: Tensor, w: WanAudioWeights, cfg: WanAudioConfig) -> Tensor:
    """x [D, F·B] → velocity [out_dim·p, F·B]: the head is modulated by temb (not tmod),
    head.modulation [1, 2, D] + temb chunked as shift, scale."""
    shift, scale = (ops.add(temb, table_row(w["head.modulation"], k, x.graph)) for k in range(2))
    h = modulate(layer_norm(x, eps=cfg.eps), shift, scale)
    return linear(h, w["head.head.weight"], w["head.head.bias"])


def build_forward(g: Graph, w: WanAudioWeights, cfg: WanAudioConfig, *, n_samples: int,
                  n_items: int, n_context: int) -> Tensor:
    """Inputs `dit.latent` (B, n_samples, in_dim), `dit.sinusoid` (B, freq_dim), `dit.context`
    (B, L, text_dim), `dit.positions` (F·B,) I32 → output `dit.velocity` (B, n_samples,
    out_dim)."""
    if n_samples % cfg.patch:
        raise ShapeError(f"WanAudio: {n_samples} latent frames are not a multiple of the patch "
                         f"size {cfg.patch}")
    n_frames = n_samples // cfg.patch
    latent = g.input("dit.latent", (n_items, n_samples, cfg.in_dim))
    sinusoid = g.input("dit.sinusoid", (n_items, cfg.freq_dim))
    context = g.input("dit.context", (n_items, n_context, cfg.text_dim))
    positions = g.input("dit.positions", (n_frames * n_items,), GGMLType.I32)
    # the self-attention's keys padded where the frames are not a multiple of KEY_LANES (the
    # context's 512 rows are)
    frame_mask = None if padded_keys(n_frames) == n_frames else \
        g.input("dit.frame_mask", (n_frames, padded_keys(n_frames)))
    x, temb, tmod, ctx = embed_inputs(latent, sinusoid, context, w, cfg)
    for il, blk in enumerate(w.blocks):
        x = block(x, ctx, tmod, blk, cfg, positions, il=il, n_items=n_items,
                  frame_mask=frame_mask)
    y = head(x, temb, w, cfg)              # [p·C, F·B], p-major inside a patch
    # 'b f (p c) -> b c (f p)': in ggml order [C, p·F, B] is the same memory, a reshape
    return g.output(ops.reshape(y, cfg.out_dim, n_samples, n_items), "dit.velocity",
                    ndim=3)


class WanAudioDiT:
    """The DiT over loaded weights; one graph per (frames, batch, context length), replayed."""

    def __init__(self, tensors, cfg: WanAudioConfig, backend=None):
        self.cfg = cfg
        self.weights = WanAudioWeights.from_tensors(tensors, cfg)
        self.backend = backend
        self._graphs: dict[tuple, Graph] = {}

    def _graph(self, n_samples: int, n_items: int, n_context: int) -> Graph:
        key = (n_samples, n_items, n_context)
        if key not in self._graphs:
            g = Graph(self.backend, name="soundeffect_v2.dit")
            build_forward(g, self.weights, self.cfg, n_samples=n_samples, n_items=n_items,
                          n_context=n_context)
            self._graphs[key] = g
        return self._graphs[key]

    def forward(self, latent, timestep, context) -> np.ndarray:
        """latent (B, T, in_dim), timestep scalar or (B,) (σ·1000), context (B, L, text_dim) →
        velocity (B, T, out_dim) f32. B = 2 carries the CFG pair (cond, uncond) in one graph."""
        latent = np.asarray(latent, dtype=np.float32)
        context = np.asarray(context, dtype=np.float32)
        if latent.ndim != 3 or context.ndim != 3 or latent.shape[0] != context.shape[0] \
                or latent.shape[2] != self.cfg.in_dim or context.shape[2] != self.cfg.text_dim:
            raise ShapeError(f"WanAudio.forward: latent {latent.shape} and context "
                             f"{context.shape} must be (B, T, {self.cfg.in_dim}) and "
                             f"(B, L, {self.cfg.text_dim})")
        b, t, _ = latent.shape
        steps = np.broadcast_to(np.asarray(timestep, dtype=np.float32), (b,))
        n_frames = t // self.cfg.patch
        g = self._graph(t, b, context.shape[1])
        feed = {"dit.latent": latent, "dit.sinusoid": time_sinusoid(steps, self.cfg.freq_dim),
                "dit.context": context,
                "dit.positions": np.tile(np.arange(n_frames, dtype=np.int32), b)}
        mask = key_mask(n_frames, n_frames)
        if mask is not None:
            feed["dit.frame_mask"] = mask
        return g.run(feed, ["dit.velocity"])["dit.velocity"]

    def close(self) -> None:
        for g in self._graphs.values():
            g.close()
        self._graphs.clear()
