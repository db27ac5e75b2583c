"""Upstream PyTorch MOSS-Audio-Tokenizer (f32) on the random real-size checkpoint a codec bench
writes: time encode or decode of the same 10 s input, peak RSS; save the codes / audio for the
parity check. Two variants: v1 (24 kHz mono, bench/codec.py's checkpoint) and nano
(MOSS-Audio-Tokenizer-Nano, 48 kHz stereo, bench/codec48k.py's). Run it with a venv's python that
has torch + transformers (never a dependency of the package; from this repository it imports
only bench/harness.py, bench/upstream_torch.py, stdlib and numpy); the benches call it with
`--upstream PY`.

    /tmp/torchvenv/bin/python bench/upstream_codec.py --mode encode|decode [--variant v1|nano]
        [--ckpt DIR] [--work DIR] [--threads 2] [--runs 3] [--chunk-duration S]
        [--upstream-src DIR]

The upstream modeling files are copied at run time from the upstream checkout (--upstream-src
or the variant's environment variable, see bench/harness.py: its files, or its git HEAD) into
bench/results/upstream/ (v1) or bench/results/upstream_nano_codec/ (gitignored), never into the
committed tree; without a checkout, an earlier copy there is used. Upstream's attention is its
config's "sdpa" (what its runtime picks on CPU).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.harness import CODEC_V1, NANO_CODEC, Upstream  # noqa: E402
from bench.upstream_torch import (  # noqa: E402
    assign,
    build_on_meta,
    copy_upstream,
    import_upstream,
    read_safetensors,
    timed,
    weight_gb,
)

FILES = ("modeling_moss_audio_tokenizer.py", "configuration_moss_audio_tokenizer.py")
RESULTS = ROOT / "bench" / "results"


@dataclass(frozen=True)
class Variant:
    source: Upstream
    copy_dir: Path      # where the upstream files are copied (a package)
    work: Path          # the bench's folder: checkpoint, inputs, outputs
    ckpt: Path
    audio: str          # input files in `work`: waveform [n] or [n, C], codes [n_q, frames]
    codes: str
    prefix: str         # of the saved outputs: {prefix}codes_upstream.npy, {prefix}audio_upstream.npy


VARIANTS = {
    "v1": Variant(CODEC_V1, RESULTS / "upstream", RESULTS / "codec_real",
                  RESULTS / "codec_real" / "checkpoint", "audio.npy", "codes.npy", ""),
    "nano": Variant(NANO_CODEC, RESULTS / "upstream_nano_codec", RESULTS / "codec48k",
                    RESULTS / "codec48k" / "nano_checkpoint", "audio48k.npy", "codes16.npy",
                    "nano_"),
}


def to_upstream_audio(audio: np.ndarray) -> np.ndarray:
    """Our waveform layout → upstream's (batch, channels, samples): [n] (mono) or [n, C]."""
    a = np.asarray(audio, dtype=np.float32)
    if a.ndim == 1:
        return a[None, None, :]
    if a.ndim == 2:
        return np.ascontiguousarray(a.T)[None]
    raise SystemExit(f"audio must be [n] or [n, channels], got shape {a.shape}")


def from_upstream_audio(audio: np.ndarray) -> np.ndarray:
    """Upstream's decoded (channels, samples) of one batch item → ours: [n] mono, [n, C] else."""
    a = np.asarray(audio, dtype=np.float32)
    return a[0] if a.shape[0] == 1 else np.ascontiguousarray(a.T)


def load_model(v: Variant, ckpt: Path):
    """The upstream model built on the meta device with the checkpoint's tensors assigned."""
    config_mod = import_upstream(v.copy_dir, "configuration_moss_audio_tokenizer")
    model_mod = import_upstream(v.copy_dir, "modeling_moss_audio_tokenizer")
    config = config_mod.MossAudioTokenizerConfig(**json.loads((ckpt / "config.json").read_text()))
    model = build_on_meta(lambda: model_mod.MossAudioTokenizerModel(config))
    state = read_safetensors(ckpt)
    assign(model, state)
    del state
    return model


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mode", choices=("encode", "decode"), required=True)
    ap.add_argument("--variant", choices=sorted(VARIANTS), default="v1")
    ap.add_argument("--ckpt", default=None, help="default: the variant's bench checkpoint")
    ap.add_argument("--work", default=None, help="default: the variant's bench folder")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--chunk-duration", type=float, default=None,
                    help="upstream's own chunked (streaming-cache) mode; default: one pass")
    ap.add_argument("--upstream-src", default=None,
                    help="upstream checkout (default: $MOSS_TTS_UPSTREAM_CODEC for v1, "
                         "$MOSS_TTS_UPSTREAM_NANO_CODEC for nano)")
    args = ap.parse_args(argv)
    v = VARIANTS[args.variant]

    import torch

    torch.set_num_threads(args.threads)
    commit = copy_upstream(v.copy_dir, FILES, v.source, args.upstream_src)
    work = Path(args.work) if args.work else v.work
    t0 = time.perf_counter()
    model = load_model(v, Path(args.ckpt) if args.ckpt else v.ckpt)
    load_s = time.perf_counter() - t0

    if args.mode == "encode":
        x = torch.from_numpy(to_upstream_audio(np.load(work / v.audio)))

        def call():
            return model.encode(x, return_dict=True, chunk_duration=args.chunk_duration).audio_codes
    else:
        codes = torch.from_numpy(np.load(work / v.codes)).long()      # [nq, T]

        def call():
            return model.decode(codes, return_dict=True, chunk_duration=args.chunk_duration).audio

    out, stats = timed(call, args.runs)
    suffix = "" if args.chunk_duration is None else f"_chunk{args.chunk_duration:g}"
    if args.mode == "encode":
        np.save(work / f"{v.prefix}codes_upstream{suffix}.npy", out[:, 0, :].numpy().astype(np.int32))
    else:
        np.save(work / f"{v.prefix}audio_upstream{suffix}.npy", from_upstream_audio(out[0].numpy()))
    print(json.dumps({"mode": args.mode, "variant": args.variant, "load_s": load_s, **stats,
                      "weight_gb": weight_gb(model), "upstream_commit": commit,
                      "chunk_duration": args.chunk_duration}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
