"""What one batch worker does (a local process or a Ray actor): keep the models it has loaded,
keyed by path, and turn one line into encoded audio bytes or an error.

The worker writes nothing: the bytes go back to the driver, which owns the output directory and
the results file, so a worker killed at any moment leaves no file behind.
"""

from __future__ import annotations

import dataclasses
import time

from ..audio import DEFAULT_SAMPLE_FORMAT, container_of, encode_file
from ..errors import InputError, MossTTSError

MAX_VOICES = 32  # encoded references kept per worker (a corpus usually has a few speakers)
# manifest option name → SamplingOptions field
SAMPLING_FIELDS = {"temperature": "audio_temperature", "text_temperature": "text_temperature",
                   "top_k": "audio_top_k", "top_p": "audio_top_p",
                   "repetition_penalty": "audio_repetition_penalty"}


# stream keywords a manifest line may give, per family (moss.kind); sampling options go to the
# family's own options dataclass
FAMILY_OPTIONS = {"nano": ("max_frames", "max_text_tokens"), "delay": ("max_new_rows",),
                  "local": ("max_frames",), "local-v15": ("max_frames",),
                  "realtime": ("max_frames",)}


class LineRunner:
    """A worker's state: loaded models by (model path, codec path), encoded voices by model."""

    def __init__(self, threads: int):
        self.threads = threads
        self.models: dict[tuple[str, str], object] = {}
        self.voices: dict[tuple, object] = {}

    def run(self, task: dict) -> dict:
        """task (see driver.Job.add) → outcome: status, error, retry, duration, seconds, audio."""
        start = time.perf_counter()
        outcome = {"id": task["id"], "status": "failed", "audio": None, "duration": None}
        try:
            tts = self._model(task["model"], task["codec"])
            audio, sr = tts.synthesize(task["text"], reference=self._voice(tts, task),
                                       seed=task["seed"],
                                       **synthesis_options(task["options"], type(tts)))
            outcome.update(status="ok", duration=len(audio) / sr,
                           audio=encode_file(audio, sr, container_of(task["id"] + task["suffix"],
                                                                   DEFAULT_SAMPLE_FORMAT),
                                             DEFAULT_SAMPLE_FORMAT))
        except MossTTSError as e:       # the line's input or model is wrong: another try won't help
            outcome.update(error=str(e), retry=False)
        except Exception as e:          # anything else may be transient (memory, I/O): retried
            outcome.update(error=f"{type(e).__name__}: {e}", retry=True)
        outcome["seconds"] = time.perf_counter() - start
        return outcome

    def _model(self, model: str, codec: str):
        key = (model, codec)
        if key not in self.models:
            from ..load import tts_class   # the family from the GGUF kind, as `tts` does

            self.models[key] = tts_class(model).load(model, codec=codec, threads=self.threads)
        return self.models[key]

    def _voice(self, tts, task: dict):
        """The line's voice (a stored voice or a reference file), encoded once per model; a
        stored voice made with another codec is refused by name (`tts.voice`), as in `tts`."""
        if task.get("voice"):
            key = (id(tts), "voice", task["voice"])
        elif task.get("reference"):
            key = (id(tts), "reference", task["reference"])
        else:
            return None
        if key not in self.voices:
            if len(self.voices) >= MAX_VOICES:
                self.voices.pop(next(iter(self.voices)))
            if key[1] == "voice":
                self.voices[key] = tts.voice(key[2], root=task["voices_dir"])
            else:
                from ..audio import REFERENCE_MAX_SECONDS, read_audio
                self.voices[key] = tts.encode_reference(
                    *read_audio(key[2], max_seconds=REFERENCE_MAX_SECONDS))
        return self.voices[key]

    def close(self) -> None:
        for tts in self.models.values():
            tts.close()
        self.models.clear()
        self.voices.clear()


def synthesis_options(options: dict, tts_class) -> dict:
    """Manifest options → synthesize() keywords for a family: the sampling fields over its
    options dataclass's defaults (which checks them), greedy as the `tts` command makes it, and
    the stream keywords the family takes; another family's keyword is this line's error."""
    fields = {f.name for f in dataclasses.fields(tts_class.OPTIONS)}
    sampling = {field: options[name] for name, field in SAMPLING_FIELDS.items() if name in options}
    if "greedy" in options and "do_sample" in fields:
        sampling["do_sample"] = not options["greedy"]
    elif options.get("greedy"):     # a family without a switch is greedy at temperature 0
        sampling.update(text_temperature=0, audio_temperature=0)
    own = FAMILY_OPTIONS.get(tts_class.FAMILY, ())
    for name in (n for names in FAMILY_OPTIONS.values() for n in names):
        if name in options and name not in own:
            raise InputError(f"{name} is not a {tts_class.NAME} option; leave it out for this "
                             "model")
    return {"options": tts_class.OPTIONS(**sampling), **{k: options[k] for k in own if k in options}}
