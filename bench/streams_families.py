"""The families bench/streams.py can time (issue 25): one `Family` entry each: its TTS class
(whose BATCHED says whether it decodes streams together), its real-dimension random checkpoint
per weight type, the prompt, and how its random model is kept from stopping early. Nano runs
with its codec; the Qwen3 families (Local, Local v1.5, Realtime; Delay once its BATCHED lands)
have no real-dimension codec here and run frames only. A family whose BATCHED is None is
reported "not batched yet"."""

from __future__ import annotations

import argparse
import importlib
import os
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from bench.nano import SENTENCE, make_checkpoint
from bench.nano import gguf_path as nano_gguf

ROOT = Path(__file__).resolve().parents[1]
FRAME_S = 0.080      # every family's codec makes one frame per 80 ms (12.5 Hz)
NEVER = -1e30        # a logit that no draw (top-k, top-p or greedy) can pick, yet finite


@dataclass(frozen=True)
class Family:
    """One family in the streams bench.

    `prepare(driver, type)` (driver side, once per type) writes what is missing: the checkpoint,
    its GGUF of that type and the codec GGUF; `load(type, threads, codec)` (in a worker) → the
    TTS object, with the codec when `codec` is True (first audio streams audio through the
    public API), its random model kept speaking. `stream_kwargs(seed, frames)`: the
    `tts.stream` keywords of one stream with a budget of `frames` frames. `frames(tts, seed,
    n)` and `job(tts, family, seed, n)` are the decode-only sources of the same stream (codec
    decode not in the figures): today's one-stream loop, and the job of the family's
    BatchFamily (`tts.BATCHED`); None where the family has none yet: the throughput rows then
    stream through `tts.stream` (codec in). `codec`: False where there is no real-dimension
    codec here: frames only, and first audio is measured frame-level (a job submitted → its
    first frame). `pending`: what the entry still lacks before it can run (None: complete)."""

    name: str
    tts: str                        # "module:Class" of its TTS class
    types: str                      # default --types: those docs/families.md converts to
    keeps_going: str                # how the random model is kept from stopping, for the report
    text: str = ""
    codec: bool = True
    prepare: Callable | None = None
    load: Callable | None = None
    weight_bytes: Callable | None = None        # type → the model's bytes (RAM check)
    stream_kwargs: Callable = lambda seed, frames: {"seed": seed}
    frames: Callable | None = None
    job: Callable | None = None
    pending: str | None = None

    def tts_class(self):
        module, name = self.tts.split(":")
        return getattr(importlib.import_module(module), name)

    def batched(self) -> bool:
        return self.tts_class().BATCHED is not None

    def blocked(self, source: str = "auto") -> str | None:
        """Why no row of this family can run now from `source` (--source), or None."""
        if not self.batched():
            return (f"not batched yet ({self.tts.split(':')[1]}.BATCHED is None): no streams "
                    "decode together, nothing to compare")
        if self.pending:
            return f"batched, but the bench entry is incomplete: {self.pending}"
        if source == "stream" and not self.codec:
            return ("--source stream needs a codec at real dimensions, which this family has "
                    "none of here: use --source frames (or auto)")
        return None


# --- MOSS-TTS-Nano: bench/nano.py's checkpoint (stop_bias −50: the model never stops) -----------
def _nano_prepare(driver, outtype: str) -> None:
    import json
    import sys

    from bench.codec48k import ensure_gguf as ensure_codec_gguf

    make_checkpoint(log=driver.say)
    if not nano_gguf(outtype).exists():      # bench/nano.py's converting worker, as its driver
        got = driver.run([sys.executable, "bench/nano.py", "--worker", "convert", "--type",
                          outtype], timing=False)
        driver.say(f"converted nano {outtype}: {json.dumps(got)}")
    ensure_codec_gguf("nano", "f32", log=driver.say)


def _nano_load(outtype: str, threads: int, codec: bool):
    from bench.codec48k import gguf_path as codec_path
    from moss_tts.models.nano_tts import NanoTTS

    return NanoTTS.load(nano_gguf(outtype), threads=threads,
                        codec=str(codec_path("nano", "f32")) if codec else None)


