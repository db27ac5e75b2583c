"""Several streams in one decode step (issue 25, design §3): a scheduler shared by every family
that decodes streams together. A family says how (a `BatchFamily`: its shared state, a
stream's own, how a stream's prompt is appended, and one step for all the active streams), as
vLLM's `SchedulerInterface` states what every scheduler offers; the jobs and their checks are
the base's, and the `BatchDecoder` here decides who runs: streams join between steps (their
prompt appended in chunks of `prefill_rows`, so a long prompt does not stall the others for
its whole length), each step carries one row per active stream, and a stream that ends leaves
at once, its cache slots free for the next. Each stream samples with its own generator,
options and budget, so what it makes is what it makes decoded alone."""

from __future__ import annotations

import contextlib
import inspect
import numbers
from collections import deque
from collections.abc import Iterator

import numpy as np

from ..errors import InputError, whole_number
from ..ggml.backend import NativeResource
from ..nn.session import PREFILL_ROWS as SESSION_PREFILL_ROWS
from ..sampling import check_options, check_seed

# Streams per batch unless asked otherwise: on two cores 4 streams make 2.8-2.9× one stream's
# audio per second in Nano f32, 2.1-2.3× in q8_0 (bench/streams.py, docs/performance.md)
MAX_STREAMS = 4
# Prompt rows appended per step while others decode: the chunks a one-stream session appends a
# prompt in (nn/session.py), so a stream's cache holds exactly what it holds alone, f16 K/V
# included (other chunk boundaries move an f16 cache's attention by its rounding,
# tests/models/test_delay_decode.py). A prompt this long or shorter (a sentence's, a voice
# clone's) joins in one step; a longer one holds the others back one chunk per step, never its
# whole length. Smaller chunks would smooth the others' frames but hold the newcomer back one
# step of theirs per chunk: with 32-row chunks a Nano request joining 3 others heard its first
# audio 2.7× later than on an idle server, with its 177-row prompt whole 1.6×
# (bench/streams.py, docs/performance.md).
PREFILL_ROWS = SESSION_PREFILL_ROWS
# Shared states are sized in steps of this many rows per stream, so the next batch can usually
# reuse the last one (caches allocated and graphs built), and each stream's region of the cache
# is a whole number of such steps, so a stream of a like budget fits where another one left
STATE_ROWS_STEP = 256


