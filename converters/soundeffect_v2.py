"""MOSS-SoundEffect v2.0 pipeline directory → one GGUF holding its three components, their
configs, model_index.json's rates and the tokenizer.json text (docs/upstream-notes.md
§family-10.1).

    python -m moss_tts convert sfx-v2 --model DIR_OR_REPO --out sfx-v2.gguf [--outtype q8_0]
        [--embed-type f16]

The directory is upstream's published one (what `WanAudioPipeline.from_pretrained` reads):
`model_index.json`, `transformer/` (config.json, diffusers-named safetensors), `text_encoder/`
(a Qwen3 causal LM), `tokenizer/`, `vae/vae_128d_48k.pth` (a torch pickle: the DAC state dict
and its constructor kwargs, read without torch) and `scheduler/` (its shift is overridden by
every call: not read). One file, so `--model` names one thing; the names do not collide: the
text encoder takes llama.cpp's Qwen3 names, the DiT upstream's native ones (the diffusers
names mapped back as upstream's loader maps them), the VAE decoder upstream's with weight norm
fused and each convolution laid out tap by tap (models/soundeffect_v2_vae.py).

Types: `--outtype` reaches the matrices of the DiT's and the text encoder's linears; the token
table is `--embed-type` (f32 by default, as every family's); the DiT's modulation tables,
norms, biases, its Conv1d patch embedding and the whole VAE decoder (about 2 % of the
weights; its convolutions are run tap by tap in f32) stay f32.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np

from moss_tts.errors import ConfigError, ModelFileError
from moss_tts.models.soundeffect_v2 import (FORMAT_VERSION, KIND, MAX_SECONDS_KEY,
                                            SAMPLE_RATE_KEY, TOKENIZER_KEY)
from moss_tts.models.soundeffect_v2_dit import LAYER_PREFIX, WanAudioConfig
from moss_tts.models.soundeffect_v2_text import TextEncoderConfig
from moss_tts.models.soundeffect_v2_vae import (DACConfig, conv_taps, conv_transpose_rows,
                                                tensor_shapes as vae_shapes)

from .checkpoint import (SafetensorsCheckpoint, TorchBinCheckpoint, fuse_weight_norm,
                         read_json, resolve_model_dir)
from .delay import find_tokenizer, qwen3_config
from .gguf_io import Lazy, TypeFor, group_types, renamed
from .registry import finish

logger = logging.getLogger(__name__)

# what `convert` fetches of a hub repo: configs, tokenizer, safetensors, the VAE's pickle
FILES = ("*.json", "*.safetensors", "*.pth", "*.txt", "*.md")
VAE_FILE = "vae/vae_128d_48k.pth"
TEXT_SOURCE = "model."            # Qwen3ForCausalLM keeps the backbone below `model.`
# the diffusers names of the DiT's transformer/ → upstream's native ones, as wan_audio.py's
# _convert_hf_dit_state_dict maps them (hf_export.py writes the inverse): per block, then global
BLOCK_NAMES = {f"attn{n}.{hf}": f"{native}.{ours}"
               for n, native in ((1, "self_attn"), (2, "cross_attn"))
               for hf, ours in (("norm_q.weight", "norm_q.weight"),
                                ("norm_k.weight", "norm_k.weight"),
                                *((f"to_{p}.{w}", f"{p}.{w}") for p in "qkv"
                                  for w in ("weight", "bias")),
                                ("to_out.0.weight", "o.weight"), ("to_out.0.bias", "o.bias"))} | {
    "ffn.net.0.proj.weight": "ffn.0.weight", "ffn.net.0.proj.bias": "ffn.0.bias",
    "ffn.net.2.weight": "ffn.2.weight", "ffn.net.2.bias": "ffn.2.bias",
    "norm2.weight": "norm3.weight", "norm2.bias": "norm3.bias",      # HF's norm2 is norm3
    "scale_shift_table": "modulation"}
GLOBAL_NAMES = {
    "condition_embedder.text_embedder.linear_1.weight": "text_embedding.0.weight",
    "condition_embedder.text_embedder.linear_1.bias": "text_embedding.0.bias",
    "condition_embedder.text_embedder.linear_2.weight": "text_embedding.2.weight",
    "condition_embedder.text_embedder.linear_2.bias": "text_embedding.2.bias",
    "condition_embedder.time_embedder.linear_1.weight": "time_embedding.0.weight",
    "condition_embedder.time_embedder.linear_1.bias": "time_embedding.0.bias",
    "condition_embedder.time_embedder.linear_2.weight": "time_embedding.2.weight",
    "condition_embedder.time_embedder.linear_2.bias": "time_embedding.2.bias",
    "condition_embedder.time_proj.weight": "time_projection.1.weight",
    "condition_embedder.time_proj.bias": "time_projection.1.bias",
    "scale_shift_table": "head.modulation",
    "proj_out.weight": "head.head.weight", "proj_out.bias": "head.head.bias",
    "patch_embedding.weight": "patch_embedding.weight",
    "patch_embedding.bias": "patch_embedding.bias"}
# the weight norm's two halves, in torch's old and new spellings (the same math)
WEIGHT_NORM = ((".weight_g", ".weight_v"),
               (".parametrizations.weight.original0", ".parametrizations.weight.original1"))
# checkpoint keys never read, with the reason (C21: nothing is dropped silently)
IGNORED_TEXT = {"lm_head.weight": "the causal LM's head: the encoder takes hidden states"}
VAE_UNUSED = ("encoder.", "quant_conv.", "quantizer.")   # the encoder side: not run to sample


def pipeline_rates(model_dir: Path) -> dict:
    """model_index.json's sample rate and the latent window (its defaults as upstream's
    MossSoundEffectPipeline.from_pretrained: 48000, 30)."""
    index = read_json(model_dir / "model_index.json")
    try:
        rates = {SAMPLE_RATE_KEY: int(index.get("sample_rate", 48000)),
                 MAX_SECONDS_KEY: int(index.get("max_inference_seconds", 30))}
    except (TypeError, ValueError):
        raise ConfigError(f"{model_dir}/model_index.json: sample_rate and "
                          "max_inference_seconds must be whole numbers") from None
    if min(rates.values()) < 1:
        raise ConfigError(f"{model_dir}/model_index.json: sample_rate and "
                          "max_inference_seconds must be positive")
    return rates


def dit_names(cfg: WanAudioConfig) -> dict[str, str]:
    """{diffusers name: native name} of every DiT tensor."""
    names = dict(GLOBAL_NAMES)
    for i in range(cfg.num_layers):
        block = LAYER_PREFIX.format(i)
        names |= {block + hf: block + ours for hf, ours in BLOCK_NAMES.items()}
    return names


def text_config(model_dir: Path) -> TextEncoderConfig:
    config = read_json(model_dir / "text_encoder" / "config.json")
    try:
        return TextEncoderConfig(qwen3_config(config), vocab_size=int(config["vocab_size"]))
    except KeyError as e:
        raise ConfigError(f"text_encoder/config.json lacks {e.args[0]!r}") from None


def vae_tensors(ckpt: TorchBinCheckpoint, cfg: DACConfig) -> tuple[dict, list[str]]:
    """The decoder's tensors in the port's layout (weight norm fused; convs tap by tap; α as
    vectors), loaded when written; and the keys left (the encoder side is accounted for)."""
    out, used = {}, set()
    for name, shape in vae_shapes(cfg).items():
        base = name[:-len(".weight")] if name.endswith(".weight") else None
        halves = next(((base + g, base + v) for g, v in WEIGHT_NORM
                       if base and base + g in ckpt and base + v in ckpt), None)
        if halves is not None:
            used |= set(halves)
            out[name] = Lazy(shape, np.float32, lambda h=halves, n=name: _laid_out(ckpt, h, n))
        elif name in ckpt:
            used.add(name)
            out[name] = Lazy(shape, np.float32, lambda n=name: _plain(ckpt, n))
    left = [n for n in ckpt.keys() if n not in used and not n.startswith(VAE_UNUSED)]
    return out, left


def _laid_out(ckpt, halves: tuple[str, str], name: str) -> np.ndarray:
    g, v = ckpt[halves[0]], ckpt[halves[1]]
    w = fuse_weight_norm(g, v).reshape(v.shape)
    # a ConvTranspose1d stores (in, out, k): its gain is per input channel, its bias per output
    transposed = v.shape[0] != ckpt.shape(name[:-len(".weight")] + ".bias")[0]
    return conv_transpose_rows(w) if transposed else conv_taps(w)


def _plain(ckpt, name: str) -> np.ndarray:
    value = ckpt[name].astype(np.float32, copy=False)
    if name.endswith(".alpha"):
        return value.reshape(-1)                 # Snake's α is stored (1, C, 1)
    return conv_taps(value) if value.ndim == 3 else value


def sfx_group(name: str) -> str:
    """A tensor's type group (gguf_io.group_types): the text encoder's and the DiT's linears
    ("block"), the token table ("embed"); everything else f32 (1-D, 3-D and the modulation
    tables are f32 whatever the group)."""
    if name == "token_embd.weight":
        return "embed"
    if name.startswith(("blk.", "blocks.", "text_embedding.", "time_embedding.",
                        "time_projection.", "head.head.")):
        return "block"
    return "f32"


def tensor_types(outtype="f32", *, embed="f32") -> TypeFor:
    return group_types(sfx_group, outtype, head="f32", embed=embed)


def convert(model: str, out, *, outtype: str = "f32", embed_type: str = "f32",
            strict: bool = False, progress=None) -> Path:
    type_for = tensor_types(outtype, embed=embed_type)    # a bad type fails before any read
    model_dir = resolve_model_dir(model, allow_patterns=FILES)
    rates = pipeline_rates(model_dir)
    dit_cfg = WanAudioConfig.from_config(read_json(model_dir / "transformer" / "config.json"))
    text_cfg = text_config(model_dir)
    tokenizer = find_tokenizer(_tokenizer_dir(model_dir))
    vae_path = model_dir / VAE_FILE
    if not vae_path.is_file():
        raise ModelFileError(f"{model_dir}: no {VAE_FILE} (upstream's loader reads that file; "
                             "its safetensors branch cannot build the VAE either)")
    with SafetensorsCheckpoint(model_dir / "transformer") as dit, \
            SafetensorsCheckpoint(model_dir / "text_encoder") as text, \
            TorchBinCheckpoint(vae_path) as vae:
        vae_cfg = DACConfig.from_kwargs((vae.metadata or {}).get("kwargs") or {})
        _check_chain(dit_cfg, text_cfg, vae_cfg, rates)
        tensors, unmapped = renamed(dit, dit_names(dit_cfg))
        more, left = renamed(text, text_cfg.source_names(TEXT_SOURCE), IGNORED_TEXT.__contains__)
        tensors, unmapped = tensors | more, unmapped + [f"text_encoder/{n}" for n in left]
        more, left = vae_tensors(vae, vae_cfg)
        tensors, unmapped = tensors | more, unmapped + [f"vae/{n}" for n in left]
        expected = text_cfg.tensor_shapes() | dit_cfg.tensor_shapes() | vae_shapes(vae_cfg)
        meta = (text_cfg.to_metadata() | dit_cfg.to_metadata() | vae_cfg.to_metadata() | rates
                | {TOKENIZER_KEY: tokenizer})
        return finish(model_dir, out, tensors, unmapped, expected, meta, kind=KIND,
                      version=FORMAT_VERSION, type_for=type_for, strict=strict,
                      progress=progress)


def _tokenizer_dir(model_dir: Path) -> Path:
    """tokenizer/ (WanPrompter's), else text_encoder/ where a copy may sit."""
    for sub in ("tokenizer", "text_encoder"):
        if (model_dir / sub / "tokenizer.json").is_file():
            return model_dir / sub
    return model_dir / "tokenizer"


def _check_chain(dit: WanAudioConfig, text: TextEncoderConfig, vae: DACConfig,
                 rates: dict) -> None:
    """The components fit one another: the DiT reads the encoder's width and the VAE's latent,
    and the VAE's frames tile the window (upstream would fail mid-call on each)."""
    problems = []
    if dit.text_dim != text.language_config.hidden_size:
        problems.append(f"the DiT's text_dim {dit.text_dim} is not the text encoder's width "
                        f"{text.language_config.hidden_size}")
    if not dit.in_dim == dit.out_dim == vae.latent_dim:
        problems.append(f"the DiT's in/out dims {dit.in_dim}/{dit.out_dim} are not the VAE's "
                        f"latent_dim {vae.latent_dim}")
    if vae.upsampling != vae.hop_length:
        problems.append(f"the VAE decodes {vae.upsampling} samples a frame but hops "
                        f"{vae.hop_length}")
    if problems:
        raise ConfigError("the pipeline's components do not fit: " + "; ".join(problems))
    if rates[SAMPLE_RATE_KEY] != vae.sample_rate:
        logger.warning("model_index.json's sample_rate %d differs from the VAE's %d; the "
                       "pipeline's is used, as upstream", rates[SAMPLE_RATE_KEY], vae.sample_rate)