def _nano_rows(tts):
    return tts.plan(SENTENCE)[0][1]


def _nano_frames(tts, seed: int, n: int):
    return tts.iter_frames(_nano_rows(tts), seed=seed, max_frames=n)


def _nano_job(tts, family, seed: int, n: int):
    return family.job(_nano_rows(tts), seed=seed, max_frames=n)


NANO = Family(
    "nano", "moss_tts.models.nano_tts:NanoTTS", "f32,q8_0",
    "its checkpoint's stop_bias is −50 (bench/nano.py DIMS): the stop logit never wins",
    text=SENTENCE, prepare=_nano_prepare, load=_nano_load,
    weight_bytes=lambda t: nano_gguf(t).stat().st_size,
    stream_kwargs=lambda seed, frames: {"seed": seed, "max_frames": frames},
    frames=_nano_frames, job=_nano_job)

# --- the Qwen3 families: no codec at real dims here, so frames only ------------------------------
# Each reuses its own bench's random checkpoint (writer and cache), loads it as its TTS class
# (the tokenizer the writers embed plans the sentence) and keeps its random model speaking the
# way that bench does, in every worker (alone, batch, processes) alike. That tokenizer is the
# fixtures' 400-piece BPE: the sentence takes ~3× the ids Qwen's would (prompts of 135 rows for
# Local and v1.5; 237 rows + 52 text ids fed as it speaks for Realtime).
def _bench_data(sub: str) -> str:
    """A family bench's default --data (where its random-weight files are written once)."""
    return os.environ.get("MOSS_TTS_BENCH_DATA", str(ROOT / "bench" / "results" / sub))


def _with_tokenizer(write: Callable[[], Path], key: str, driver) -> None:
    """Write the checkpoint if missing; one cached from before its bench embedded a tokenizer
    ("{}") is written again: the TTS class needs one to load (the same weights: the pooled
    rows are seeded)."""
    from moss_tts.ggml import GGUFFile

    path = write()
    with GGUFFile(path) as f:
        stale = f.get(key) == "{}"
    if stale:
        driver.say(f"{path}: written without a tokenizer: writing it again")
        path.unlink()
        write()


def _patch_once(owner, name: str, wrap: Callable) -> None:
    """owner.name = wrap(the plain one), once per process however often a worker loads."""
    plain = getattr(owner, name)
    if not getattr(plain, "keeps_speaking", False):
        patched = wrap(plain)
        patched.keeps_speaking = True
        setattr(owner, name, patched)


def _local_path(outtype: str) -> Path:
    from bench import local

    return local.weights_file(argparse.Namespace(tiny=False, type=outtype,
                                                 data=_bench_data("local_data")))


def _local_prepare(driver, outtype: str) -> None:
    from moss_tts.models.local import TOKENIZER_KEY

    _with_tokenizer(lambda: _local_path(outtype), TOKENIZER_KEY, driver)


def _local_keep_speaking() -> None:
    """bench/local.py writes the gen slot over each row's text token: here the text channel
    never draws audio_end (its logit set far below the rest before it is chosen; the draw
    and its generator are otherwise the family's own), which ends a stream alone or batched."""
    from moss_tts.models import local

    def wrap(plain):
        def choose(logits, c, seen, cfg, opts, rng):
            if c == 0:
                logits = logits.copy()
                logits[cfg.audio_end_token_id] = NEVER
            return plain(logits, c, seen, cfg, opts, rng)
        return choose

    _patch_once(local, "choose", wrap)


def _local_load(outtype: str, threads: int, codec: bool):
    from moss_tts.models.local_tts import LocalTTS

    _local_keep_speaking()
    return LocalTTS.load(str(_local_path(outtype)), threads=threads)


def _sentence_rows(tts):
    return tts.plan(SENTENCE)


LOCAL = Family(
    "local", "moss_tts.models.local_tts:LocalTTS", "q6_K",
    "bench/local.py's checkpoint; its text channel never draws audio_end, where bench/local.py "
    "writes the gen slot over the text token",
    text=SENTENCE, codec=False, prepare=_local_prepare, load=_local_load,
    weight_bytes=lambda t: _local_path(t).stat().st_size,
    frames=lambda tts, seed, n: tts.model.iter_rows(_sentence_rows(tts), seed=seed,
                                                    max_new_frames=n),
    job=lambda tts, family, seed, n: family.job(_sentence_rows(tts), seed=seed,
                                                max_new_frames=n))


