"""Fuzzed model files never crash, hang or make a multi-GB allocation: every GGUF, safetensors,
pytorch_model.bin and codes file below is loaded in a child process under a 2 GB address-space
cap and a timeout (tests/fuzz_child.py), and must load or fail with one line of the package's
error family. The cases: random bytes, a GGUF cut at every section boundary, absurd counts /
dims / offsets / string lengths / types, a tensor table that overlaps the metadata, wrong
metadata types; corrupt safetensors headers; .bin files that are no zip or hold a bad pickle.

MOSS_TTS_FUZZ_SCALE=N multiplies the random cases (the default keeps CI under ~20 s).
"""

import json
import os
import struct
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest

from fixtures.make_codec import make_tiny_v1_checkpoint
from fixtures.torch_zip import write_torch_zip

REPO = Path(__file__).resolve().parents[1]
SCALE = int(os.environ.get("MOSS_TTS_FUZZ_SCALE", "1"))
TIMEOUT = 60 * SCALE   # seconds for one child and all its cases: a hang fails here
U64_MAX, HUGE = 2**64 - 1, 2**62
# enum gguf_type → byte size of a scalar (8 string and 9 array are variable)
GGUF_SCALARS = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}


# -- running ------------------------------------------------------------------------------------
def run_cases(loader: str, cases: list[Path]) -> dict[str, int]:
    """Load every case in one child; fail on a crash, hang, foreign exception or long message.
    Returns the count of each outcome."""
    try:
        proc = subprocess.run([sys.executable, "-m", "tests.fuzz_child", loader,
                               *map(str, cases)], cwd=REPO, capture_output=True, text=True,
                              timeout=TIMEOUT)
        out, died = proc.stdout, proc.returncode != 0
    except subprocess.TimeoutExpired as e:
        out, died = (e.stdout or b"").decode(), True
    lines = out.splitlines()
    started = [line.split(" ", 1)[1] for line in lines if line.startswith("START ")]
    assert not died, (f"{loader}: the child died or hung (code {getattr(proc, 'returncode', '?')})"
                      f" at case {started[-1] if started else '?'}")
    bad = [line for line in lines if line.startswith("BAD ")]
    assert not bad, f"{loader}: {len(bad)} case(s) without a one-line error: " + "; ".join(bad[:5])
    outcomes = {"ERROR": 0, "LOADED": 0}
    for line in lines:
        word = line.split(" ", 1)[0]
        if word in outcomes:
            outcomes[word] += 1
    assert sum(outcomes.values()) == len(cases), f"{loader}: {len(cases)} cases, {outcomes}"
    return outcomes


def random_bytes(rng, n_cases: int, prefix: bytes = b"") -> list[bytes]:
    return [prefix + rng.bytes(int(rng.integers(0, 4096))) for _ in range(n_cases)]


