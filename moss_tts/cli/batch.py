"""`python -m moss_tts batch`: its flags, the progress line and the closing summary; the work
itself is moss_tts/batch/ (manifest, ledger, driver, the local and Ray runners)."""

from __future__ import annotations

import sys
import time

from .common import add_backend_flag, auto_or

SHOWN_FAILURES = 5   # failed lines listed in the summary; results.jsonl has them all


class BatchProgress:
    """lines/s, audio seconds per wall second and an ETA on stderr; silent unless a TTY."""

    def __init__(self, quiet: bool):
        self.enabled = not quiet and sys.stderr.isatty()
        self.shown = False
        self.last = 0.0

    def __call__(self, done: int, total: int, audio: float, elapsed: float) -> None:
        now = time.monotonic()
        if not self.enabled or (now - self.last < 0.2 and done < total):
            return
        self.last = now
        rate = done / max(elapsed, 1e-9)
        eta = (total - done) / rate if rate > 0 else 0.0
        print(f"\rbatch: {done}/{total} lines, {rate:.2f} lines/s, "
              f"{audio / max(elapsed, 1e-9):.2f} audio s/s, ETA {_clock(eta)}   ", end="",
              file=sys.stderr, flush=True)
        self.shown = True

    def close(self) -> None:
        if self.shown:
            print(file=sys.stderr)


def _clock(seconds: float) -> str:
    m, s = divmod(int(seconds + 0.5), 60)
    return f"{m // 60}:{m % 60:02d}:{s:02d}" if m >= 60 else f"{m}:{s:02d}"


def _warn(bar: BatchProgress):
    """Print a line's warnings once, with its id (they are in results.jsonl too)."""
    def warn(line_id: str, messages: list[str]) -> None:
        if bar.shown:    # below the progress line, not over it
            print(file=sys.stderr)
            bar.shown = False
        for message in messages:
            print(f"batch: {line_id}: warning: {message}", file=sys.stderr)
    return warn


def _batch(args) -> int:
    from ..batch.driver import run_batch
    from ..lifetime import terminate_as_interrupt

    bar = BatchProgress(args.quiet)
    # `kill` stops a run as Ctrl-C does: workers stopped, nothing half-written, one line
    with terminate_as_interrupt():
        try:
            summary = run_batch(args.manifest, args.out, model=args.model, codec=args.codec,
                                workers=args.workers, threads=args.threads, fmt=args.format,
                                retries=args.retries, ray=args.ray, streams=args.streams,
                                backend=args.backend, progress=bar,
                                warn=None if args.quiet else _warn(bar))
        finally:
            bar.close()
    if not args.quiet or summary.failed:
        print(f"batch: {summary.total} lines: {summary.made} made, {summary.skipped} already done, "
              f"{len(summary.failed)} failed; {summary.audio_seconds:.1f} s of audio in {args.out}",
              file=sys.stderr)
    for line_id, error in summary.failed[:SHOWN_FAILURES]:
        print(f"  failed {line_id}: {error}", file=sys.stderr)
    if len(summary.failed) > SHOWN_FAILURES:
        print(f"  ... {len(summary.failed) - SHOWN_FAILURES} more in {args.out}/results.jsonl",
              file=sys.stderr)
    return 1 if summary.failed else 0


def commands() -> dict[str, str]:
    return {"batch": "synthesize a JSONL/CSV manifest into a directory, resumably"}


def add_flags(p, command: str, common) -> None:
    from ..batch.ray_runner import CONNECT_TIMEOUT_S
    from ..models.batching import MAX_STREAMS
    from ..models.registry import DEFAULT, FAMILIES

    batched = [f.short for f in FAMILIES if f.batched]
    takers = "a model of any family" if len(batched) == len(FAMILIES) else \
        f"{', '.join(batched)} models only"

    p.add_argument("manifest", help=".jsonl or .csv: id, text, optional voice, reference, seed, "
                   "model and sampling options per line")
    p.add_argument("--out", "-o", required=True, help="output directory (<id>.wav + results.jsonl)")
    p.add_argument("--model", default=DEFAULT.default_model,
                   help="default model GGUF or repo id for "
                   "lines without `model`")
    p.add_argument("--codec", default=None, help="codec GGUF or repo id (default: the "
                   "model's family's, as `tts --help` lists)")
    p.add_argument("--workers", type=int, default=None, help="worker processes (default 1), or "
                   "Ray actors (default: cluster CPUs / threads)")
    p.add_argument("--threads", type=int, default=None, help="ggml threads per worker (default: "
                   "cores / workers; 1 per Ray actor)")
    p.add_argument("--streams", type=auto_or(int), default=1, metavar="N|auto",
                   help="lines each worker decodes together in one batched model, one row per "
                   f"line in each step (each line's audio is what it is alone), with {takers}; "
                   f"default 1; auto: {MAX_STREAMS} where every model the lines use has a "
                   "batched decoder, else 1 (serve --max-streams auto, for the run)")
    add_backend_flag(p, who=" each worker opens",
                     rpc="one worker: an RPC server serves one client at a time")
    p.add_argument("--format", choices=["wav", "flac"], default="wav", help="audio file format")
    p.add_argument("--retries", type=int, default=2, help="extra attempts for a line that fails "
                   "in a way another try may not repeat (out of memory, I/O, a dead worker); a "
                   "line whose input fails is never retried; default 2")
    p.add_argument("--ray", metavar="auto|local|ADDRESS", default=None,
                   help="run on Ray actors: auto = the running cluster, local = a private one "
                   "on this machine, or a cluster address (one that does not answer within "
                   f"{CONNECT_TIMEOUT_S:g} s is an error)")
    p.add_argument("--quiet", action="store_true", help="no progress or summary on stderr")
    p.set_defaults(func=_batch)

