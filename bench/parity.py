"""Parity of our outputs with upstream PyTorch's on the same random weights and inputs, as the
bench reports print it: codes equal (overall, per codebook, the first codebook that differs) and
float outputs as max|Δ| and RMS(Δ) relative to upstream's RMS. Pure numpy (no torch, no package
import), shared by bench/codec.py, bench/codec48k.py and bench/nano.py."""

from __future__ import annotations

from pathlib import Path

import numpy as np


def codes_agreement(ours: np.ndarray, ref: np.ndarray) -> dict:
    """Codes [n_q, frames] against upstream's: share equal overall and per codebook, the first
    codebook with a difference (None when all agree); shapes must match."""
    ours, ref = np.asarray(ours), np.asarray(ref)
    if ours.shape != ref.shape:
        raise ValueError(f"codes shape {ours.shape} vs upstream {ref.shape}")
    eq = ours == ref
    rows = np.flatnonzero(~eq.all(axis=1))
    return {"equal": float(eq.mean()), "per_codebook": [float(r.mean()) for r in eq],
            "first_diff_codebook": int(rows[0]) if len(rows) else None}


def rel_diff(ours: np.ndarray, ref: np.ndarray) -> dict:
    """max|Δ| / RMS(ref) and RMS(Δ) / RMS(ref) over the common length (both flattened in the
    same layout), in float64; `same_length` says whether the lengths agreed."""
    a = np.asarray(ours, dtype=np.float64).reshape(-1)
    b = np.asarray(ref, dtype=np.float64).reshape(-1)
    n = min(len(a), len(b))
    if n == 0:
        raise ValueError("nothing to compare: an output is empty")
    d = np.abs(a[:n] - b[:n])
    rms = float(np.sqrt(np.mean(b[:n] ** 2)))
    if rms == 0.0:
        raise ValueError("upstream's output is all zeros: a relative difference means nothing")
    return {"max_rel": float(d.max() / rms), "rms_rel": float(np.sqrt(np.mean(d ** 2)) / rms),
            "ref_rms": rms, "n": n, "same_length": len(a) == len(b)}


def codes_line(label: str, ours: np.ndarray, ref: np.ndarray, first: int = 8) -> str:
    """One report line: codes vs upstream (the first `first` codebooks' shares listed)."""
    try:
        a = codes_agreement(ours, ref)
    except ValueError as e:
        return f"- codes {label}: {e}"
    per = a["per_codebook"]
    where = ("" if a["first_diff_codebook"] is None
             else f"; first difference at codebook {a['first_diff_codebook']}")
    return (f"- codes {label} vs upstream: first {min(first, len(per))} codebooks "
            f"{100 * float(np.mean(per[:first])):.1f} % equal (per codebook: "
            + " ".join(f"{100 * x:.0f}" for x in per[:first])
            + f"), all {len(per)}: {100 * a['equal']:.1f} %{where}")


def diff_line(label: str, ours: np.ndarray, ref: np.ndarray) -> str:
    """One report line: a float output vs upstream's."""
    r = rel_diff(ours, ref)
    return (f"- {label} vs upstream: max|Δ|/RMS {r['max_rel']:.2e}, RMS(Δ)/RMS {r['rms_rel']:.2e} "
            f"(upstream RMS {r['ref_rms']:.3f}, {r['n']} values"
            f"{'' if r['same_length'] else ', LENGTHS DIFFER'})")


def codec_parity_lines(work: Path, types, prefix: str = "", decode_input: str = "codes.npy") -> list[str]:
    """The codec reports' parity section: for each type whose outputs were saved
    ({prefix}codes_ggml_{t}.npy, {prefix}audio_ggml_{t}.npy), against upstream's
    ({prefix}codes_upstream.npy, {prefix}audio_upstream.npy)."""
    out = []
    for kind in ("codes", "audio"):
        up = work / f"{prefix}{kind}_upstream.npy"
        if not up.exists():
            continue
        ref = np.load(up)
        for t in types:
            p = work / f"{prefix}{kind}_ggml_{t}.npy"
            if not p.exists():
                continue
            ours = np.load(p)
            out.append(codes_line(f"ggml {t}", ours, ref) if kind == "codes"
                       else diff_line(f"decode ggml {t} (random {decode_input})", ours, ref))
    return out
