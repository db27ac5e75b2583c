"""moss_tts/codec/codec.py user errors: a wrong file, bad codes and bad audio raise one-line typed
errors (design §6) before any graph runs, and the codec keeps working afterwards."""

import numpy as np
import pytest

from converters.gguf_io import write_gguf
from fixtures.compare import assert_close
from moss_tts.codec import Codec
from moss_tts.errors import InputError, ModelFileError

from .conftest import THREADS


def one_line(excinfo):
    msg = str(excinfo.value)
    assert msg and "\n" not in msg, msg
    return msg


@pytest.fixture(scope="module")
def baseline(codec):
    codes = np.random.default_rng(3).integers(0, codec.config.codebook_size,
                                              (codec.n_quantizers, 6), dtype=np.int32)
    return codes, codec.decode(codes)


@pytest.fixture(autouse=True)
def codec_survives(codec, baseline):
    """After every error below, the same codec still decodes exactly as before."""
    yield
    codes, want = baseline
    assert_close(codec.decode(codes), want, atol=0.0, what="decode after the error")


# -- files ------------------------------------------------------------------------------------


def test_load_rejects_a_gguf_of_another_kind(tmp_path):
    path = write_gguf(tmp_path / "nano.gguf", {"x.weight": np.ones((4, 4), np.float32)}, {},
                      kind="nano", version=1)
    with pytest.raises(ModelFileError) as e:
        Codec.load(path, threads=THREADS)
    msg = one_line(e)
    assert "expected a codec" in msg and "nano" in msg


def test_load_rejects_a_non_gguf_file(tiny_checkpoint):
    with pytest.raises(ModelFileError) as e:
        Codec.load(tiny_checkpoint / "model.safetensors", threads=THREADS)
    assert "not a GGUF" in one_line(e)


def test_load_rejects_a_missing_file(tmp_path):
    with pytest.raises(ModelFileError) as e:
        Codec.load(tmp_path / "nothing.gguf", threads=THREADS)
    assert "nothing.gguf" in one_line(e)


# -- codes ------------------------------------------------------------------------------------


@pytest.mark.parametrize("value", [64, -1, 1024], ids=["codebook_size", "negative", "pad_1024"])
def test_decode_rejects_codes_out_of_range(codec, baseline, value):
    codes = baseline[0].copy()
    codes[2, 4] = value
    with pytest.raises(InputError) as e:
        codec.decode(codes)
    msg = one_line(e)
    assert str(value) in msg and "codebook 2" in msg and "frame 4" in msg


@pytest.mark.parametrize("shape", [(6,), (8, 1, 6), (8, 0), (0, 6)],
                         ids=["rank1", "rank3", "no_frames", "no_codebooks"])
def test_decode_rejects_codes_of_wrong_shape(codec, shape):
    with pytest.raises(InputError) as e:
        codec.decode(np.zeros(shape, np.int32))
    assert "shape" in one_line(e)


@pytest.mark.parametrize("dtype", [np.float32, np.float64, bool])
def test_decode_rejects_non_integer_codes(codec, baseline, dtype):
    with pytest.raises(InputError) as e:
        codec.decode(baseline[0].astype(dtype))
    assert "integer" in one_line(e)


def test_too_many_codebooks_are_rejected(codec, baseline, clip):
    codes = baseline[0]
    cases = {
        "9 rows": (lambda: codec.decode(np.concatenate([codes, codes[:1]])), "9 codebooks"),
        "decode n_quantizers=9": (lambda: codec.decode(codes, n_quantizers=9), "9 codebooks"),
        "decode n_quantizers=0": (lambda: codec.decode(codes, n_quantizers=0), "0 codebooks"),
        "more than given": (lambda: codec.decode(codes[:3], n_quantizers=4), "4 codebooks"),
        "encode n_quantizers=9": (lambda: codec.encode(clip, codec.sample_rate, n_quantizers=9),
                                  "got 9"),
        "stream n_quantizers=9": (lambda: codec.stream_decoder(n_quantizers=9), "got 9"),
    }
    for what, (call, expected) in cases.items():
        with pytest.raises(InputError) as e:
            call()
        assert expected in one_line(e), what


