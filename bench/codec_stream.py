"""Streaming decode through the 24 kHz and v2 codecs as a listener meets it (issue 35, part 1):
per decoder weight type, the cost of a frame pushed alone and of frames pushed together, against
the 80 ms of audio each frame makes, and the audio each type makes against f32's.

    python bench/codec_stream.py --codec bench/results/codec_real/codec-f32.gguf
        [--types f32,f16,q8_0,q6_K,q4_K] [--pushes 1,2,4,8] [--frames 48] [--threads 2]
        [--json bench/results/codec_stream.json]

--codec is a real-dims f32 codec GGUF named *-f32.gguf (bench/codec.py writes the 24 kHz one,
bench/codec48k.py the v2 one; random weights: the speed of a type does not depend on the
values). Each other type T is the GGUF beside it named *-T.gguf (bench/codec.py's), or one
written from it with the linears of both towers in T (converters/codec.py `tower_types`; a
decode never reads the encoder, so its decoder is what `convert codec --decoder-type T` writes,
in less disk), made once. Each type then runs in a
fresh process: random codes (all codebooks) decoded through a stream decoder k frames a push for
each --pushes k — ms per frame (median over the pushes after the first two, whose graphs are
built) and the real-time factor (ms per frame ÷ the frame's ms) — and offline (`decode`, one
graph run) for the ms per frame streaming should approach. Each type's streamed audio (one frame
a push) is compared with f32's: max|Δ| over the f32 audio's peak, RMS(Δ) over its RMS, and the
log-mel distance (80 mel bands, 1024-sample frames, the mean |Δ| of 10·log10 power, in dB).
One push reads every decoder weight whatever its frames (bench/codec.py's stage table): the
`floor` column is the decoder's bytes over the host's measured read bandwidth.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.common import cpu_line, table  # noqa: E402
from bench.harness import median, peak_rss_gb  # noqa: E402

N_MELS, MEL_FRAME, MEL_HOP = 80, 1024, 256


# --- the retyped GGUFs ---------------------------------------------------------------------------

def retyped(f32_path: Path, dtype: str, log=print) -> Path:
    """The f32 codec GGUF with its towers' linears in `dtype` (made once, beside it)."""
    from converters.codec import tower_types
    from converters.gguf_io import Lazy, write_gguf
    from moss_tts.ggml import GGUFFile, Weights
    from moss_tts.ggml.weights import KIND_KEY, VERSION_KEY

    out = f32_path.with_name(f32_path.name.replace("-f32.gguf", f"-{dtype}.gguf"))
    if dtype == "f32" or out.exists():
        return f32_path if dtype == "f32" else out
    log(f"  writing {out.name} (linears in {dtype}) ...")
    t0 = time.perf_counter()
    with GGUFFile(f32_path) as f:
        meta = {k: f[k] for k in f.keys()
                if not k.startswith("general.") and k not in (KIND_KEY, VERSION_KEY)}
        kind, version = f.text(KIND_KEY), f.integer(VERSION_KEY)
    with Weights.load(f32_path) as w:
        tensors = {name: Lazy(w.file.tensors[name].shape, np.float32,
                              lambda name=name: w.read(name)) for name in w.names()}
        write_gguf(out, tensors, meta, kind=kind, version=version,
                   type_for=tower_types(dtype, dtype))
    log(f"    {out.stat().st_size / 2**30:.2f} GiB in {time.perf_counter() - t0:.0f} s")
    return out


# --- audio distances ------------------------------------------------------------------------------