def _v15_path(outtype: str) -> Path:
    from bench import local_v15

    args = argparse.Namespace(tiny=False, data=_bench_data("local_v15_data"), embed_type="f32")
    return local_v15.model_path(args, outtype)


def _v15_prepare(driver, outtype: str) -> None:
    from moss_tts.models.local_v15 import TOKENIZER_KEY

    _with_tokenizer(lambda: _v15_path(outtype), TOKENIZER_KEY, driver)


def _v15_keep_speaking() -> None:
    """As bench/local_v15.py: the 2-way head is computed and sampled, then "continue" is
    taken whatever it said (`decide`, which the alone loop and the batch share)."""
    from moss_tts.models import local_v15

    def wrap(plain):
        def decide(logits, rng, opts):
            plain(logits, rng, opts)
            return local_v15.CONTINUE
        return decide

    _patch_once(local_v15, "decide", wrap)


def _v15_load(outtype: str, threads: int, codec: bool):
    from moss_tts.models.local_v15_tts import LocalV15TTS

    _v15_keep_speaking()
    return LocalV15TTS.load(str(_v15_path(outtype)), threads=threads)


LOCAL_V15 = Family(
    "local_v15", "moss_tts.models.local_v15_tts:LocalV15TTS", "q4_K",
    "bench/local_v15.py's checkpoint; the 2-way head is sampled, then \"continue\" taken, as "
    "bench/local_v15.py does",
    text=SENTENCE, codec=False, prepare=_v15_prepare, load=_v15_load,
    weight_bytes=lambda t: _v15_path(t).stat().st_size,
    frames=lambda tts, seed, n: tts.model.iter_frames(_sentence_rows(tts), seed=seed,
                                                      max_frames=n),
    job=lambda tts, family, seed, n: family.job(_sentence_rows(tts), seed=seed, max_frames=n))


def _realtime_path(outtype: str) -> Path:
    from bench import realtime

    return realtime.weights(argparse.Namespace(tiny=False, type=outtype,
                                               data=_bench_data("realtime_data")))


def _realtime_keep_speaking() -> None:
    """No codebook draws the pad, BOS or EOS: EOS on codebook 0 is the turn's only stop
    (bench/realtime.py steps its session a fixed number of times instead), and any of the three
    on any codebook ends the audio a codec hears (`sanitized`: a random model's 16 draws hit
    one in about 5 % of its frames). Their logits are set far below the rest before the draw,
    in `TurnSampler.choose`, which the alone loop and the batch share."""
    from moss_tts.models.realtime import TurnSampler

    def wrap(plain):
        def choose(self, j, logits, seen):
            logits = logits.copy()
            logits[self.cfg.codebook_size:] = NEVER
            return plain(self, j, logits, seen)
        return choose

    _patch_once(TurnSampler, "choose", wrap)


def _realtime_load(outtype: str, threads: int, codec: bool):
    from moss_tts.models.realtime_tts import RealtimeTTS

    _realtime_keep_speaking()
    return RealtimeTTS.load(str(_realtime_path(outtype)), threads=threads)


def _realtime_frames(tts, seed: int, n: int):
    rows, text_ids = tts.plan(SENTENCE)
    return tts.model.iter_frames(rows, text_ids, seed=seed, max_frames=n)


def _realtime_job(tts, family, seed: int, n: int):
    rows, text_ids = tts.plan(SENTENCE)
    return family.job(rows, text_ids=text_ids, seed=seed, max_frames=n)


REALTIME = Family(
    "realtime", "moss_tts.models.realtime_tts:RealtimeTTS", "q6_K",
    "bench/realtime.py's checkpoint; codebook 0 never draws EOS, where bench/realtime.py steps "
    "a fixed number of frames",
    text=SENTENCE, codec=False, prepare=lambda driver, t: _realtime_path(t),
    load=_realtime_load, weight_bytes=lambda t: _realtime_path(t).stat().st_size,
    frames=_realtime_frames, job=_realtime_job)