def test_stream_decoder_rejects_bad_codes_and_keeps_its_state(codec, baseline):
    codes, want = baseline
    with codec.stream_decoder() as decoder:
        first = decoder.push(codes[:, :3])
        bad = codes[:, 3:].copy()
        bad[0, 0] = 1024
        with pytest.raises(InputError) as e:
            decoder.push(bad)
        one_line(e)
        rest = decoder.push(codes[:, 3:])
    assert_close(np.concatenate([first, rest]), want, atol=1e-5,
                 what="stream continued after a rejected push")


# -- audio ------------------------------------------------------------------------------------


AUDIO = {
    "empty": (np.zeros(0, np.float32), "no samples"),
    "nan": (np.full(640, np.nan, np.float32), "NaN"),
    "one_nan": (np.where(np.arange(640) == 300, np.nan, 0.1).astype(np.float32), "NaN"),
    "inf": (np.where(np.arange(640) == 5, np.inf, 0.1).astype(np.float32), "infinite"),
    "shorter_than_a_frame": (np.full(63, 0.1, np.float32), "shorter than one code frame"),
    "rank3": (np.zeros((640, 1, 1), np.float32), "shape"),
    "no_channels": (np.zeros((640, 0), np.float32), "no samples"),
    "strings": (np.array(["a"] * 640), "numbers"),
}


@pytest.mark.parametrize("name", AUDIO)
def test_encode_rejects_unusable_audio(codec, name):
    samples, expected = AUDIO[name]
    with pytest.raises(InputError) as e:
        codec.encode(samples, codec.sample_rate)
    assert expected in one_line(e)


def test_encode_rejects_a_rate_that_leaves_less_than_one_frame(codec):
    # 100 samples at 4800 Hz resample to 66 at 3200 Hz: ≥ one frame of 64; 90 give 60: not
    with pytest.raises(InputError) as e:
        codec.encode(np.full(90, 0.1, np.float32), 4800)
    assert "shorter than one code frame" in one_line(e)
    assert codec.encode(np.full(100, 0.1, np.float32), 4800).shape == (codec.n_quantizers, 1)


@pytest.mark.parametrize("rate", [0, -3200])
def test_encode_rejects_a_non_positive_sample_rate(codec, clip, rate):
    with pytest.raises(InputError) as e:
        codec.encode(clip, rate)
    assert "sample_rate must be a whole number at least 1" in one_line(e)


# -- API arguments (issue 11: these were TypeError / ValueError / AttributeError tracebacks) ---


@pytest.mark.parametrize("rate", [None, "24000", 16000.5, float("nan"), True])
def test_encode_rejects_a_sample_rate_that_is_not_a_whole_number(codec, clip, rate):
    with pytest.raises(InputError) as e:
        codec.encode(clip, rate)
    assert "sample_rate must be a whole number" in one_line(e)


def test_encode_takes_an_integral_float_rate(codec, clip):
    rate = float(codec.sample_rate)
    np.testing.assert_array_equal(codec.encode(clip, rate), codec.encode(clip, codec.sample_rate))


@pytest.mark.parametrize("frames", [0, "8", 2.5])
def test_stream_decoder_push_size_must_be_a_whole_number(codec, frames):
    with pytest.raises(InputError) as e:
        codec.stream_decoder(max_push_frames=frames)
    assert "max_push_frames must be a whole number at least 1" in one_line(e)


@pytest.mark.parametrize("k", ["2", 1.5, 0])
def test_n_quantizers_must_be_a_whole_number_in_range(codec, baseline, k):
    with pytest.raises(InputError) as e:
        codec.decode(baseline[0], n_quantizers=k)
    assert "n_quantizers" in one_line(e) or "codebooks" in one_line(e)


def test_a_closed_codec_raises_input_error(codec_gguf, clip):
    closed = Codec.load(codec_gguf, threads=THREADS)
    codes = closed.encode(clip, closed.sample_rate)
    closed.close()
    for call in (lambda: closed.decode(codes), lambda: closed.encode(clip, closed.sample_rate),
                 lambda: closed.stream_decoder()):
        with pytest.raises(InputError) as e:
            call()
        assert "closed" in one_line(e)