def mel_filters(sr: int, n_fft: int = MEL_FRAME, n_mels: int = N_MELS) -> np.ndarray:
    """Triangular filters [n_mels, n_fft/2+1] evenly spaced on the HTK mel scale."""
    def mel(f):
        return 2595 * np.log10(1 + f / 700)
    edges = 700 * (10 ** (np.linspace(0, mel(sr / 2), n_mels + 2) / 2595) - 1)
    freqs = np.linspace(0, sr / 2, n_fft // 2 + 1)
    lo, mid, hi = edges[:-2, None], edges[1:-1, None], edges[2:, None]
    return np.maximum(0, np.minimum((freqs - lo) / (mid - lo), (hi - freqs) / (hi - mid)))


def log_mel(x: np.ndarray, sr: int) -> np.ndarray:
    x = x.mean(axis=1) if x.ndim == 2 else x
    n = 1 + (len(x) - MEL_FRAME) // MEL_HOP
    frames = np.lib.stride_tricks.sliding_window_view(x, MEL_FRAME)[::MEL_HOP][:n]
    power = np.abs(np.fft.rfft(frames * np.hanning(MEL_FRAME), axis=1)) ** 2
    return 10 * np.log10(np.maximum(power @ mel_filters(sr).T, 1e-10))


def distances(got: np.ndarray, want: np.ndarray, sr: int) -> dict:
    d = got.astype(np.float64) - want
    return {"max_rel": float(np.abs(d).max() / np.abs(want).max()),
            "rms_rel": float(np.sqrt(np.mean(d ** 2) / np.mean(want.astype(np.float64) ** 2))),
            "log_mel_db": float(np.mean(np.abs(log_mel(got, sr) - log_mel(want, sr))))}


# --- one type, in its own process -------------------------------------------------------------------

def worker(args) -> dict:
    from moss_tts.codec import Codec

    codec = Codec.load(args.worker, threads=args.threads)
    cfg = codec.config
    codes = np.random.default_rng(2).integers(0, cfg.codebook_size,
                                              (cfg.n_quantizers, args.frames), dtype=np.int32)
    frame_ms = 1e3 / cfg.frame_rate
    decoder_bytes = sum(codec.weights.file.tensors[n].nbytes for n in codec.weights.names()
                        if n.startswith("decoder."))
    out = {"frame_ms": frame_ms, "decoder_mib": decoder_bytes / 2**20, "pushes": {},
           "stages": decoder_stages(codec)}
    for k in args.pushes:
        times, parts = [], []
        with codec.stream_decoder(max_push_frames=max(args.pushes)) as sd:
            for s in range(0, args.frames - args.frames % k, k):
                t0 = time.perf_counter()
                parts.append(sd.push(codes[:, s:s + k]))
                times.append(time.perf_counter() - t0)
        per_frame = 1e3 * median(times[2:]) / k
        out["pushes"][k] = {"ms_per_frame": per_frame, "rtf": per_frame / frame_ms,
                            "first_push_ms": 1e3 * times[0]}
        if k == args.pushes[0]:
            np.save(args.audio_out, np.concatenate(parts))
    codec.decode(codes)                                           # graphs built, pages in
    times = []
    for _ in range(3):
        t0 = time.perf_counter()
        codec.decode(codes)
        times.append(time.perf_counter() - t0)
    out["offline_ms_per_frame"] = 1e3 * median(times) / args.frames
    out["peak_rss_gb"] = peak_rss_gb()
    out["sample_rate"] = codec.sample_rate
    codec.close()
    return out


def decoder_stages(codec) -> list[dict]:
    """Per decoder transformer stage, what one frame's push costs it: the weight bytes it reads
    (every linear, whatever the rows), its rows (positions per code frame) and GFLOP — the
    linears' 2·params·rows and, at a full window, attention's 4·d·window per row and layer."""
    from moss_tts.codec.config import TRANSFORMER
    from moss_tts.codec.tower import positions_per_frame

    cfg, tensors = codec.config, codec.weights.file.tensors
    rows_of = positions_per_frame(cfg, "decoder")
    out = []
    for i, s in enumerate(cfg.decoder):
        if s.kind != TRANSFORMER:
            continue
        names = [n for n in tensors if n.startswith(f"decoder.{i}.")]
        params = sum(int(np.prod(tensors[n].shape)) for n in names if tensors[n].shape[-1] > 1
                     and len(tensors[n].shape) == 2)
        rows = rows_of[i]
        attention = 4 * s.d_model * s.context * rows * s.n_layers
        out.append({"stage": i, "layers": s.n_layers, "d_model": s.d_model, "rows": rows,
                    "window": s.context, "mib": sum(tensors[n].nbytes for n in names) / 2**20,
                    "gflop": (2 * params * rows + attention) / 1e9})
    return out


def read_bandwidth_gbs(threads: int, nbytes: int = 1 << 30) -> float:
    """GB/s of a plain read of `nbytes` split over the threads (bench/matmul.py's ReadProbe,
    best of 5): the floor's divisor."""
    from bench.matmul import ReadProbe

    return ReadProbe(nbytes, threads).gbps(5)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--codec", type=Path, help="a real-dims f32 codec GGUF")
    ap.add_argument("--types", default="f32,f16,q8_0,q6_K,q4_K")
    ap.add_argument("--pushes", default="1,2,4,8", help="frames per push")
    ap.add_argument("--frames", type=int, default=48, help="frames streamed per push size")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--audio-out", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    args.pushes = [int(k) for k in str(args.pushes).split(",") if k]
    if args.worker:
        print(json.dumps(worker(args)))
        return 0
    if args.codec is None or not args.codec.is_file() or not args.codec.name.endswith("-f32.gguf"):
        ap.error("--codec: a real-dims f32 codec GGUF named *-f32.gguf (bench/codec.py or "
                 "bench/codec48k.py writes one)")
    print(cpu_line(), flush=True)
    print(f"{time.strftime('%Y-%m-%d %H:%M')}  python bench/codec_stream.py "
          + " ".join(argv if argv is not None else sys.argv[1:]), flush=True)
    bandwidth = read_bandwidth_gbs(args.threads)
    print(f"read bandwidth ({args.threads} threads, 1 GiB, best of 5): {bandwidth:.1f} GB/s",
          flush=True)
    res, ref = {}, None
    for t in [t for t in args.types.split(",") if t]:
        path = retyped(args.codec, t)
        audio = args.codec.with_name(f".stream-{t}.npy")
        cmd = [sys.executable, __file__, "--worker", str(path), "--audio-out", str(audio),
               "--pushes", ",".join(map(str, args.pushes)), "--frames", str(args.frames),
               "--threads", str(args.threads)]
        run = subprocess.run(cmd, capture_output=True, text=True, env=os.environ)
        if run.returncode:
            print(run.stderr[-2000:], file=sys.stderr)
            return 1
        res[t] = json.loads(run.stdout.strip().splitlines()[-1])
        got = np.load(audio)
        audio.unlink()
        if ref is None:
            ref = got
        res[t]["error"] = distances(got, ref, res[t]["sample_rate"])
        res[t]["floor_ms"] = res[t]["decoder_mib"] * 2**20 / bandwidth / 1e6
        print(f"{t}: {json.dumps(res[t])}", flush=True)
    rows = []
    for t, r in res.items():
        row = {"type": t, "decoder MiB": f"{r['decoder_mib']:.0f}",
               "read floor ms": f"{r['floor_ms']:.0f}",
               "offline ms/frame": f"{r['offline_ms_per_frame']:.1f}"}
        for k, p in r["pushes"].items():
            row[f"push {k}: ms/frame (RTF)"] = f"{p['ms_per_frame']:.1f} ({p['rtf']:.2f})"
        e = r["error"]
        row["max / RMS rel vs f32"] = f"{e['max_rel']:.1e} / {e['rms_rel']:.1e}"
        row["log-mel dB"] = f"{e['log_mel_db']:.3f}"
        row["peak RSS GB"] = f"{r['peak_rss_gb']:.2f}"
        rows.append(row)
    print(table(rows, list(rows[0])))
    first = next(iter(res.values()))
    print(f"\nper decoder stage, one frame pushed ({next(iter(res))}; floor: its bytes at "
          f"{bandwidth:.1f} GB/s):")
    print(table([{"stage": st["stage"], "layers": st["layers"], "d": st["d_model"],
                  "rows": st["rows"], "window": st["window"], "MiB": f"{st['mib']:.0f}",
                  "GFLOP": f"{st['gflop']:.2f}",
                  "floor ms": f"{st['mib'] * 2**20 / bandwidth / 1e6:.1f}"}
                 for st in first["stages"]], ["stage", "layers", "d", "rows", "window", "MiB",
                                              "GFLOP", "floor ms"]))
    if args.json:
        args.json.write_text(json.dumps({"cpu": cpu_line(), "bandwidth_gbs": bandwidth,
                                         "results": res}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
