"""What one batch worker does (a local process or a Ray actor): keep the models it has loaded,
keyed by path, and turn one line into encoded audio bytes or an error.

The worker writes nothing: the bytes go back to the driver, which owns the output directory and
the results file, so a worker killed at any moment leaves no file behind.
"""

from __future__ import annotations

import contextlib
import logging
import time
import warnings

from ..audio import DEFAULT_SAMPLE_FORMAT, container_of, encode_file
from ..errors import InputError, MossTTSError

# what may pass on another try; a dead worker is retried too (driver.Job.lost)
TRANSIENT = (MemoryError, OSError)
MAX_WARNINGS = 10  # distinct warnings kept per line (one per text chunk could be thousands)
MAX_VOICES = 32  # encoded references kept per worker (a corpus usually has a few speakers)


class LineRunner:
    """A worker's state: loaded models by (model path, codec path) on its backend (a name:
    `cpu`, `cuda`, `rpc://HOST:PORT`, opened in the worker's own process), encoded voices by
    model."""

    def __init__(self, threads: int, backend: str = "cpu"):
        self.threads = threads
        self.backend = backend
        self.models: dict[tuple[str, str], object] = {}
        self.voices: dict[tuple, object] = {}

    def run(self, task: dict) -> dict:
        """task (see driver.Job.add) → outcome: status, error, retry, scope, duration, seconds,
        warnings, audio. scope "model": the model and codec failed to load together, so every
        line of that pair would fail the same way."""
        start = time.perf_counter()
        outcome = new_outcome(task)
        tts = self._load(task, outcome)
        if tts is not None:
            with captured_warnings() as messages:
                with failure(outcome):
                    audio, sr = tts.synthesize(task["text"], seed=task["seed"],
                                               **self._words(tts, task))
                    encoded(outcome, task, audio, sr)
            outcome["warnings"] = messages
        outcome["seconds"] = time.perf_counter() - start
        return outcome

    def run_many(self, tasks: list[dict], streams: int) -> list[dict]:
        """Up to `streams` lines of one model decoded together (its `synthesize_many`), each
        with its own outcome as `run` makes it. Each line's model and knobs are checked alone
        first, so a bad line fails without its batch-mates; if the batched call still fails,
        each of its lines runs alone, so the error is the line's own (its audio alone equals
        its audio in a batch)."""
        if streams < 2 or len(tasks) < 2:
            return [self.run(task) for task in tasks]
        start = time.perf_counter()
        outcomes = [new_outcome(task) for task in tasks]
        groups: dict[int, list] = {}    # id(tts) → [(index, request)] of the lines ready
        for i, task in enumerate(tasks):
            tts = self._load(task, outcomes[i])
            if tts is None:
                continue
            with captured_warnings() as messages, failure(outcomes[i]):
                words = self._words(tts, task)
                groups.setdefault(id(tts), [tts]).append(
                    (i, dict(words, text=task["text"], seed=task["seed"])))
            outcomes[i]["warnings"] = messages
        for tts, *ready in groups.values():
            self._together(tts, ready, tasks, outcomes, streams)
        for outcome in outcomes:
            if outcome["seconds"] is None:      # its batch's wall time, or its own failure's
                outcome["seconds"] = time.perf_counter() - start
        return outcomes

    def _together(self, tts, ready: list, tasks, outcomes, streams: int) -> None:
        """The ready lines of one model: batched where its family decodes several streams."""
        if len(ready) == 1 or getattr(type(tts), "BATCHED", None) is None:
            for i, _ in ready:
                outcomes[i].update(self.run(tasks[i]))
            return
        heard = [[] for _ in ready]
        try:
            made = tts.synthesize_many([request for _, request in ready], max_streams=streams,
                                       around=lambda k: warnings_into(heard[k]))
        except Exception:     # it names no line: each one alone says whose the error is
            for i, _ in ready:
                outcomes[i].update(self.run(tasks[i]))
            return
        for k, ((i, _), (audio, sr)) in enumerate(zip(ready, made)):
            with failure(outcomes[i]):
                encoded(outcomes[i], tasks[i], audio, sr)
            outcomes[i]["warnings"] = distinct(outcomes[i]["warnings"] + heard[k])

    def _load(self, task: dict, outcome: dict):
        """The line's TTS object, or None with the outcome's error."""
        try:
            return self._model(task["model"], task["codec"])
        except TRANSIENT as e:
            outcome.update(error=f"{type(e).__name__}: {e}", retry=True)
        except MossTTSError as e:
            outcome.update(error=str(e), retry=False, scope="model")
        except Exception as e:          # a file that breaks the loader breaks it every time
            outcome.update(error=f"{type(e).__name__}: {e}", retry=False, scope="model")
        return None

    def _words(self, tts, task: dict) -> dict:
        """The line's synthesize() keywords: its knobs for its family, and its voice (its text
        within the family's bound first, as on every surface)."""
        from ..knobs import bounded_text

        bounded_text(type(tts), task["text"], "manifest")
        words = synthesis_options(task["options"], type(tts))
        return words | self._voices(tts, task, words)

    def _model(self, model: str, codec: str):
        key = (model, codec)
        if key not in self.models:
            from ..models.registry import family_of_model   # the GGUF's kind, as `tts` reads it

            self.models[key] = family_of_model(model).tts_class().load(
                model, codec=codec, backend=self.backend, threads=self.threads)
        return self.models[key]

    def _voices(self, tts, task: dict, words: dict) -> dict:
        """The line's voice keywords: `reference` where the family clones a voice (a `voice`
        or `reference` column to one that does not is the line's error), its speakers read
        (stored voices, speech files) where it gives them."""
        from ..audio import REFERENCE_MAX_SECONDS, read_audio
        from ..models.registry import family
        from ..speakers import speakers_argument

        row = family(type(tts).FAMILY)
        out = {}
        if row.takes_reference:
            out["reference"] = self._voice(tts, task)
        else:
            for column in ("voice", "reference"):
                if task.get(column):
                    per_speaker = "; give each speaker's in the speakers column" \
                        if "speakers" in row.keywords else ""
                    raise InputError(f"{column} is not a {row.name} option{per_speaker}")
        if words.get("speakers") is not None:
            out["speakers"] = speakers_argument(
                words["speakers"], voice=lambda name: tts.voice(name, root=task["voices_dir"]),
                speech=lambda path: read_audio(path, max_seconds=REFERENCE_MAX_SECONDS,
                                               name=f"speakers {path}"))
        return out

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
                    *read_audio(key[2], max_seconds=REFERENCE_MAX_SECONDS,
                                name=f"reference {key[2]}"))
        return self.voices[key]

    def close(self) -> None:
        for tts in self.models.values():
            tts.close()
        self.models.clear()
        self.voices.clear()


