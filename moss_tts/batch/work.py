"""What one batch worker does (a local process or a Ray actor): keep the models it has loaded,
keyed by path, and turn one line into encoded audio bytes or an error (LineRunner), or several
lines at once, fed into one running batch as places free (LineFeed).

The worker writes nothing: the bytes go back to the driver, which owns the output directory and
the results file, so a worker killed at any moment leaves no file behind.
"""

from __future__ import annotations

import contextlib
import logging
import time
import warnings
from collections import deque
from collections.abc import Iterator

import numpy as np

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
                    audio, sr = tts.synthesize(task["text"], **self._words(tts, task))
                    encoded(outcome, task, audio, sr)
            outcome["warnings"] = messages
        outcome["seconds"] = time.perf_counter() - start
        return outcome

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
        """The line's synthesize() keywords: its knobs for its family, its seed and its voice
        (its text within the family's bound first, as on every surface)."""
        from ..knobs import bounded_text

        bounded_text(type(tts), task["text"], "manifest")
        words = synthesis_options(task["options"], type(tts))
        return words | self._voices(tts, task, words) | {"seed": task["seed"]}

    def _model(self, model: str, codec: str):
        key = (model, codec)
        if key not in self.models:
            from ..models.registry import family_of_model   # the GGUF's kind, as `tts` reads it

            row = family_of_model(model)
            # the run's codec is the codec families'; one with its own VAE takes none
            self.models[key] = row.tts_class().load(
                model, codec=codec if row.default_codec else None, backend=self.backend,
                threads=self.threads)
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


class InFlight:
    """A line a LineFeed decodes: its task and outcome, its model, its audio stream and the
    chunks pulled from it, what its pulls warned, and when it was added."""

    def __init__(self, task: dict):
        self.task, self.outcome = task, new_outcome(task)
        self.tts = self.stream = None
        self.chunks: list = []
        self.heard: list[str] = []
        self.start = time.perf_counter()


class LineFeed:
    """A worker's lines in flight, up to `streams` of them decoded together: each model's in one
    batch kept running (its `decoding_together`, as the server's worker keeps one), a line
    joining it when added and leaving when its audio ends, so the next line takes the place at
    once and a long line holds only its own. `add` a line while `room`, `advance` to pull one
    chunk of each in turn (the lines that ended come back, in the order they ended); `run`
    does both for a list. Each line's outcome is the one `LineRunner.run` makes for it alone:
    a line whose model, knobs or voice fail never joins, and if a pull fails (naming no line:
    a step advances every line of its batch), each line of that batch runs alone, so only the
    bad one fails. With `streams` 1, or a family that decodes one stream at a time, `add` runs
    the line through."""

    def __init__(self, runner: LineRunner, streams: int):
        self.runner, self.streams = runner, streams
        self.flying: list[InFlight] = []          # in the order they joined
        self.batches: dict[int, contextlib.ExitStack] = {}   # id(tts) → its open batch
        self.ended: list[dict] = []               # outcomes not yet handed back

    @property
    def room(self) -> int:
        """Places free for more lines."""
        return self.streams - len(self.flying)

    def run(self, tasks: list[dict]) -> Iterator[dict]:
        """Every line of `tasks` → its outcome as it ends, the next line added as soon as a
        place frees (a Ray actor's chunk)."""
        waiting = deque(tasks)
        try:
            while waiting or self.flying:
                while waiting and self.room > 0:
                    self.add(waiting.popleft())
                yield from self.advance()
        finally:        # a chunk given up (its generator closed): its lines leave the batch
            self.drop()

    def add(self, task: dict) -> None:
        """Start a line: it joins its model's batch (its stream made now, to be pulled from the
        next `advance`), or it is made or fails at once."""
        if self.streams < 2:
            self.ended.append(self.runner.run(task))
            return
        line = InFlight(task)
        line.tts = self.runner._load(task, line.outcome)
        if line.tts is None:                            # its model did not load
            self.ended.append(self._end(line))
        elif type(line.tts).BATCHED is None:            # its family decodes one stream
            self.ended.append(self.runner.run(task))
        else:
            self._join(line)

    def _join(self, line: InFlight) -> None:
        """The line's stream, from its model's batch; a line whose knobs, voice or arguments
        fail ends here, without joining."""
        with captured_warnings() as messages, failure(line.outcome):
            words = line.tts.whole_keywords(self.runner._words(line.tts, line.task))
            self._batch(line.tts)
            line.stream = line.tts.stream(line.task["text"], **words)
        line.outcome["warnings"] = messages
        if line.stream is None:
            self.ended.append(self._end(line))
        else:
            self.flying.append(line)

    def advance(self) -> list[dict]:
        """One chunk of each line in flight, in turn → the outcomes of the lines that ended
        since the last call (those `add` ended first)."""
        for line in list(self.flying):
            if line not in self.flying:      # its batch failed this round: it ran alone
                continue
            try:
                with warnings_into(line.heard):
                    line.chunks.append(next(line.stream))
            except StopIteration:
                self.flying.remove(line)
                with failure(line.outcome):
                    encoded(line.outcome, line.task, np.concatenate(line.chunks),
                            line.tts.sample_rate)
                line.outcome["warnings"] = distinct(line.outcome["warnings"] + line.heard)
                self.ended.append(self._end(line))
            except Exception:     # it names no line: each one alone says whose the error is
                self._alone(line.tts)
        ended, self.ended = self.ended, []
        return ended

    def _batch(self, tts) -> None:
        """The model's batch, opened with the first line that joins it, kept open for the next
        ones (its shared state reused)."""
        if id(tts) not in self.batches:
            stack = contextlib.ExitStack()
            stack.enter_context(tts.decoding_together(self.streams))
            self.batches[id(tts)] = stack

    def _alone(self, tts) -> None:
        """A pull from `tts`'s batch failed: the batch ends, and each of its lines runs alone
        (its audio alone equals its audio in a batch)."""
        lines = [line for line in self.flying if line.tts is tts]
        for line in lines:
            self.flying.remove(line)
            line.stream.close()
        self.batches.pop(id(tts)).close()
        self.ended.extend(self.runner.run(line.task) for line in lines)

    def _end(self, line: InFlight) -> dict:
        line.outcome["seconds"] = time.perf_counter() - line.start
        return line.outcome

    def drop(self) -> None:
        """Forget the lines in flight (their streams closed, their places freed) and the
        outcomes not handed back; the batches stay open."""
        for line in self.flying:
            line.stream.close()
        self.flying.clear()
        self.ended.clear()

    def close(self) -> None:
        self.drop()
        for stack in self.batches.values():
            stack.close()
        self.batches.clear()


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
