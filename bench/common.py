"""Shared bench helpers: timing with medians, random GGUF models, a results table."""

from __future__ import annotations

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
