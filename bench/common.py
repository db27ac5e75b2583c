"""Shared bench helpers: timing with medians, random GGUF models, a results table."""

from __future__ import annotations

import os
import statistics
from pathlib import Path

import numpy as np

from converters.gguf_io import write_gguf

CACHE = Path(__file__).resolve().parent / "results" / "models"


def median_ms(samples: list[float]) -> float:
    return statistics.median(samples) * 1e3


def random_model(name: str, shapes: dict[str, tuple], outtype: str, *, seed: int = 0) -> Path:
    """A GGUF of seeded random tensors (speed does not depend on the values); cached on disk."""
    path = CACHE / f"{name}-{outtype}.gguf"
    if path.exists():
        return path
    rng = np.random.default_rng(seed)
    tensors = {}
    for tname, shape in shapes.items():
        fan_in = shape[-1] if len(shape) > 1 else 1
        scale = 1.0 if len(shape) == 1 else fan_in ** -0.5
        tensors[tname] = (rng.standard_normal(shape, dtype=np.float32) * scale).astype(np.float32)
        if tname.endswith("ln_1.weight") or tname.endswith("ln_2.weight") or tname.endswith("ln_f.weight"):
            tensors[tname] = 1.0 + 0.1 * tensors[tname]
    return write_gguf(path, tensors, {}, kind="bench", version=1, outtype=outtype)


def table(rows: list[dict], cols: list[str]) -> str:
    widths = {c: max(len(c), *(len(str(r.get(c, ""))) for r in rows)) for c in cols}
    line = "  ".join(c.ljust(widths[c]) for c in cols)
    out = [line, "  ".join("-" * widths[c] for c in cols)]
    out += ["  ".join(str(r.get(c, "")).ljust(widths[c]) for c in cols) for r in rows]
    return "\n".join(out)


def _cpuinfo() -> tuple[str, list[str], float]:
    """(model name, flags, MHz) from /proc/cpuinfo (empty where it is missing)."""
    info = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    field = lambda key: next((ln.split(":", 1)[1].strip() for ln in info.splitlines()  # noqa: E731
                              if ln.startswith(key)), "")
    mhz = field("cpu MHz")
    return field("model name") or "unknown CPU", field("flags").split(), float(mhz or 0)


def cpu_line() -> str:
    model, flags, mhz = _cpuinfo()
    simd = sorted(f for f in flags if f.startswith(("avx", "amx", "fma", "f16c", "sse4")))
    return f"{model}, {os.cpu_count()} CPUs at {mhz:.0f} MHz; {' '.join(simd)}"


def fma_peak_gflops(cores: int) -> tuple[float, str]:
    """f32 FMA lanes × 2 flops × 2 FMA units (assumed: every AVX2/AVX-512 server core since
    Haswell / Zen 2 has two) × clock × cores, and how it was computed."""
    _, flags, mhz = _cpuinfo()
    lanes = 16 if "avx512f" in flags else 8 if "fma" in flags else 4
    flops = 2 * lanes * 2
    how = f"{lanes} lanes x 2 (FMA) x 2 units x {mhz:.0f} MHz x {cores} cores"
    return flops * mhz * 1e-3 * cores, how
