"""The MossTTSDelay checkpoints bench/delay.py benches, and their seeded random weights written in
upstream's published llama.cpp layout (a Qwen3 GGUF + `embeddings/*.npy` + `lm_heads/*.npy` +
`tokenizer/`, models/delay_published.py; upstream `moss_tts_delay/llama_cpp/conversion/`), so
that ours and upstream's llama.cpp route read the same backbone file.

Where each checkpoint's dimensions come from (upstream = the OpenMOSS MOSS-TTS repository):
- every Delay release shares `MossTTSDelayConfig`'s defaults (`configuration_moss_tts.py`):
  1024 codes + the pad code 1024 = 1025-row audio tables and heads, the token ids, 24 kHz; and
  the extended Qwen text vocabulary, 155648 rows in the released 8B (§family-2.1);
- tts: MOSS-TTS, "Qwen-8B scale" with 32 RVQ heads (`moss_tts_delay/README.md`): Qwen3-8B's
  36 × 4096, 32 / 8 heads of 128, SwiGLU 12288, theta 1e6 (§family-2.1), n_vq 32 (also the
  config default);
- ttsd: MOSS-TTSD v1.0, the same 8B with NVQ 16 (upstream's `moss_ttsd_model_card.md`, its
  Released Models table; `moss_tts_delay/finetuning/README.md` asks for `--n-vq 16` for it);
- voicegen: MOSS-VoiceGenerator, `MossTTSDelay` at 1.7B (upstream `README.md`, Released
  Models; the architecture per `moss_voice_generator_model_card.md`, 1.2): Qwen3-1.7B's
  28 × 2048, 16 / 8 heads of 128, SwiGLU 6144, theta 1e6 — the backbone bench/local.py benches
  as MossTTSLocal 1.7B (§family-3.1); n_vq 16, 1025-row tables and heads as the issue states
  for the published checkpoint (upstream's repository does not carry this release's
  config.json, which ships with the weights; vllm-omni's MOSS-TTS docs also give 16 codebooks
  for every Delay release but MOSS-TTS). The text vocabulary is taken as the 8B's extended
  155648, as bench/local.py takes it for MossTTSLocal 1.7B.
"""

from __future__ import annotations

import shutil
import sys
import time
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from converters.delay import tensor_types
from converters.gguf_io import Lazy, write_tensors
from fixtures.make_delay import add_llama_qwen3_keys, make_tokenizer_json
from moss_tts.ggml import F16
from moss_tts.models.delay import DelayConfig
from moss_tts.models.delay_published import HEAD, TABLE, TOKENIZER
from moss_tts.models.qwen3 import Qwen3Config

QWEN3_8B = Qwen3Config(4096, 36, 32, 8, 128, 12288, 1e6)
QWEN3_1_7B = Qwen3Config(2048, 28, 16, 8, 128, 6144, 1e6)
TINY = Qwen3Config(64, 2, 4, 2, 16, 96, 1e6)      # a smoke run of the script itself
VOCAB = 155648                                    # the released extended Qwen vocabulary
TINY_VOCAB = 151680                               # just past the audio token ids
TEXT_TABLE = "embeddings/embed_tokens.npy"        # upstream's numpy lookup reads this one
# the embedding table in the backbone GGUF: a step reads one row of it, so its type only
# changes the file size
EMBED_TYPE = "f16"


@dataclass(frozen=True)
class Checkpoint:
    """A Delay release as far as speed goes: its backbone and its codebook count."""

    title: str
    backbone: Qwen3Config
    n_vq: int


CHECKPOINTS = {
    "tts": Checkpoint("MOSS-TTS (8B)", QWEN3_8B, 32),
    "ttsd": Checkpoint("MOSS-TTSD v1.0 (8B)", QWEN3_8B, 16),
    "voicegen": Checkpoint("MOSS-VoiceGenerator (1.7B)", QWEN3_1_7B, 16),
}


def config(checkpoint: str, tiny: bool) -> DelayConfig:
    """The checkpoint's config; `tiny` swaps in small backbone dims, keeping its n_vq."""
    c = CHECKPOINTS[checkpoint]
    return DelayConfig(TINY if tiny else c.backbone, vocab_size=TINY_VOCAB if tiny else VOCAB,
                       n_vq=c.n_vq)