# -- GGUF -------------------------------------------------------------------------------------------
class GGUFLayout:
    """Byte positions of a GGUF v3 file's sections and fields, read independently of ggml."""

    def __init__(self, data: bytes):
        self.data = data
        self.n_tensors, self.n_kv = struct.unpack_from("<QQ", data, 8)
        self.boundaries = [4, 8, 16, 24]
        self.kv = []        # (key position, type position, value position)
        self.tensors = []   # (name position, n_dims position, type position, offset position)
        pos = 24
        for _ in range(self.n_kv):
            key = pos
            pos = self._string_end(pos)
            kind = pos
            pos = self._value_end(struct.unpack_from("<I", data, pos)[0], pos + 4)
            self.kv.append((key, kind, kind + 4))
            self.boundaries += [kind, pos]
        for _ in range(self.n_tensors):
            name = pos
            pos = self._string_end(pos)
            n_dims = struct.unpack_from("<I", data, pos)[0]
            kind = pos + 4 + 8 * n_dims
            self.tensors.append((name, pos, kind, kind + 4))
            pos = kind + 12
            self.boundaries.append(pos)
        self.data_start = -(-pos // 32) * 32   # moss-tts files keep the default alignment
        self.boundaries.append(self.data_start)
        for *_, offset in self.tensors:
            self.boundaries.append(self.data_start + struct.unpack_from("<Q", data, offset)[0])

    def _string_end(self, pos: int) -> int:
        return pos + 8 + struct.unpack_from("<Q", self.data, pos)[0]

    def _value_end(self, kind: int, pos: int) -> int:
        if kind == 8:
            return self._string_end(pos)
        if kind == 9:
            sub, n = struct.unpack_from("<IQ", self.data, pos)
            pos += 12
            if sub in GGUF_SCALARS:
                return pos + n * GGUF_SCALARS[sub]
            for _ in range(n):
                pos = self._value_end(sub, pos)
            return pos
        return pos + GGUF_SCALARS[kind]

    def first_kv_of(self, kind: int):
        return next((k for k in self.kv if struct.unpack_from("<I", self.data, k[1])[0] == kind))


def patched(data: bytes, pos: int, fmt: str, value: int) -> bytes:
    b = bytearray(data)
    struct.pack_into(fmt, b, pos, value)
    return bytes(b)


def duplicate_name(lay: GGUFLayout) -> bytes:
    """The file with one tensor renamed to the name of an earlier one of the same length."""
    spans = [(name, n_dims) for name, n_dims, *_ in lay.tensors]
    a, b = next((a, b) for i, a in enumerate(spans) for b in spans[i + 1:]
                if a[1] - a[0] == b[1] - b[0])
    return lay.data[:b[0]] + lay.data[a[0]:a[1]] + lay.data[b[1]:]


def gguf_structure_cases(data: bytes, rng) -> dict[str, bytes]:
    lay = GGUFLayout(data)
    cases = {f"cut_at_{n}": data[:n] for n in sorted(set(lay.boundaries)) if n < len(data)}
    cases |= {f"cut_at_{n}_minus_1": data[:n - 1] for n in sorted(set(lay.boundaries))[:40]}
    for field, pos in (("n_tensors", 8), ("n_kv", 16)):
        for v in (2**31, HUGE, U64_MAX):
            cases[f"{field}_{v}"] = patched(data, pos, "<Q", v)
    cases["version_1"] = patched(data, 4, "<I", 1)
    cases["version_max"] = patched(data, 4, "<I", 2**32 - 1)
    # fewer KV pairs than stored: the tensor table is read from the metadata bytes
    cases["tensor_table_overlaps_metadata"] = patched(data, 16, "<Q", lay.n_kv - 1)
    cases["tensor_table_overlaps_header"] = patched(data, 16, "<Q", 0)
    key, kind, value = lay.kv[0]
    for v in (0, len(data), HUGE, U64_MAX):
        cases[f"key_length_{v}"] = patched(data, key, "<Q", v)
    cases["kv_type_unknown"] = patched(data, kind, "<I", 99)
    s_key, s_kind, s_value = lay.first_kv_of(8)
    for v in (len(data), HUGE, U64_MAX):
        cases[f"string_length_{v}"] = patched(data, s_value, "<Q", v)
    a_key, a_kind, a_value = lay.first_kv_of(9)
    for v in (HUGE, U64_MAX, 2**40):
        cases[f"array_count_{v}"] = patched(data, a_value + 4, "<Q", v)
    cases["array_of_arrays"] = patched(data, a_value, "<I", 9)
    for which, (name, n_dims, kind, offset) in (("first", lay.tensors[0]), ("last", lay.tensors[-1])):
        cases[f"{which}_tensor_name_length_huge"] = patched(data, name, "<Q", HUGE)
        for v in (0, 5, 2**32 - 1):
            cases[f"{which}_tensor_n_dims_{v}"] = patched(data, n_dims, "<I", v)
        for v in (0, 2**31, HUGE, U64_MAX):
            cases[f"{which}_tensor_dim0_{v}"] = patched(data, n_dims + 4, "<Q", v)
        for v in (4, 99, 2**31, 26, 8):   # removed Q4_2, unknown, absurd, I32, Q8_0 (rows of 4)
            cases[f"{which}_tensor_type_{v}"] = patched(data, kind, "<I", v)
        for v in (1, len(data), HUGE, U64_MAX):
            cases[f"{which}_tensor_offset_{v}"] = patched(data, offset, "<Q", v)
    cases["second_tensor_overlaps_first"] = patched(data, lay.tensors[1][3], "<Q", 0)
    cases["duplicate_tensor_name"] = duplicate_name(lay)
    header_end = lay.data_start
    for i in range(20 * SCALE):   # byte flips in the header and tables
        b = bytearray(data)
        for pos in rng.integers(4, header_end, size=int(rng.integers(1, 8))):
            b[pos] = int(rng.integers(0, 256))
        cases[f"flips_{i}"] = bytes(b)
    for i, blob in enumerate(random_bytes(rng, 10 * SCALE, b"GGUF\x03\x00\x00\x00")):
        cases[f"random_after_magic_{i}"] = blob
    for i, blob in enumerate(random_bytes(rng, 5 * SCALE)):
        cases[f"random_{i}"] = blob
    return cases


def metadata_cases(gguf_path: Path, tmp: Path, kind: str, edits: dict,
                   tensor_edits: dict) -> dict[str, Path]:
    """Well-formed GGUFs of `kind` whose moss.* metadata (`edits`: key → value, None drops it)
    or tensors (`tensor_edits`: name → array, None drops it) have wrong types or values."""
    from converters.gguf_io import write_gguf
    from moss_tts.ggml import GGUFFile, Weights
    from moss_tts.ggml.weights import KIND_KEY, VERSION_KEY

    with GGUFFile(gguf_path) as f:
        meta = {k: f[k] for k in f.keys()
                if k.startswith("moss.") and k not in (KIND_KEY, VERSION_KEY)}
    with Weights.load(gguf_path) as w:
        tensors = {n: w.read(n) for n in w.names()}
    paths = {}
    for label, edit in {**edits, **tensor_edits}.items():
        m = {k: v for k, v in {**meta, **edit}.items() if v is not None} if label in edits else meta
        t = {k: v for k, v in {**tensors, **edit}.items() if v is not None} if label in tensor_edits \
            else tensors
        paths[label] = write_gguf(tmp / f"{label}.gguf", t, m, kind=kind, version=1)
    return paths


def codec_metadata_cases(gguf_path: Path, tmp: Path) -> dict[str, Path]:
    from moss_tts.ggml import GGUFFile

    stage_key = "moss.codec.encoder.context"
    with GGUFFile(gguf_path) as f:
        n_stages = len(f[stage_key])
    edits = {
        "sample_rate_is_text": {"moss.codec.sample_rate": "fast"},
        "sample_rate_is_array": {"moss.codec.sample_rate": np.array([1, 2], np.int32)},
        "channels_zero": {"moss.codec.channels": 0},
        "variant_is_number": {"moss.codec.variant": 3},
        "stage_array_is_text": {stage_key: "100"},
        "stage_array_too_short": {stage_key: np.array([1], np.int32)},
        "stage_array_of_strings": {stage_key: ["a"] * n_stages},
        "context_negative": {stage_key: np.full(n_stages, -5, np.int64)},
        "huge_context": {stage_key: np.full(n_stages, 2**40, np.int64)},
        "n_quantizers_huge": {"moss.codec.quantizer.n_quantizers": 2**40},
        "codebook_size_zero": {"moss.codec.quantizer.codebook_size": 0},
        "rope_base_is_text": {"moss.codec.rope_base": "x"},
        "downsample_zero": {"moss.codec.downsample_rate": 0},
        "missing_key": {"moss.codec.code_dim": None},
    }
    return metadata_cases(gguf_path, tmp, "codec", edits, weight_edits(gguf_path, "norm1.weight"))


def nano_metadata_cases(gguf_path: Path, tmp: Path) -> dict[str, Path]:
    edits = {
        "n_embd_is_text": {"moss.nano.global.n_embd": "wide"},
        "n_layer_huge": {"moss.nano.global.n_layer": 2**40},
        "n_head_zero": {"moss.nano.local.n_head": 0},
        "eps_is_text": {"moss.nano.global.layer_norm_epsilon": "small"},
        "activation_is_number": {"moss.nano.global.activation_function": 7},
        "n_vq_huge": {"moss.nano.n_vq": 2**40},
        "token_id_negative": {"moss.nano.im_start_token_id": -3},
        "token_id_is_array": {"moss.nano.audio_end_token_id": np.array([1, 2], np.int32)},
        "tokenizer_missing": {"moss.tokenizer.sentencepiece": None},
        "tokenizer_garbage": {"moss.tokenizer.sentencepiece": b"\x00not a sentencepiece model"},
        "missing_key": {"moss.nano.vocab_size": None},
    }
    return metadata_cases(gguf_path, tmp, "nano", edits, weight_edits(gguf_path, "ln_f.weight"))


def weight_edits(gguf_path: Path, suffix: str) -> dict:
    from moss_tts.ggml import Weights

    with Weights.load(gguf_path) as w:
        name = next(n for n in w.names() if n.endswith(suffix))
        value = w.read(name)
    return {"tensor_wrong_dtype_i32": {name: value.astype(np.int32)},
            "tensor_wrong_shape": {name: np.zeros(3, np.float32)},
            "tensor_missing": {name: None}}


@pytest.fixture(scope="module")
def codec_gguf(tiny_codec):
    return tiny_codec()


def write_cases(tmp: Path, cases: dict[str, bytes], suffix: str) -> list[Path]:
    paths = []
    for label, blob in cases.items():
        p = tmp / f"{label}{suffix}"
        p.write_bytes(blob)
        paths.append(p)
    return paths


def test_fuzzed_gguf_files_fail_with_one_line_errors(codec_gguf, tmp_path):
    rng = np.random.default_rng(11)
    cases = write_cases(tmp_path, gguf_structure_cases(codec_gguf.read_bytes(), rng), ".gguf")
    cases.append(codec_gguf)   # guard: the unmodified file loads, so the harness can pass
    for loader in ("gguf", "codec"):
        outcomes = run_cases(loader, cases)
        assert outcomes["LOADED"] >= 1
        print(f"fuzz {loader}: {len(cases)} cases {outcomes}")


@pytest.fixture(scope="module")
def nano_gguf(tmp_path_factory):
    from converters.nano import convert as convert_nano
    from fixtures.make_nano import make_tiny_nano_tts_checkpoint
    from fixtures.make_spm import make_tiny_spm

    root = tmp_path_factory.mktemp("fuzz_nano")
    ckpt = make_tiny_nano_tts_checkpoint(root / "hf", seed=0, tokenizer_model_bytes=make_tiny_spm())
    return convert_nano(str(ckpt), root / "nano.gguf")


def test_model_metadata_of_the_wrong_type_fails_with_one_line_errors(codec_gguf, nano_gguf,
                                                                     tmp_path):
    for loader, path, make in (("codec", codec_gguf, codec_metadata_cases),
                               ("nano", nano_gguf, nano_metadata_cases)):
        (tmp_path / loader).mkdir()
        cases = list(make(path, tmp_path / loader).values())
        outcomes = run_cases(loader, cases + [path])
        assert outcomes["LOADED"] == 1, "every case but the original is a broken model"
        print(f"fuzz {loader} metadata: {len(cases)} cases {outcomes}")


# -- safetensors and pytorch_model.bin ---------------------------------------------------------------
def safetensors_cases(data: bytes, rng) -> dict[str, bytes]:
    n = struct.unpack_from("<Q", data)[0]
    header, body = json.loads(data[8:8 + n]), data[8 + n:]

    def with_header(h) -> bytes:
        raw = json.dumps(h).encode() if not isinstance(h, bytes) else h
        return struct.pack("<Q", len(raw)) + raw + body

    first = next(k for k in header if k != "__metadata__")
    t = header[first]
    edits = {
        "dtype_unknown": dict(t, dtype="X9"),
        "shape_huge": dict(t, shape=[2**40, 2**40]),
        "shape_negative": dict(t, shape=[-1]),
        "offsets_reversed": dict(t, data_offsets=t["data_offsets"][::-1]),
        "offsets_past_end": dict(t, data_offsets=[0, len(body) + 8]),
        "offsets_huge": dict(t, data_offsets=[0, 2**62]),
        "offsets_missing": {k: v for k, v in t.items() if k != "data_offsets"},
        "entry_not_a_dict": 7,
    }
    cases = {label: with_header({**header, first: e}) for label, e in edits.items()}
    cases |= {"header_not_json": with_header(b"{not json"), "header_a_list": with_header([1, 2]),
              "header_not_utf8": with_header(b"\xff\xfe{}"), "empty": b"", "seven_bytes": data[:7]}
    for v in (0, len(data), HUGE, U64_MAX):
        cases[f"header_length_{v}"] = patched(data, 0, "<Q", v)
    for cut in (8, 8 + n // 2, 8 + n, 8 + n + len(body) // 2, len(data) - 1):
        cases[f"cut_at_{cut}"] = data[:cut]
    for i, blob in enumerate(random_bytes(rng, 10 * SCALE)):
        cases[f"random_{i}"] = blob
    return cases


def torch_bin_cases(tmp: Path, rng) -> dict[str, Path]:
    w = {"w": np.arange(6, dtype=np.float32).reshape(2, 3)}
    cases = {f"random_{i}": blob for i, blob in enumerate(random_bytes(rng, 10 * SCALE))}
    files = {label: blob for label, blob in cases.items()}
    files["empty"] = b""
    files["truncated_zip"] = None
    layouts = {"shape_huge_stride_0": (0, (2**20, 2**20), (0, 0)),
               "shape_past_storage": (0, (4, 3), (3, 1)),
               "offset_past_storage": (100, (2, 3), (3, 1)),
               "stride_negative": (0, (2, 3), (-3, 1)),
               "shape_negative": (0, (-2, 3), (3, 1))}
    dirs = {}
    tmp.mkdir()
    for label, blob in files.items():
        d = tmp / label
        d.mkdir()
        if blob is None:
            write_torch_zip(d / "pytorch_model.bin", w)
            raw = (d / "pytorch_model.bin").read_bytes()
            (d / "pytorch_model.bin").write_bytes(raw[: len(raw) // 2])
        else:
            (d / "pytorch_model.bin").write_bytes(blob)
        dirs[label] = d
    for label, layout in layouts.items():
        d = tmp / label
        d.mkdir()
        write_torch_zip(d / "pytorch_model.bin", w, layouts={"w": layout})
        dirs[label] = d
    pickles = {"pickle_random": rng.bytes(200), "pickle_truncated": b"\x80\x02}q\x00(X",
               "pickle_calls_os_system": b"\x80\x02cos\nsystem\nq\x00X\x04\x00\x00\x00truequ\x01Rq\x02.",
               "pickle_not_a_dict": b"\x80\x02K\x07."}
    for label, pkl in pickles.items():
        d = tmp / label
        d.mkdir()
        with zipfile.ZipFile(d / "pytorch_model.bin", "w") as z:
            z.writestr("archive/data.pkl", pkl)
        dirs[label] = d
    d = tmp / "storage_missing"
    d.mkdir()
    write_torch_zip(tmp / "full.bin", w)
    with zipfile.ZipFile(tmp / "full.bin") as src, zipfile.ZipFile(d / "pytorch_model.bin", "w") as z:
        for item in src.namelist():
            if "/data/" not in item:
                z.writestr(item, src.read(item))
    dirs["storage_missing"] = d
    return dirs


def test_fuzzed_checkpoints_fail_with_one_line_errors(tmp_path):
    rng = np.random.default_rng(12)
    good = make_tiny_v1_checkpoint(tmp_path / "good", seed=0)
    data = (good / "model.safetensors").read_bytes()
    dirs = []
    for label, blob in safetensors_cases(data, rng).items():
        d = tmp_path / "st" / label
        d.mkdir(parents=True)
        (d / "model.safetensors").write_bytes(blob)
        dirs.append(d)
    index = {"index_not_json": "{", "index_map_not_a_dict": '{"weight_map": 3}',
             "index_shard_missing": '{"weight_map": {"a": "nope.safetensors"}}'}
    for label, text in index.items():
        d = tmp_path / "st" / label
        d.mkdir(parents=True)
        (d / "model.safetensors").write_bytes(data)
        (d / "model.safetensors.index.json").write_text(text)
        dirs.append(d)
    dirs += list(torch_bin_cases(tmp_path / "bin", rng).values())
    dirs.append(good)   # guard: a good checkpoint loads
    outcomes = run_cases("checkpoint", dirs)
    assert outcomes["LOADED"] >= 1
    print(f"fuzz checkpoints: {len(dirs)} cases {outcomes}")


def test_fuzzed_codes_files_fail_with_one_line_errors(tmp_path):
    rng = np.random.default_rng(13)
    good = tmp_path / "good.npy"
    np.save(good, np.zeros((2, 3), np.int32))
    data = good.read_bytes()
    header_end = data.index(b"\n") + 1
    cases = {"shape_huge": data[:10] + data[10:header_end].replace(b"(2, 3)", b"(2**40,)"),
             "cut_header": data[:20], "cut_data": data[:-4], "object_dtype": None}
    cases["shape_huge"] = data.replace(b"(2, 3), }", b"(1099511627776,), }")
    cases["object_dtype"] = data.replace(b"'<i4'", b"'|O' ")
    for i, blob in enumerate(random_bytes(rng, 10 * SCALE, b"\x93NUMPY\x01\x00")):
        cases[f"random_after_magic_{i}"] = blob
    paths = write_cases(tmp_path, cases, ".npy") + [good]
    outcomes = run_cases("codes", paths)
    assert outcomes["LOADED"] >= 1
    print(f"fuzz codes: {len(paths)} cases {outcomes}")


# -- audio files ---------------------------------------------------------------------------------
def wav_cases(data: bytes, rng) -> dict[str, bytes]:
    """A PCM WAV (44-byte header: fmt fields at 22.., data size at 40) with absurd fields."""
    fields = {"channels": (22, "<H", (0, 1024, 65535)), "rate": (24, "<I", (0, 2**31, 2**32 - 1)),
              "block_align": (32, "<H", (0, 65535)), "bits": (34, "<H", (0, 7, 64, 65535)),
              "data_size": (40, "<I", (0, 2**32 - 1)), "riff_size": (4, "<I", (0, 2**32 - 1))}
    cases = {f"{name}_{v}": patched(data, pos, fmt, v)
             for name, (pos, fmt, values) in fields.items() for v in values}
    cases |= {f"cut_at_{n}": data[:n] for n in (4, 12, 20, 36, 43, 44, 45, len(data) // 2)}
    for i, blob in enumerate(random_bytes(rng, 10 * SCALE, data[:12])):
        cases[f"random_after_riff_{i}"] = blob
    return cases


def flac_cases(data: bytes, rng) -> dict[str, bytes]:
    """A FLAC: STREAMINFO (bytes 8..41: rates, channels, bits and the total sample count)."""
    cases = {f"cut_at_{n}": data[:n] for n in (4, 8, 26, 42, len(data) // 2)}
    cases["streaminfo_ones"] = data[:18] + b"\xff" * 8 + data[26:]
    cases["streaminfo_zeros"] = data[:18] + b"\x00" * 8 + data[26:]
    cases["block_size_zero"] = data[:8] + b"\x00" * 4 + data[12:]
    for i in range(5 * SCALE):
        b = bytearray(data)
        for pos in rng.integers(4, len(data), size=int(rng.integers(1, 40))):
            b[pos] = int(rng.integers(0, 256))
        cases[f"flips_{i}"] = bytes(b)
    return cases


def test_fuzzed_audio_files_fail_with_one_line_errors(tmp_path):
    import soundfile as sf
    rng = np.random.default_rng(14)
    x = (0.1 * rng.standard_normal((3200, 2))).astype(np.float32)
    paths = []
    for suffix, fmt, make in ((".wav", "WAV", wav_cases), (".flac", "FLAC", flac_cases)):
        good = tmp_path / f"good{suffix}"
        sf.write(good, x, 3200, format=fmt, subtype="PCM_16")
        paths += write_cases(tmp_path, {f"{fmt}_{k}": v for k, v in
                                        make(good.read_bytes(), rng).items()}, suffix) + [good]
    outcomes = run_cases("audio", paths)
    assert outcomes["LOADED"] >= 2
    print(f"fuzz audio: {len(paths)} cases {outcomes}")
