"""A model or codec load that fails half-way (wrong kind, mismatched pair) releases every file it
mapped at once, even while the caller still holds the exception (moss_tts/ggml/weights.py,
codec/codec.py, models/nano.py, models/nano_tts.py). Counted in /proc/self/maps."""

import os
import shutil
import sys

import pytest

from moss_tts.codec import Codec
from moss_tts.errors import ModelFileError
from moss_tts.models.nano_tts import NanoTTS

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"),
                                reason="counts mappings in /proc/self/maps (Linux only)")


def mappings(path) -> int:
    """How many regions of this process map `path`."""
    real = os.path.realpath(path)
    with open("/proc/self/maps") as f:
        return sum(line.rstrip().endswith(real) for line in f)


@pytest.fixture
def files(tmp_path, nano_files, codec_gguf, v1_codec_gguf):
    """Private copies (other tests' session fixtures keep the shared files mapped)."""
    _, nano = nano_files()
    return {"nano": shutil.copy(nano, tmp_path / "nano.gguf"),
            "stereo": shutil.copy(codec_gguf, tmp_path / "stereo.gguf"),
            "mono": shutil.copy(v1_codec_gguf, tmp_path / "mono.gguf")}


def test_mappings_are_counted_while_a_load_is_open(files):
    # guard: the count sees a loaded model, so the zero counts below mean something
    with NanoTTS.load(files["nano"], codec=files["stereo"]):
        assert mappings(files["nano"]) >= 1 and mappings(files["stereo"]) >= 1
    assert mappings(files["nano"]) == mappings(files["stereo"]) == 0


@pytest.mark.parametrize("case", ["codec_given_a_model", "model_given_a_codec",
                                  "codec_of_the_wrong_kind", "codec_that_does_not_fit"])
def test_a_load_failing_half_way_leaves_no_mapping(files, case):
    load = {
        "codec_given_a_model": lambda: Codec.load(files["nano"]),
        "model_given_a_codec": lambda: NanoTTS.load(files["stereo"], codec=files["stereo"]),
        "codec_of_the_wrong_kind": lambda: NanoTTS.load(files["nano"], codec=files["nano"]),
        "codec_that_does_not_fit": lambda: NanoTTS.load(files["nano"], codec=files["mono"]),
    }[case]
    with pytest.raises(ModelFileError) as excinfo:   # held: its traceback keeps the frames
        load()
    assert excinfo.traceback   # the frames that would keep a leaked map alive are still here
    left = {name: mappings(path) for name, path in files.items()}
    assert left == {"nano": 0, "stereo": 0, "mono": 0}, f"{case}: still mapped {left}"