class PooledRows(Lazy):
    """Seeded random rows ~ N(0, 1/width) already in the target type. Speed does not depend on
    the values, and ggml quantizes q4_K at only a few M values/s here (7 B values: an hour), so
    a pool of rows per (type, width) is quantized once and each tensor takes its rows from
    it, cyclically from an offset of its own."""

    POOL_ROWS = 1024
    _pools: dict = {}

    def __init__(self, name: str, shape: tuple):
        super().__init__(shape, np.float32, lambda: None)
        self.name = name

    def pool(self, t) -> np.ndarray:
        key = (t, self.shape[-1])
        if key not in self._pools:
            width = self.shape[-1]
            rows = np.random.default_rng(width).standard_normal((self.POOL_ROWS, width),
                                                                dtype=np.float32)
            self._pools[key] = next(Lazy(rows.shape, np.float32,
                                         lambda: rows * np.float32(width ** -0.5)).encoded(t))
        return self._pools[key]

    def encoded(self, t):
        pool, n = self.pool(t), self.shape[0]
        first = zlib.crc32(self.name.encode()) % self.POOL_ROWS
        for start in range(0, n, self.POOL_ROWS):
            yield pool[(first + np.arange(start, min(n, start + self.POOL_ROWS))) % self.POOL_ROWS]

    def as_f16(self) -> np.ndarray:
        """The whole tensor as an f16 array (the published .npy tables are fp16)."""
        return np.concatenate(list(self.encoded(F16))).view(np.float16).reshape(self.shape)


def gpt2_byte_tokens() -> list[str]:
    """GPT-2's byte → printable-character map: llama.cpp's BPE vocabulary must hold a token for
    each byte (it looks up the newline token at load time)."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
            *range(ord("®"), ord("ÿ") + 1)]
    extra = iter(range(256, 512))
    return [chr(b) if b in keep else chr(next(extra)) for b in range(256)]


def add_llama_vocab(w, n_vocab: int, cfg: DelayConfig) -> None:
    """A stand-in vocabulary llama.cpp loads (the bench feeds embeddings, never token ids):
    the 256 byte tokens, fillers up to n_vocab, one merge, Qwen2's pre-tokenizer."""
    tokens = gpt2_byte_tokens()
    tokens += [f"[t{i}]" for i in range(len(tokens), n_vocab)]
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2")
    w.add_token_list(tokens)
    w.add_token_merges([f"{tokens[ord('a')]} {tokens[ord('b')]}"])
    w.add_eos_token_id(cfg.im_end_token_id)
    w.add_pad_token_id(cfg.pad_token_id)


def write_published(out: Path, cfg: DelayConfig, outtype: str, head: str | None) -> Path:
    """The published layout with random weights, written into a temp directory renamed into
    place (an interrupted run leaves nothing that looks complete)."""
    import gguf

    tmp = out.with_name(out.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    for sub in ("embeddings", "lm_heads", "tokenizer"):
        (tmp / sub).mkdir(parents=True)
    lc = cfg.language_config
    w = gguf.GGUFWriter(str(tmp / f"MOSS_TTS_{outtype.upper()}.gguf"), "qwen3")
    add_llama_qwen3_keys(w, lc, context_length=40960)
    add_llama_vocab(w, cfg.vocab_size, cfg)
    tensors = {n: PooledRows(n, s) if len(s) == 2 else np.ones(s, np.float32)
               for n, s in cfg.backbone_shapes().items()}
    t0 = time.perf_counter()
    write_tensors(w, tensors, tensor_types(outtype, head=head, embed=EMBED_TYPE))
    d = lc.hidden_size
    np.save(tmp / TEXT_TABLE, PooledRows("embed_tokens", (cfg.vocab_size, d)).as_f16())
    for k in range(cfg.n_vq):
        np.save(tmp / TABLE.format(k), PooledRows(f"emb_ext.{k}", (cfg.audio_rows, d)).as_f16())
        np.save(tmp / HEAD.format(k), PooledRows(f"head.{k}", (cfg.audio_rows, d)).as_f16())
    # not used by bench/delay.py; DelayTTS needs a usable one (bench/streams.py plans a sentence)
    (tmp / TOKENIZER).write_text(make_tokenizer_json())
    tmp.rename(out)
    print(f"{out}: written in {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    return out


def weights_dir(args) -> Path:
    """The checkpoint's files for one type under args.data, written on first use. The 8B keeps
    the folder name runs before --checkpoint wrote, so their files are reused."""
    cfg = config(args.checkpoint, args.tiny)
    head = args.head_type or "default"
    name = "delay" if args.checkpoint == "tts" else f"delay-{args.checkpoint}"
    out = Path(args.data) / f"{name}-{'tiny' if args.tiny else 'real'}-{args.type}-head_{head}"
    if not out.exists():
        out.parent.mkdir(parents=True, exist_ok=True)
        write_published(out, cfg, args.type, args.head_type)
    return out


def weight_bytes(d: Path, fp32_tables: bool) -> int:
    """The backbone file plus the audio tables and heads as held in memory (f16 in ours,
    converted to f32 by upstream's numpy route)."""
    npys = [*(d / "embeddings").glob("emb_ext_*.npy"), *(d / "lm_heads").glob("*.npy")]
    tables = sum(np.load(p, mmap_mode="r").nbytes for p in npys)
    return next(d.glob("*.gguf")).stat().st_size + tables * (2 if fp32_tables else 1)