def room(need: int) -> int:
    """Cache slots of the region a job of `need` rows takes."""
    return -(-need // STATE_ROWS_STEP) * STATE_ROWS_STEP


class StreamJob:
    """One stream in a batch (made by `BatchFamily.job`): the family's per-stream `work`
    (prompt, sampler, what its next step needs), its prompt's length in rows, the most cache
    rows it may take, the items (frames or rows) made so far, and what the family's `decode`
    made of them (audio), where it decodes them."""

    __slots__ = ("work", "prompt_rows", "need", "items", "decoded", "done", "seq", "filled")

    def __init__(self, work, prompt_rows: int, need: int):
        self.work, self.prompt_rows, self.need = work, prompt_rows, need
        self.items: list = []
        self.decoded: list = []
        self.done = False
        self.seq = None          # the family's sequence id(s) while the job holds slots
        self.filled = 0          # prompt rows appended so far

    @property
    def joined(self) -> bool:
        return self.filled == self.prompt_rows


class BatchFamily:
    """How one family's model decodes several streams in one step; subclassed per family
    (NanoBatch, DelayBatch, ...), which states its shared state (`make_state`, `sequences`,
    where the model's own differ), a stream's own (`start`), how a stream's prompt is appended
    (`prefill`) and one step for every active stream (`advance`). The BatchDecoder calls these
    from one thread."""

    BUDGET_KEYWORD = "max_frames"     # the `start` keyword of a job's budget (its most items)

    def __init__(self, model):
        self.model = model

    def job(self, rows, **keywords) -> StreamJob:
        """A stream of prompt rows → a job whose items are those the family's one-stream
        source makes from the same keywords (`DelayModel.iter_rows(rows, **keywords)`, ...;
        `start` names them, with that source's defaults). Its options (of its default's class,
        `sampling.check_options`), seed and budget are checked here, so a bad job fails when
        it is made, on its own; its rows when its prompt joins (`prefill`: a bad prompt fails
        its own job only), or here where `start` reads them. The shared state's cache takes
        its prompt and its whole budget."""
        call = inspect.signature(self.start).bind(np.asarray(rows), **keywords)
        call.apply_defaults()
        kw = call.arguments
        kw["options"] = check_options(kw["options"],
                                      type(call.signature.parameters["options"].default))
        kw["seed"] = check_seed(kw["seed"])
        name = self.BUDGET_KEYWORD
        if isinstance(kw[name], numbers.Real) and kw[name] < 1:   # as the samplers word it
            raise InputError(f"{name} must be at least 1, got {kw[name]}")
        budget = kw[name] = whole_number(kw[name], name, 1)
        length = len(kw["rows"]) if kw["rows"].ndim else 0   # a shapeless prompt fails on joining
        return StreamJob(self.start(**kw), length, length + budget)

    def start(self, rows: np.ndarray, *, options, seed: int | None, **keywords):
        """A stream's own part of its job (`StreamJob.work`: its prompt rows, its sampler,
        what its next step starts from), from the job's checked keywords."""
        raise NotImplementedError

    def make_state(self, rows: int, streams: int) -> NativeResource:
        """A shared state (caches, graphs) of `rows` rows in all for up to `streams` streams,
        with `.capacity` (rows): the model's own generation state made for streams."""
        return self.model.make_state(rows, streams=streams)

    def sequences(self, state):
        """The state's SharedDecodeSession whose sequence ids the jobs hold: its backbone's
        unless the family says else."""
        return state.backbone

    def open(self, state, job: StreamJob) -> None:
        """Start the job's sequence in the state, room for its `need` rows: set `job.seq`."""
        job.seq = self.sequences(state).open(job.need, slots=room(job.need))

    def prefill(self, state, job: StreamJob, start: int, stop: int) -> None:
        """Append rows [start, stop) of the job's prompt; the last call (stop ==
        job.prompt_rows) leaves in `job.work` what its first step needs."""
        raise NotImplementedError

    def advance(self, state, jobs: list[StreamJob]) -> list[bool]:
        """One step for every job, in one graph per stage: append what each made to its
        `items`; → for each job whether it goes on."""
        raise NotImplementedError

    def decode(self, jobs: list[StreamJob]) -> None:
        """After a step, the family's own decode of what the jobs made in it, appended to
        their `decoded` (Nano: each frame's audio, one codec push for all the streams); by
        default none: each stream decodes its items itself."""

    def release(self, state, job: StreamJob) -> None:
        """Free the job's sequence (`job.seq`) and its slots."""
        self.sequences(state).release(job.seq)

    def close(self) -> None:
        """Free what the family holds beside the shared state (its BatchDecoder closes)."""

    def report_end(self, job: StreamJob) -> None:
        """Called from the pull that finds the job's items all read: warnings of its end (a
        stall) belong there, to its own request (a step runs in any stream's pull)."""


class HiddenWork:
    """A stream's own part of a job in a HiddenStateFamily: its prompt rows, its sampler (what
    it draws with, and says when it ends) and the backbone hidden its next frame starts from."""

    __slots__ = ("rows", "sampler", "h")

    def __init__(self, rows: np.ndarray, sampler=None):
        self.rows, self.sampler, self.h = rows, sampler, None


class HiddenStateFamily(BatchFamily):
    """A family whose stream's next frame starts from the backbone's hidden state of its last
    row (`job.work.h`, left by `prefill` and by each step): Nano, Local, Local v1.5, Realtime.
    Its jobs' work is a HiddenWork. A step draws one item for every stream from the hiddens
    (`draw`), records each (`accept`), then feeds those of the streams that go on through one
    backbone step (`step_hidden`), which gives their next hiddens."""

    def draw(self, state, jobs: list[StreamJob], hidden: np.ndarray) -> list:
        """Each job's next item (frame or row) from its hidden (`hidden` [jobs, H]), one graph
        per position over all of them; None where the model ended a stream without one."""
        raise NotImplementedError

    def accept(self, job: StreamJob, item) -> bool:
        """Record the item a job drew; → whether the job goes on (its sampler's say: the
        model's end, a stall, its budget)."""
        if item is None:
            return False
        job.items.append(item)
        return job.work.sampler.accept(item)

    def step_hidden(self, state, jobs: list[StreamJob]) -> list[np.ndarray]:
        """The item each job made last through the backbone, one step → each one's next hidden."""
        raise NotImplementedError

    def advance(self, state, jobs: list[StreamJob]) -> list[bool]:
        made = self.draw(state, jobs, np.stack([job.work.h for job in jobs]))
        going = [self.accept(job, item) for job, item in zip(jobs, made)]
        on = [job for job, go in zip(jobs, going) if go]
        if on:
            for job, h in zip(on, self.step_hidden(state, on)):
                job.work.h = h
        return going


class BatchDecoder(NativeResource):
    """Decodes the jobs of one family's model together, up to `max_streams` at a time, on one
    shared state (grown, when idle, for a job that does not fit).

    >>> with BatchDecoder(NanoBatch(tts.model)) as batch:                 # doctest: +SKIP
    ...     frames = batch.run([batch.family.job(rows, seed=1, max_frames=200), ...])
    """

    def __init__(self, family: BatchFamily, *, max_streams: int = MAX_STREAMS,
                 prefill_rows: int = PREFILL_ROWS):
        for name, value in (("max_streams", max_streams), ("prefill_rows", prefill_rows)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise InputError(f"{name} must be a whole number ≥ 1, got {value!r}")
        self.family, self.max_streams, self.prefill_rows = family, max_streams, prefill_rows
        self.state = None
        self.active: list[StreamJob] = []     # joined: stepped together
        self.joining: list[StreamJob] = []    # holding slots, prompt being appended
        self.queue: deque[StreamJob] = deque()
        self.steps = 0

    @property
    def pending(self) -> bool:
        """Whether any job is still queued, joining or decoding (more steps would make items)."""
        return bool(self.queue or self.joining or self.active)

    def submit(self, job: StreamJob) -> StreamJob:
        """Queue a job; it joins at the next step with a free place and room for it."""
        self.queue.append(job)
        return job

    def cancel(self, job: StreamJob) -> None:
        """Drop a job that is no longer wanted (its items so far stay readable)."""
        if job in self.queue:
            self.queue.remove(job)
            job.done = True
        elif job in self.active or job in self.joining:
            (self.active if job in self.active else self.joining).remove(job)
            self._finish(job)

    def step(self) -> None:
        """Admit queued jobs, append one chunk of a joining prompt (all of them when nobody
        decodes), then one step for every joined job."""
        self._admit()
        self._prefill()
        if not self.active:
            return
        jobs = self.active
        going = self.family.advance(self.state, jobs)
        self.family.decode(jobs)
        self.active = [job for job, on in zip(jobs, going) if on]
        for job, on in zip(jobs, going):
            if not on:
                self._finish(job)
        self.steps += 1

    def items(self, job: StreamJob) -> Iterator:
        """A job's items as they are made: pulling one runs steps, which advance every other
        job too (a family's frame source in a batch)."""
        self.submit(job)
        try:
            i = 0
            while True:
                while i == len(job.items) and not job.done:
                    self.step()
                if i == len(job.items):
                    self.family.report_end(job)
                    return
                yield job.items[i]
                i += 1
        finally:
            self.cancel(job)

    def run(self, jobs: list[StreamJob]) -> list[list]:
        """Every job to its end → each one's items."""
        for job in jobs:
            self.submit(job)
        while self.pending:
            self.step()
        for job in jobs:
            self.family.report_end(job)
        return [job.items for job in jobs]

    def _admit(self) -> None:
        while self.queue and len(self.active) + len(self.joining) < self.max_streams:
            job = self.queue[0]
            if self.state is None or \
                    not self.family.sequences(self.state).fits(job.need, slots=room(job.need)):
                if self.active or self.joining:
                    return        # it joins when enough of the running ones have left
                self._grow(job.need)
            self.queue.popleft()
            self.family.open(self.state, job)
            self.joining.append(job)

    def _prefill(self) -> None:
        """One chunk of the first joining prompt when others decode; every joining prompt
        whole, chunk after chunk, when none do (nobody waits for them)."""
        busy = bool(self.active)
        for job in list(self.joining):
            while not job.joined:
                stop = min(job.prompt_rows, job.filled + self.prefill_rows)
                try:
                    self.family.prefill(self.state, job, job.filled, stop)
                except BaseException:
                    self.cancel(job)    # a bad prompt fails this job alone, before any step
                    raise
                job.filled = stop
                if busy:
                    break
            if job.joined:
                self.joining.remove(job)
                self.active.append(job)
            if busy:
                return

    def _grow(self, need: int) -> None:
        """A new (empty) shared state with room for max_streams jobs of `need` rows."""
        if self.state is not None:
            self.state.close()
            self.state = None
        self.state = self.family.make_state(room(need) * self.max_streams, self.max_streams)

    def _finish(self, job: StreamJob) -> None:
        job.done = True
        if job.seq is not None:
            self.family.release(self.state, job)
            job.seq = None

    def close(self) -> None:
        if getattr(self, "state", None) is not None:
            self.state.close()
            self.state = None
        if getattr(self, "family", None) is not None:
            self.family.close()


def round_robin(streams: list, around=None) -> list[list]:
    """Every chunk of every stream, pulling one chunk from each in turn, so streams that share
    a batch advance together (a pull that needs a frame runs a step for all of them); all are
    closed at the end, or when one fails. `around(k)`: a context manager entered around each
    pull of stream k."""
    around = around or (lambda k: contextlib.nullcontext())
    chunks = [[] for _ in streams]
    live = list(range(len(streams)))
    try:
        while live:
            for k in list(live):
                try:
                    with around(k):
                        chunks[k].append(next(streams[k]))
                except StopIteration:
                    live.remove(k)
    finally:
        for stream in streams:
            stream.close()
    return chunks


def stream_places(given: int | None, batched: bool) -> int:
    """Streams a model decodes together: `given`, or for None ("auto": serve --max-streams,
    batch --streams) MAX_STREAMS where its family has a batched decoder and 1 where not: a
    batch of one costs 0-5 % more than the one-stream loop, and under load 4 streams make
    1.8-3.8x the audio of one (docs/performance.md, "Several streams")."""
    if given is not None:
        return given
    return MAX_STREAMS if batched else 1
