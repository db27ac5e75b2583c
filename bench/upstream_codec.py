"""Upstream PyTorch MOSS-Audio-Tokenizer (f32) on the random real-size checkpoint that
bench/codec.py writes: time encode or decode of the same 10 s input, peak RSS; save the codes /
audio for the parity check. Run it with a venv's python that has torch + transformers (never a
dependency of the package; from this repository it imports only bench/harness.py, stdlib and
numpy); bench/codec.py calls it with `--upstream PY`.

    /tmp/torchvenv/bin/python bench/upstream_codec.py --mode encode|decode
        [--ckpt bench/results/codec_real/checkpoint] [--work bench/results/codec_real]
        [--threads 2] [--runs 3] [--chunk-duration S] [--upstream-src DIR]

The upstream modeling files are copied at run time from the upstream checkout (--upstream-src
or $MOSS_TTS_UPSTREAM_CODEC: its files, or its git HEAD) into bench/results/upstream/
(gitignored), never into the committed tree; without a checkout, an earlier copy there is used.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.harness import (  # noqa: E402  (stdlib + numpy: fine in the torch venv)
    UPSTREAM_ENV,
    Contention,
    peak_rss_gb,
    upstream_commit,
    upstream_file,
    upstream_source,
)

UPSTREAM_DIR = ROOT / "bench" / "results" / "upstream"
FILES = ("modeling_moss_audio_tokenizer.py", "configuration_moss_audio_tokenizer.py")


def fetch_upstream(upstream_src: str | None) -> str:
    """Copy the upstream modeling code into bench/results/upstream/ (a package); returns the
    commit it came from ("?" when unknown)."""
    UPSTREAM_DIR.mkdir(parents=True, exist_ok=True)
    copied = all((UPSTREAM_DIR / f).exists() for f in FILES)
    if copied and not (upstream_src or os.environ.get(UPSTREAM_ENV)):
        return "?"  # an earlier run's copy, source no longer given
    src = upstream_source(upstream_src)
    for f in FILES:
        (UPSTREAM_DIR / f).write_text(upstream_file(src, f))
    (UPSTREAM_DIR / "__init__.py").touch()
    return upstream_commit(src)


def load_model(ckpt: Path):
    """Build the upstream model on the meta device and assign the checkpoint's tensors (no
    random init, no second copy); weight-norm pairs load into their parametrizations."""
    import torch
    from safetensors.torch import load_file

    sys.path.insert(0, str(UPSTREAM_DIR.parent))
    from upstream.configuration_moss_audio_tokenizer import MossAudioTokenizerConfig
    from upstream.modeling_moss_audio_tokenizer import MossAudioTokenizerModel

    config = MossAudioTokenizerConfig(**json.loads((ckpt / "config.json").read_text()))
    with torch.device("meta"):
        model = MossAudioTokenizerModel(config)
    state = {}
    index = ckpt / "model.safetensors.index.json"
    files = sorted(set(json.loads(index.read_text())["weight_map"].values())) if index.exists() \
        else ["model.safetensors"]
    for f in files:
        state.update(load_file(str(ckpt / f)))
    result = model.load_state_dict(state, strict=True, assign=True)
    del state
    model.eval()
    meta = [n for n, p in list(model.named_parameters()) + list(model.named_buffers())
            if p.device.type == "meta"]
    if meta:
        raise SystemExit(f"parameters left on the meta device: {meta[:5]}")
    return model, result


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mode", choices=("encode", "decode"), required=True)
    ap.add_argument("--ckpt", default=str(ROOT / "bench" / "results" / "codec_real" / "checkpoint"))
    ap.add_argument("--work", default=str(ROOT / "bench" / "results" / "codec_real"))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--chunk-duration", type=float, default=None,
                    help="upstream's own chunked (streaming-cache) mode; default: one pass")
    ap.add_argument("--upstream-src", default=None,
                    help=f"upstream MOSS-Audio-Tokenizer checkout (default ${UPSTREAM_ENV})")
    args = ap.parse_args(argv)

    import numpy as np
    import torch

    torch.set_num_threads(args.threads)
    commit = fetch_upstream(args.upstream_src)
    work = Path(args.work)
    t0 = time.perf_counter()
    model, _ = load_model(Path(args.ckpt))
    load_s = time.perf_counter() - t0
    weight_gb = sum(p.numel() * p.element_size() for p in model.parameters()) / 1e9

    if args.mode == "encode":
        x = torch.from_numpy(np.load(work / "audio.npy")).float().view(1, 1, -1)

        def call():
            return model.encode(x, return_dict=True, chunk_duration=args.chunk_duration).audio_codes
    else:
        codes = torch.from_numpy(np.load(work / "codes.npy")).long()      # [nq, T]

        def call():
            return model.decode(codes, return_dict=True, chunk_duration=args.chunk_duration).audio

    times, foreign, out = [], [], None
    with torch.inference_mode():
        for _ in range(args.runs + 1):
            c = Contention()
            t = time.perf_counter()
            out = call()
            times.append(time.perf_counter() - t)
            foreign.append(c.share())
    suffix = "" if args.chunk_duration is None else f"_chunk{args.chunk_duration:g}"
    if args.mode == "encode":
        np.save(work / f"codes_upstream{suffix}.npy", out[:, 0, :].numpy().astype(np.int32))
    else:
        np.save(work / f"audio_upstream{suffix}.npy", out[0, 0].numpy().astype(np.float32))
    warm = times[1:] or times
    print(json.dumps({"mode": args.mode, "load_s": load_s, "cold_s": times[0], "warm_s": warm,
                      "median_s": statistics.median(warm), "min_s": min(warm),
                      "foreign": statistics.median(foreign[1:] or foreign),
                      "peak_rss_gb": peak_rss_gb(),
                      "weight_gb": weight_gb, "torch": torch.__version__,
                      "threads": torch.get_num_threads(), "upstream_commit": commit,
                      "chunk_duration": args.chunk_duration}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
