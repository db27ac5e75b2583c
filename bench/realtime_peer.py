"""Upstream's PyTorch MossTTSRealtime (f32, eager) on a checkpoint, for bench/realtime.py: runs
in a Python with torch and transformers (not this package's venv) and prints one JSON line.

    PYTHON bench/realtime_peer.py UPSTREAM_DIR CHECKPOINT_DIR FRAMES

UPSTREAM_DIR is upstream's `moss_tts_realtime/` (holding `mossttsrealtime/`); a CHECKPOINT_DIR
with only a config.json times the model on its own random init. The prompt is
seeded random text rows; the lead is 12 ids; then FRAMES greedy steps through upstream's
`MossTTSRealtimeInference.prefill/step` (the streaming path), timed per frame. The frames are
printed too, so the caller can compare them with ours on the same weights.
"""

import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np


class _Tokenizer:
    """What the inference class reads of a tokenizer: the pad id for left padding."""

    pad_token_id = 151643


def main(src: str, ckpt: str, frames: int) -> dict:
    sys.path.insert(0, src)
    import torch
    from safetensors.torch import load_file

    from mossttsrealtime.configuration_mossttsrealtime import MossTTSRealtimeConfig
    from mossttsrealtime.modeling_mossttsrealtime import MossTTSRealtime
    from mossttsrealtime.streaming_mossttsrealtime import MossTTSRealtimeInference

    torch.manual_seed(0)
    config = MossTTSRealtimeConfig(**json.loads((Path(ckpt) / "config.json").read_text()))
    model = MossTTSRealtime(config).float().eval()
    shards = sorted(Path(ckpt).glob("*.safetensors"))
    state = {}
    for shard in shards:   # none: the model's own random init (timing only)
        state |= {k: v.float() for k, v in load_file(str(shard)).items()}
    missing, unexpected = model.load_state_dict(state, strict=False) if shards else ([], [])
    if missing or unexpected:
        raise SystemExit(f"weights do not fit: missing {missing[:3]}, unexpected {unexpected[:3]}")
    inference = MossTTSRealtimeInference(model, _Tokenizer(), max_length=frames + 8)
    inference._should_compile_local_transformer = False     # eager: no compiler needed
    rng = np.random.default_rng(0)
    rvq = config.rvq
    prompt = np.full((100, rvq + 1), config.audio_pad_token, dtype=np.int64)
    prompt[:, 0] = rng.integers(1000, 150000, 100)
    text = rng.integers(1000, 150000, 12 + frames).tolist()
    greedy = dict(do_sample=False, repetition_penalty=1.1, repetition_window=50)
    t0 = time.perf_counter()
    out = [inference.prefill(input_ids=[prompt], text_prefix_ids=[text[:12]], **greedy)]
    prefill = time.perf_counter() - t0
    times = []
    for token in text[12:12 + frames - 1]:
        t0 = time.perf_counter()
        out.append(inference.step(token, **greedy))
        times.append(time.perf_counter() - t0)
    return {"frame_ms": 1e3 * statistics.median(times[2:] or times), "prefill_ms": 1e3 * prefill,
            "threads": torch.get_num_threads(), "prompt": prompt.tolist(), "text": text,
            "frames": [f[0].tolist() for f in out]}


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1], sys.argv[2], int(sys.argv[3]))))
