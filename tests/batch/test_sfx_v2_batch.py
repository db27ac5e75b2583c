"""`batch` with MOSS-SoundEffect v2.0 (the tiny pipeline through the real converter): a `sound`
column and the diffusion columns, no codec; each line's audio is the API's for its seed, a bad
value fails its line only."""

import numpy as np
import pytest

from fixtures.make_soundeffect_v2 import make_tiny_sfx_v2
from moss_tts import load_tts
from moss_tts.audio import quantize
from moss_tts.batch import run_batch

from .conftest import records, write_jsonl


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return str(make_tiny_sfx_v2(tmp_path_factory.mktemp("batch_sfx_v2"))["gguf"])


def test_sound_lines_make_the_apis_audio_and_a_bad_one_fails_alone(model, tmp_path):
    import soundfile as sf

    write_jsonl(tmp_path / "m.jsonl", [
        {"id": "rain", "sound": "rain on a tin roof", "seconds": 0.7, "steps": 2, "seed": 3},
        {"id": "short", "sound": "thunder", "seconds": 0.5, "steps": 2, "seed": 4,
         "short_latent": True, "negative": "speech"},
        {"id": "too-long", "sound": "wind", "seconds": 31},
        {"id": "greedy", "sound": "wind", "greedy": True}])
    run_batch(tmp_path / "m.jsonl", tmp_path / "out", model=model, threads=1)
    done = {r["id"]: r for r in records(tmp_path / "out")}
    assert {i: r["status"] for i, r in done.items()} == {
        "rain": "ok", "short": "ok", "too-long": "failed", "greedy": "failed"}, done
    assert "seconds must be at most 30" in done["too-long"]["error"]
    assert "greedy is not a MOSS-SoundEffect-v2.0 option" in done["greedy"]["error"]
    with load_tts(model, threads=1) as tts:
        for name, kw in (("rain", dict(sound="rain on a tin roof", seconds=0.7, seed=3)),
                         ("short", dict(sound="thunder", seconds=0.5, seed=4,
                                        short_latent=True, negative="speech"))):
            want = quantize(tts.synthesize(steps=2, **kw)[0], "s16")
            got, sr = sf.read(tmp_path / "out" / f"{name}.wav", dtype="int16", always_2d=True)
            assert sr == 60
            np.testing.assert_array_equal(got, want)
