"""The batch driver: reads the manifest, skips what the results file says is done, hands lines
to a runner (local processes or Ray actors), and alone writes the audio files and the results,
retrying failed lines up to a limit.
"""

from __future__ import annotations

import os
import time
from collections import deque
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from ..errors import InputError, MossTTSError
from ..fileio import atomic_output
from ..hub import resolve_gguf
from ..voices import voices_dir
from .ledger import Ledger, file_sha256, line_key
from .manifest import Line, read_manifest

FORMATS = ("wav", "flac")


@dataclass
class Summary:
    total: int = 0
    skipped: int = 0
    made: int = 0
    failed: list = field(default_factory=list)   # (id, error) of lines that finally failed
    audio_seconds: float = 0.0
    replaced_workers: int = 0


class Job:
    """The driver's side of a run: tasks waiting, attempts made, results written."""

    def __init__(self, ledger: Ledger, *, suffix: str, retries: int, progress=None, warn=None,
                 default_model: tuple[str, str] | None = None):
        self.ledger, self.suffix, self.retries = ledger, suffix, retries
        self.pending: deque[dict] = deque()
        self.rejected: list[tuple[dict, str]] = []   # bad input, recorded once work has begun
        self.summary = Summary()
        self.progress, self.warn = progress, warn
        # (path, what to call it) of --model, whose failure to load stops the run
        self.default_model = default_model
        self.to_run = 0
        self.start = time.monotonic()

    def add(self, line: Line, *, model: str | None, model_sha256: str | None,
            model_error: str | None, codec: str, codec_sha256: str) -> None:
        self.summary.total += 1
        key = line_key(line, model_sha256=model_sha256 or "", codec_sha256=codec_sha256,
                       suffix=self.suffix)
        # voices_dir as the driver sees it: a Ray actor runs elsewhere, with its own env (the
        # manifest made `reference` absolute)
        task = {"id": line.id, "line": line.number, "key": key, "text": line.text,
                "seed": line.seed, "voice": line.voice, "voices_dir": str(voices_dir()),
                "reference": line.reference,
                "options": line.options, "model": model, "model_sha256": model_sha256,
                "codec": codec, "codec_sha256": codec_sha256, "suffix": self.suffix, "attempt": 1}
        if self.ledger.done(line.id, key):
            self.summary.skipped += 1
            return
        self.to_run += 1
        error = line.error or model_error
        if error:      # known bad before any work: reported, never retried
            self.rejected.append((task, error))
        else:
            self.pending.append(task)

    def take(self, n: int = 1) -> list[dict]:
        return [self.pending.popleft() for _ in range(min(n, len(self.pending)))]

    def record_rejected(self) -> None:
        """Record the lines refused on their input. Called once the model and codec loaded
        (or at the end): a run stopped by --model or --codec writes nothing."""
        for task, error in self.rejected:
            self._record(task, {"status": "failed", "error": error, "seconds": 0.0})
        self.rejected.clear()

    def finish(self, task: dict, outcome: dict) -> None:
        """A worker's outcome: write the audio, then the record (so a record never points at a
        missing file); a retryable failure goes back in the queue while attempts remain."""
        if outcome.get("scope") == "model":
            self._model_failed(task, outcome["error"])
        else:
            self.record_rejected()
        if outcome["status"] == "ok":
            self._write(task["id"], outcome["audio"])
            self.summary.audio_seconds += outcome["duration"]
        elif outcome.get("retry") and task["attempt"] <= self.retries:
            self.pending.append(dict(task, attempt=task["attempt"] + 1))
            return
        self._record(task, outcome)

    def _model_failed(self, task: dict, error: str) -> None:
        """The model and codec do not load together: every line of that model would fail the
        same way, so --model's failure stops the run, and a line's own model fails its lines
        at once, without loading it again."""
        if self.default_model and task["model"] == self.default_model[0]:
            raise InputError(f"{self.default_model[1]}: {error}")
        same = [t for t in self.pending if t["model"] == task["model"]]
        self.pending = deque(t for t in self.pending if t["model"] != task["model"])
        for other in same:
            self._record(other, {"status": "failed", "error": error, "seconds": 0.0})

    def _write(self, line_id: str, audio: bytes) -> None:
        """<id>.<format> in one rename; then the id's file of another format from an earlier
        run goes, so the directory holds one file per id (never before the new one is there)."""
        path = self.ledger.dir / f"{line_id}{self.suffix}"
        try:
            with atomic_output(path) as tmp:
                tmp.write_bytes(audio)
            for fmt in FORMATS:
                if f".{fmt}" != self.suffix:
                    (self.ledger.dir / f"{line_id}.{fmt}").unlink(missing_ok=True)
        except OSError as e:    # the output disk, not the line: stop; a rerun resumes
            raise InputError(f"{path}: cannot write ({e.strerror or e}); free space or "
                             "fix permissions, then rerun to resume") from None

    def lost(self, task: dict, why: str) -> None:
        """The worker running `task` died (a crash, a kill, its backend lost) or its result was
        lost: a retryable failure of the line, said at once (its record keeps only the last)."""
        if self.warn and task["attempt"] <= self.retries:
            self.warn(task["id"], [f"{why}: the line is tried again"])
        self.finish(task, {"status": "failed", "error": why, "retry": True, "seconds": None})

    def _record(self, task: dict, outcome: dict) -> None:
        ok = outcome["status"] == "ok"
        self.ledger.append({
            "id": task["id"], "line": task["line"], "status": outcome["status"], "key": task["key"],
            "output": f"{task['id']}{self.suffix}" if ok else None,
            "duration": outcome.get("duration"), "seed": task["seed"], "model": task["model"],
            "model_sha256": task["model_sha256"], "codec_sha256": task["codec_sha256"],
            "seconds": outcome.get("seconds"), "attempts": task["attempt"],
            "error": outcome.get("error"), "warnings": outcome.get("warnings") or [],
            "finished": datetime.now(timezone.utc).isoformat(timespec="seconds")})
        if outcome.get("warnings") and self.warn:
            self.warn(task["id"], outcome["warnings"])
        if ok:
            self.summary.made += 1
        else:
            self.summary.failed.append((task["id"], outcome.get("error")))
        if self.progress:
            done = self.summary.made + len(self.summary.failed)
            self.progress(done, self.to_run, self.summary.audio_seconds,
                          time.monotonic() - self.start)


def usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:      # not Linux
        return os.cpu_count() or 1


def run_batch(manifest, out_dir, *, model: str, codec: str | None = None,
              workers: int | None = None,
              threads: int | None = None, fmt: str = "wav", retries: int = 2,
              ray: str | None = None, chunk: int = 4, streams: int | None = 1,
              backend: str = "cpu",
              progress=None, warn=None) -> Summary:
    """Synthesize every line of `manifest` into `out_dir`/<id>.<fmt>, resuming a previous run.

    Local worker processes by default (`workers`, default 1, each with cores // workers
    threads); `ray` = "auto", "local" or a cluster address runs Ray actors instead. Each
    worker decodes up to `streams` lines together in one running batch (families with a
    batched decoder, `decoding_together`), the next line joining as soon as one ends, each
    line's audio as it is alone; None ("auto"): as many as pay off for the lines' models
    (check_streams). Each worker opens
    the backend named `backend` itself (`cpu`, `cuda`, `rpc://HOST:PORT`).
    `warn(id, messages)` hears what a line's synthesis warned (results.jsonl keeps it too).
    What would fail every line (--model, --codec, the cluster) stops the run before any line
    is recorded."""
    if fmt not in FORMATS:
        raise InputError(f"format {fmt!r}: use one of {', '.join(FORMATS)}")
    if retries < 0 or any(n is not None and n < 1 for n in (workers, threads, streams)):
        raise InputError("--retries must be ≥ 0, --workers, --threads and --streams ≥ 1")
    check_backend(backend, workers, ray)
    lines = read_manifest(manifest)
    models = _ModelFiles(model)
    if codec is None:       # the default model's family's codec, as `tts` and `serve` choose
        from ..models.registry import family_of_model
        codec = family_of_model(models.default_path()).default_codec
    try:                    # none: the family decodes with its own VAE (MOSS-SoundEffect v2.0)
        codec_path = str(Path(resolve_gguf(codec, "codec")).resolve()) if codec else None
    except MossTTSError as e:
        raise InputError(f"--codec: {e}") from None
    default_path = models.default_path() if any(not x.model for x in lines) else None
    streams = check_streams(streams, {models.get(x.model)[0] for x in lines} - {None})
    if ray:
        from .ray_runner import check_address
        check_address(ray)
    with Ledger(out_dir) as ledger:
        job = Job(ledger, suffix=f".{fmt}", retries=retries, progress=progress, warn=warn,
                  default_model=(default_path, f"--model {model}"
                                 + (f" with --codec {codec}" if codec else "")))
        codec_sha = file_sha256(codec_path) if codec_path else ""
        for line in lines:
            model_path, model_sha, model_error = models.get(line.model)
            job.add(line, model=model_path, model_sha256=model_sha, model_error=model_error,
                    codec=codec_path, codec_sha256=codec_sha)
        if job.pending:
            if ray:
                from .ray_runner import run_ray
                run_ray(job, ray, workers=workers, threads=threads or 1, chunk=chunk,
                        streams=streams, backend=backend)
            else:
                from .local import run_local
                n = min(workers or 1, -(-len(job.pending) // streams))
                run_local(job, n, threads or max(1, usable_cores() // n), streams, backend)
        job.record_rejected()
    return job.summary


def check_backend(backend: str, workers: int | None, ray: str | None) -> None:
    """The workers' backend, checked here so a bad name is one error before any line runs. An
    RPC server serves one client at a time: a second worker on it would wait for ever."""
    from ..ggml.backend import check_name
    from ..ggml.rpc import is_rpc_name

    check_name(backend, flag="--backend")
    if is_rpc_name(backend) and (ray or (workers or 1) > 1):
        raise InputError(f"--backend {backend}: an RPC server serves one client at a time; "
                         "run one local worker on it (--workers 1, no --ray)")


def check_streams(streams: int | None, models) -> int:
    """--streams as the workers take it. N > 1 needs every model the lines use to decode
    several streams in one step (Family.batched): one error before any line runs, naming the
    families that do. None ("auto", as serve's --max-streams): models/batching.py
    stream_places for the run, more than 1 where every model has a batched decoder. A model
    that does not load is its lines' own error, later."""
    if streams == 1:
        return streams
    from ..models.batching import stream_places
    from ..models.registry import FAMILIES, family_of_model

    lone = []        # (path, row) of each model that decodes one stream at a time
    for path in sorted(models):
        try:
            row = family_of_model(path)
        except (MossTTSError, OSError):
            continue
        if not row.batched:
            lone.append((path, row))
    if streams is None:
        return stream_places(None, batched=not lone)
    if lone:
        path, row = lone[0]
        takers = " or ".join(f.name for f in FAMILIES if f.batched)
        raise InputError(f"--streams {streams}: {row.name} ({path}) decodes one line at a "
                         f"time; --streams > 1 takes {takers} models only (run more "
                         "lines at once with --workers)")
    return streams


class _ModelFiles:
    """A line's `model` (or the default) → (GGUF path, sha256, error), resolved once per name."""

    def __init__(self, default: str):
        self.default = default
        self.known: dict[str, tuple] = {}

    def default_path(self) -> str:
        """--model's GGUF path; one that cannot be found stops the run (every line without a
        `model` of its own would fail on it)."""
        try:
            return str(Path(resolve_gguf(self.default, "model")).resolve())
        except (MossTTSError, OSError) as e:
            raise InputError(f"--model: {e}") from None

    def get(self, spec: str | None) -> tuple:
        spec = spec or self.default
        if spec not in self.known:
            try:
                path = str(Path(resolve_gguf(spec, "model")).resolve())
                self.known[spec] = (path, file_sha256(path), None)
            except (MossTTSError, OSError) as e:
                self.known[spec] = (None, None, f"model {spec!r}: {e}")
        return self.known[spec]
