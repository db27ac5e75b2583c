"""The batch command with a MOSS-TTS-Local-Transformer-v1.5 model: the family comes from the
GGUF, a line gets LocalV15TTS's synthesis with its seed, its sampling over the family's
defaults and its frame cap; a Delay-only option fails that line alone."""

import numpy as np

from moss_tts.audio import quantize
from moss_tts.batch import run_batch

from .conftest import read, records, write_jsonl


def test_a_local_v15_model_runs_its_lines_with_its_own_options(tmp_path, tiny_codec):
    from converters.local_v15 import convert
    from fixtures.make_local_v15 import make_tiny_local_v15_checkpoint
    from moss_tts.models.local_v15_tts import LocalV15TTS
    from moss_tts.sampling import LocalV15SamplingOptions

    model = convert(str(make_tiny_local_v15_checkpoint(tmp_path / "hf", continue_bias=6.0)),
                    tmp_path / "local-v15.gguf")
    codec = tiny_codec("v2")
    rows = [{"id": "sampled", "text": "Hello there.", "seed": 3, "max_frames": 6, "top_k": 5},
            {"id": "greedy", "text": "Hello there.", "greedy": True, "max_frames": 6},
            {"id": "delay-option", "text": "Hello there.", "max_new_rows": 10}]
    out = tmp_path / "out"
    summary = run_batch(write_jsonl(tmp_path / "m.jsonl", rows), out, model=str(model),
                        codec=str(codec), threads=1)
    errors = {r["id"]: r["error"] for r in records(out) if r["status"] == "failed"}
    assert list(errors) == ["delay-option"] and len(summary.failed) == 1
    assert "max_new_rows is not a MOSS-TTS" in errors["delay-option"]
    with LocalV15TTS.load(model, codec=codec, threads=1) as tts:
        sampled = tts.synthesize("Hello there.", seed=3, max_frames=6,
                                 options=LocalV15SamplingOptions(audio_top_k=5))[0]
        greedy = tts.synthesize("Hello there.", max_frames=6,
                                options=LocalV15SamplingOptions(do_sample=False))[0]
    assert np.array_equal(read(out / "sampled.wav", channels=2), quantize(sampled, "s16"))
    assert np.array_equal(read(out / "greedy.wav", channels=2), quantize(greedy, "s16"))
    assert not np.array_equal(sampled, greedy)   # guard: the line's options reach the model