def new_outcome(task: dict) -> dict:
    return {"id": task["id"], "status": "failed", "audio": None, "duration": None,
            "warnings": [], "seconds": None}


def encoded(outcome: dict, task: dict, audio, sr: int) -> None:
    """A made line's outcome: its audio as the bytes of its output file."""
    fmt = container_of(task["id"] + task["suffix"], DEFAULT_SAMPLE_FORMAT)
    outcome.update(status="ok", duration=len(audio) / sr,
                   audio=encode_file(audio, sr, fmt, DEFAULT_SAMPLE_FORMAT))


@contextlib.contextmanager
def failure(outcome: dict):
    """A line's error, in the block, as its outcome: whether another try may pass."""
    try:
        yield
    except TRANSIENT as e:          # memory or I/O that another try may find free
        outcome.update(error=f"{type(e).__name__}: {e}", retry=True)
    except MossTTSError as e:       # the line's input is wrong: another try won't help
        outcome.update(error=str(e), retry=False)
    except Exception as e:          # a deterministic failure on this input: the same again
        outcome.update(error=f"{type(e).__name__}: {e}", retry=False)


def synthesis_options(options: dict, tts_class) -> dict:
    """A line's knobs → synthesize() keywords for its model's family (knobs.synthesis_keywords:
    the family's options over its defaults, its own bounds; another family's knob is this
    line's error, naming its column)."""
    from ..knobs import check_required, synthesis_keywords
    from ..models.registry import family

    row = family(tts_class.FAMILY)
    words = synthesis_keywords(row, options, "manifest")
    check_required(row, words, "manifest")
    return words


class _Collect(logging.Handler):
    def __init__(self, messages: list):
        super().__init__(logging.WARNING)
        self.messages = messages

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


@contextlib.contextmanager
def captured_warnings():
    """Collect what a line's synthesis warns (warnings.warn, or a moss_tts logger warning) as
    a list of distinct messages, in order, instead of printing it: the driver records them
    with the line's id and prints them once per line. The list is filled when the block ends,
    however it ends."""
    found: list[str] = []
    messages: list[str] = []
    log = logging.getLogger("moss_tts")
    handler, propagate = _Collect(found), log.propagate
    log.addHandler(handler)
    log.propagate = False
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                yield messages
            finally:
                messages.extend(distinct(found + [str(w.message) for w in caught]))
    finally:
        log.removeHandler(handler)
        log.propagate = propagate


@contextlib.contextmanager
def warnings_into(heard: list):
    """captured_warnings added to `heard`: one request's pulls in a batch (its last pull ends
    its stream with StopIteration, right after its frame budget's warning)."""
    messages = []
    try:
        with captured_warnings() as messages:
            yield
    finally:
        heard.extend(messages)


def distinct(messages: list[str]) -> list[str]:
    """Each message once, in order: at most MAX_WARNINGS of them, then a count of the rest."""
    once = list(dict.fromkeys(messages))
    if len(once) <= MAX_WARNINGS:
        return once
    return once[:MAX_WARNINGS] + [f"... and {len(once) - MAX_WARNINGS} more warnings"]
