"""moss_tts/ggml/quant.py against the independent block quantizers in fixtures/reference/quant.py
(byte-exact for q8_0 / q4_0) and against documented round-trip error bounds for the other types.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from fixtures.compare import assert_close, assert_differs
from fixtures.reference.quant import (dequantize_q4_0, dequantize_q8_0, q4_0_bytes, q8_0_bytes,
                                      quantize_q4_0, quantize_q8_0)
from moss_tts.errors import ShapeError
from moss_tts.ggml import GGMLType
from moss_tts.ggml.quant import block_size, dequantize, quantize, row_bytes

REPO = Path(__file__).resolve().parents[2]
REFERENCE = {  # type: (reference quantizer, byte packer, reference dequantizer)
    "q8_0": (quantize_q8_0, q8_0_bytes, dequantize_q8_0),
    "q4_0": (quantize_q4_0, q4_0_bytes, dequantize_q4_0),
}


def _random_rows(rng) -> np.ndarray:
    """Rows of 256 at scales from 1e-4 to 1e3 (at 1e-4 the fp16 block scale is subnormal)."""
    x = rng.standard_normal((8, 256)).astype(np.float32)
    return x * np.float32(10.0) ** np.arange(-3, 5, dtype=np.float32)[:, None] / np.float32(10)


def _rows_with_zero_block(rng) -> np.ndarray:
    x = rng.standard_normal((3, 128)).astype(np.float32)
    x[0, 32:64] = 0.0          # d = 0: q8_0 stores q = 0, q4_0 stores q = 8
    x[2, :32] = 0.0
    x[2, 96:] = 0.0
    return x


def _rows_with_negative_zero_block(rng) -> np.ndarray:
    # ggml's quantize_row_q4_0_ref scans with `amax < |v|`, so an all −0.0 block keeps its
    # initial max = +0.0 and stores d = +0.0/−8 = −0.0 (fp16 0x8000); the numpy reference takes
    # the first element's sign (argmax) and stores +0.0. q8_0 stores d = +0.0 in both.
    x = rng.standard_normal((2, 64)).astype(np.float32)
    x[1, 32:] = -0.0
    return x


def _rows_with_ties(rng) -> np.ndarray:
    """Blocks whose scale is exactly 1, so x·(1/d) lands exactly on rounding boundaries."""
    q8 = np.array([127.0, -126.5, 126.5, 2.5, -2.5, 0.5, -0.5, 1.5, -1.5, 63.5, -63.5] +
                  [float(v) for v in rng.integers(-126, 127, 21)], dtype=np.float32)  # d = 1
    q4 = np.array([-8.0, 0.5, -0.5, 6.5, -7.5, 7.0, 6.9, 7.5, 3.5, -3.5, 2.0] +
                  [float(v) for v in rng.integers(-8, 8, 21)], dtype=np.float32)  # d = −8/−8 = 1
    sign_tie = rng.uniform(-3.0, 3.0, 32).astype(np.float32)
    sign_tie[[4, 9]] = [4.0, -4.0]         # two elements of largest |x|, opposite signs
    sign_tie_rev = sign_tie.copy()
    sign_tie_rev[[4, 9]] = [-4.0, 4.0]     # q4_0 keeps the first one's sign
    return np.stack([np.concatenate([q8, q4, sign_tie, sign_tie_rev])] * 2) * np.array(
        [[1.0], [-1.0]], dtype=np.float32)


ROWS = {"random": _random_rows, "zero_block": _rows_with_zero_block,
        "negative_zero_block": _rows_with_negative_zero_block, "ties": _rows_with_ties}


@pytest.mark.parametrize("rows", list(ROWS))
@pytest.mark.parametrize("qtype", list(REFERENCE))
def test_quantize_matches_reference_bytes_exactly(rng, qtype, rows):
    x = ROWS[rows](rng)
    quantize_ref, pack, _ = REFERENCE[qtype]
    want = pack(*quantize_ref(x))
    got = quantize(x, qtype)
    assert got.dtype == np.uint8
    assert got.shape == (x.shape[0], row_bytes(GGMLType.parse(qtype), x.shape[1]))
    assert_close(got, want, atol=0, what=f"{qtype} bytes of {rows} rows")
    # sensitivity: the same rows one block to the left quantize to other bytes
    assert_differs(got, pack(*quantize_ref(np.roll(x, 32, axis=1))), atol=0,
                   what=f"{qtype} bytes of shifted rows")


@pytest.mark.parametrize("rows", list(ROWS))
@pytest.mark.parametrize("qtype", list(REFERENCE))
def test_dequantize_matches_reference_dequantizer_exactly(rng, qtype, rows):
    x = ROWS[rows](rng)
    quantize_ref, pack, dequantize_ref = REFERENCE[qtype]
    d, q = quantize_ref(x)
    got = dequantize(pack(d, q), qtype, x.shape)
    assert got.dtype == np.float32
    assert_close(got, dequantize_ref(d, q), atol=0, what=f"{qtype} dequantize of {rows} rows")
    assert_differs(got, dequantize_ref(d[::-1], q[::-1]), atol=0,
                   what=f"{qtype} dequantize against rows in reverse order")


def test_quantize_keeps_leading_axes(rng):
    x = rng.standard_normal((2, 3, 64)).astype(np.float32)
    raw = quantize(x, "q8_0")
    assert raw.shape == (2, 3, row_bytes(GGMLType.Q8_0, 64))
    assert_close(raw.reshape(6, -1), q8_0_bytes(*quantize_q8_0(x.reshape(6, 64))), atol=0,
                 what="q8_0 bytes of a 3-d array")


# Round trip x → quantize → dequantize on N(0, 1) rows of 512 (plus one row ×100 and one ×1e-3),
# as max over rows of RMS(error) / RMS(row). Measured over three seeds: q8_0 0.0057, q6_K 0.023,
# q5_K 0.039, q5_1 0.042, q5_0 0.047, q4_K 0.077, iq4_nl 0.082, q4_0 0.094, q3_K 0.159,
# q2_K 0.321. Bounds are ~1.5× the worst measurement.
ROUND_TRIP_REL_RMS = {
    "q8_0": 0.009,
    "q6_K": 0.035,
    "q5_K": 0.06,
    "q5_1": 0.065,
    "q5_0": 0.07,
    "q4_K": 0.12,
    "iq4_nl": 0.12,
    "q4_0": 0.14,
    "q3_K": 0.24,
    "q2_K": 0.45,
}


def _round_trip_error(x: np.ndarray, qtype: str) -> float:
    y = dequantize(quantize(x, qtype), qtype, x.shape)
    assert y.shape == x.shape and np.all(np.isfinite(y))
    err = np.sqrt(((y.astype(np.float64) - x) ** 2).mean(axis=-1))
    return float((err / np.sqrt((x.astype(np.float64) ** 2).mean(axis=-1))).max())


def _round_trip_rows(rng) -> np.ndarray:
    x = rng.standard_normal((16, 512)).astype(np.float32)
    x[3] *= 100.0
    x[4] *= 1e-3
    return x


@pytest.mark.parametrize("qtype", list(ROUND_TRIP_REL_RMS))
def test_round_trip_error_is_below_documented_bound(rng, qtype):
    x = _round_trip_rows(rng)
    err = _round_trip_error(x, qtype)
    assert err < ROUND_TRIP_REL_RMS[qtype], f"{qtype}: round-trip RMS error {err:.4f} of row RMS"
    # sensitivity: the dequantized rows are those rows, not some others
    y = dequantize(quantize(x, qtype), qtype, x.shape)
    assert_differs(y, x[::-1], atol=ROUND_TRIP_REL_RMS[qtype], what=f"{qtype} vs reversed rows")


def test_round_trip_error_orders_by_bits(rng):
    x = _round_trip_rows(rng)
    err = {t: _round_trip_error(x, t) for t in ("q8_0", "q6_K", "q5_K", "q4_K", "q3_K", "q2_K")}
    order = sorted(err, key=err.get)
    assert order == ["q8_0", "q6_K", "q5_K", "q4_K", "q3_K", "q2_K"], err


def test_f16_quantize_equals_numpy_cast(rng):
    x = np.concatenate([rng.standard_normal(64) * 10, [65504.0, 65520.0, 1e5, -1e5, 6e-8, 1e-8,
                                                       5.960464477539063e-08, 0.0, -0.0]])
    x = x.astype(np.float32).reshape(1, -1)
    with np.errstate(over="ignore"):   # 65520 and up overflow to inf on purpose
        got = quantize(x, "f16")
        want = x.astype(np.float16)
    assert got.dtype == np.uint8 and got.shape == (1, 2 * x.shape[1])
    assert_close(got.view(np.uint16), want.view(np.uint16), atol=0, what="f16 bits")
    back = dequantize(got, "f16", x.shape)          # exact, ±inf included
    assert back.dtype == np.float32
    assert np.array_equal(back, want.astype(np.float32))


BF16_CASES = {  # f32 bits → bf16 bits, round to nearest, ties to even
    0x3F800000: 0x3F80,   # 1.0
    0x3F808000: 0x3F80,   # 1 + 2⁻⁸: a tie, the even neighbour is below
    0x3F818000: 0x3F82,   # a tie whose even neighbour is above
    0x3F808001: 0x3F81,   # just above the tie
    0x3F807FFF: 0x3F80,   # just below the tie
    0xBF818000: 0xBF82,   # negative tie rounds away by the same rule
    0x40490FDB: 0x4049,   # π
    0x7F7FFFFF: 0x7F80,   # largest finite f32 rounds up to +inf
    0x7F800000: 0x7F80,   # +inf
    0xFF800000: 0xFF80,   # −inf
    0x80000000: 0x8000,   # −0
    0x00000001: 0x0000,   # smallest subnormal rounds to +0
    0x7FC00000: 0x7FC0,   # the canonical quiet NaN
}


def test_bf16_quantize_rounds_to_nearest_even():
    bits = np.array(list(BF16_CASES), dtype=np.uint32)
    got = quantize(bits.view(np.float32).reshape(1, -1), "bf16").view(np.uint16).ravel()
    want = np.array(list(BF16_CASES.values()), dtype=np.uint16)
    bad = {f"{b:#010x}": (f"{g:#06x}", f"{w:#06x}") for b, g, w in zip(bits, got, want) if g != w}
    assert not bad, f"f32 bits → (got, expected) bf16 bits: {bad}"
    back = dequantize(got, "bf16", (len(bits),))   # exact: bf16 is the top half of an f32
    assert np.array_equal(back.view(np.uint32), want.astype(np.uint32) << 16)


def test_bf16_quantize_keeps_every_nan_a_nan():
    # ggml_compute_fp32_to_bf16 turns any NaN into a quiet NaN; a carry out of the rounding add
    # must not turn a NaN with low payload bits set into ±0 or ±inf.
    bits = np.array([0x7FC00000, 0x7FFFFFFF, 0xFFFFFFFF, 0x7F800001, 0x7FBFFFFF], dtype=np.uint32)
    got = quantize(bits.view(np.float32).reshape(1, -1), "bf16").view(np.uint16).ravel()
    not_nan = [f"{b:#010x} → {g:#06x}" for b, g in zip(bits, got)
               if not ((g & 0x7F80) == 0x7F80 and (g & 0x007F))]
    assert not not_nan, f"NaN inputs came out as non-NaN bf16: {not_nan}"


# -- errors ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("qtype, k", [("q8_0", 33), ("q4_0", 48), ("q4_K", 128), ("q6_K", 300),
                                      ("iq4_nl", 16)])
def test_row_length_not_a_block_multiple_raises_shape_error(rng, qtype, k):
    assert k % block_size(GGMLType.parse(qtype))
    with pytest.raises(ShapeError, match="block size"):
        quantize(rng.standard_normal((2, k)), qtype)


@pytest.mark.parametrize("name", ["q9_0", "fp8", "", "Q4_K_M"])
def test_unknown_type_name_raises_shape_error(rng, name):
    with pytest.raises(ShapeError, match="unknown ggml type"):
        quantize(rng.standard_normal((2, 256)), name)


@pytest.mark.parametrize("qtype", ["i32", "iq2_xxs"], ids=["not_a_weight_type", "needs_imatrix"])
def test_unusable_weight_type_raises_shape_error(rng, qtype):
    with pytest.raises(ShapeError):
        quantize(rng.standard_normal((2, 256)), qtype)


def test_dequantize_wrong_byte_count_raises_shape_error(rng):
    raw = quantize(rng.standard_normal((2, 64)), "q8_0")
    with pytest.raises(ShapeError, match="bytes"):
        dequantize(raw[:, :-1], "q8_0", (2, 64))


# q8_K and q8_1 are ggml_is_quantized (activation formats) but ggml_quantize_chunk has no case
# for them: GGML_ASSERT(result == nrows * row_size) aborts the process. Run in a child process.
@pytest.mark.parametrize("qtype", ["q8_K", "q8_1"])
def test_activation_only_type_raises_shape_error_instead_of_aborting(qtype):
    code = ("import numpy as np\n"
            "from moss_tts.errors import ShapeError\n"
            "from moss_tts.ggml.quant import quantize\n"
            "try:\n"
            f"    quantize(np.ones((1, 256), np.float32), {qtype!r})\n"
            "except ShapeError as e:\n"
            "    print('SHAPE_ERROR', e)\n")
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True,
                          timeout=120)
    detail = (proc.stderr.strip().splitlines() or ["(no stderr)"])[0]
    assert proc.returncode == 0, f"quantize(x, {qtype!r}) died (code {proc.returncode}): {detail}"
    assert "SHAPE_ERROR" in proc.stdout, proc.stdout