def _delay_dir(outtype: str) -> Path:
    """bench/delay.py's MOSS-TTS 8B (--checkpoint tts) in upstream's published layout."""
    from bench import delay_weights

    return delay_weights.weights_dir(argparse.Namespace(
        checkpoint="tts", tiny=False, type=outtype, head_type=None,
        data=_bench_data("delay_data")))


def _delay_prepare(driver, outtype: str) -> None:
    """The checkpoint, written if missing; one cached with the stand-in "{}" tokenizer gets
    the fixture's (bench/delay.py reads none; DelayTTS needs one to load)."""
    from fixtures.make_delay import make_tokenizer_json
    from moss_tts.models.delay_published import TOKENIZER

    tokenizer = _delay_dir(outtype) / TOKENIZER
    if tokenizer.read_text() == "{}":
        driver.say(f"{tokenizer}: the stand-in \"{{}}\": writing a usable one")
        tokenizer.write_text(make_tokenizer_json())


def _delay_keep_speaking() -> None:
    """bench/delay.py steps a fixed number of rows whatever the text head picks: here, in
    `next_row` (which the alone loop and the batch share), the text head starts audio at once
    (a generation prompt ends at `assistant\\n`: a trained model's first draw is
    <|audio_start|>, a random one's any token) and never draws the delay slot (the audio's
    end) nor <|im_end|>: their logits are set far below the rest first."""
    from moss_tts.models import delay

    def wrap(plain):
        def next_row(state, text_logits, audio_logits, seen, cfg, opts, rng):
            text_logits = text_logits.copy()
            if not state.is_audio:
                start = text_logits[cfg.audio_start_token_id]
                text_logits[:] = NEVER
                text_logits[cfg.audio_start_token_id] = start
            text_logits[[cfg.audio_assistant_delay_slot_token_id, cfg.im_end_token_id]] = NEVER
            return plain(state, text_logits, audio_logits, seen, cfg, opts, rng)
        return next_row

    _patch_once(delay, "next_row", wrap)


def _delay_load(outtype: str, threads: int, codec: bool):
    from moss_tts.models.delay_tts import DelayTTS

    _delay_keep_speaking()
    return DelayTTS.load(str(_delay_dir(outtype)), threads=threads)


def _delay_bytes(outtype: str) -> int:
    from bench.delay_weights import weight_bytes

    return weight_bytes(_delay_dir(outtype), fp32_tables=False)


DELAY = Family(
    "delay", "moss_tts.models.delay_tts:DelayTTS", "q6_K,q4_K",
    "bench/delay.py's MOSS-TTS 8B; its text head never draws the delay slot nor <|im_end|>, "
    "where bench/delay.py steps a fixed number of rows",
    text=SENTENCE, codec=False, prepare=_delay_prepare, load=_delay_load,
    weight_bytes=_delay_bytes,
    frames=lambda tts, seed, n: tts.model.iter_rows(_sentence_rows(tts), seed=seed,
                                                    max_new_rows=n),
    job=lambda tts, family, seed, n: family.job(_sentence_rows(tts), seed=seed,
                                                max_new_rows=n))

FAMILIES = {f.name: f for f in (NANO, DELAY, LOCAL, LOCAL_V15, REALTIME)}
# what keeps each random model speaking, for a process that loads it otherwise (a server:
# bench/serve_bench.py --keep-speaking); Nano's checkpoint needs nothing
KEEPS_SPEAKING = {"delay": _delay_keep_speaking, "local": _local_keep_speaking,
                  "local_v15": _v15_keep_speaking, "realtime": _realtime_keep_speaking}


def keep_speaking(name: str) -> None:
    """Patch this process so that the family's random model never stops before its budget."""
    KEEPS_SPEAKING[name]()


def quiet_budget_warnings() -> None:
    """A bench stream always ends at its budget (the random model never stops): the
    BudgetWarning each one raises says nothing here."""
    from moss_tts.errors import BudgetWarning

    warnings.simplefilter("ignore", BudgetWarning)
