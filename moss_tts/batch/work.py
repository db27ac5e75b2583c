"""What one batch worker does (a local process or a Ray actor): keep the models it has loaded,
keyed by path, and turn one line into encoded audio bytes or an error.

The worker writes nothing: the bytes go back to the driver, which owns the output directory and
the results file, so a worker killed at any moment leaves no file behind.
"""

from __future__ import annotations

import time

from ..audio import DEFAULT_SAMPLE_FORMAT, container_of, encode_file
from ..errors import ModelFileError, MossTTSError
from ..ggml.weights import KIND_KEY, GGUFFile

MAX_VOICES = 32  # encoded references kept per worker (a corpus usually has a few speakers)
# manifest option name → SamplingOptions field
SAMPLING_FIELDS = {"temperature": "audio_temperature", "text_temperature": "text_temperature",
                   "top_k": "audio_top_k", "top_p": "audio_top_p",
                   "repetition_penalty": "audio_repetition_penalty"}


def _load_nano(model: str, codec: str, threads: int):
    from ..models.nano_tts import NanoTTS

    return NanoTTS.load(model, codec=codec, threads=threads)


# moss.kind → loader; a family the batch command supports adds itself here
FAMILIES = {"nano": _load_nano}


def model_family(path: str) -> str:
    with GGUFFile(path) as f:
        return f.get(KIND_KEY) or "(none)"


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
                                       seed=task["seed"], **_synthesis_options(task["options"]))
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
            family = model_family(model)
            if family not in FAMILIES:
                raise ModelFileError(f"{model}: model family {family!r} is not supported by batch "
                                     f"(supported: {', '.join(sorted(FAMILIES))})")
            self.models[key] = FAMILIES[family](model, codec, self.threads)
        return self.models[key]

    def _voice(self, tts, task: dict):
        """The line's voice (a stored voice or a reference file), encoded once per model."""
        from ..models.nano_tts import Reference

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
                from ..voices import load_voice
                codes = load_voice(key[2], root=task["voices_dir"])[0]
                self.voices[key] = Reference(codes[:, : tts.config.n_vq])
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


def _synthesis_options(options: dict) -> dict:
    """Manifest options → synthesize() keywords (SamplingOptions checks the values)."""
    from ..sampling import SamplingOptions

    sampling = {field: options[name] for name, field in SAMPLING_FIELDS.items() if name in options}
    if "greedy" in options:
        sampling["do_sample"] = not options["greedy"]
    extra = {k: options[k] for k in ("max_frames", "max_text_tokens") if k in options}
    return {"options": SamplingOptions(**sampling), **extra}
