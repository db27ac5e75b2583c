"""The families bench/streams.py can time (issue 25): one `Family` entry each: its TTS class
(whose BATCHED says whether it decodes streams together), its real-dimension random checkpoint
per weight type, the prompt, and how its random model is kept from stopping early. Nano is
complete; the Qwen3 families say what their entry still needs, and the bench reports them
"not batched yet" until their BATCHED lands."""

from __future__ import annotations

import importlib
import warnings
from dataclasses import dataclass
from typing import Callable

from bench.nano import SENTENCE, make_checkpoint
from bench.nano import gguf_path as nano_gguf

FRAME_S = 0.080      # every family's codec makes one frame per 80 ms (12.5 Hz)


@dataclass(frozen=True)
class Family:
    """One family in the streams bench.

    `prepare(driver, type)` (driver side, once per type) writes what is missing: the checkpoint,
    its GGUF of that type and the codec GGUF; `load(type, threads, codec)` (in a worker) → the
    TTS object, with the codec when `codec` is True (first audio streams audio through the
    public API). `stream_kwargs(seed, frames)`: the `tts.stream` keywords of one stream with a
    budget of `frames` frames. `frames(tts, seed, n)` and `job(tts, family, seed, n)` are the
    decode-only sources of the same stream (codec decode not in the figures): today's
    one-stream loop, and the job of the family's BatchFamily (`tts.BATCHED`); None where the
    family has none yet: the throughput rows then stream through `tts.stream` (codec in).
    `pending`: what the entry still lacks before it can run (None: complete)."""

    name: str
    tts: str                        # "module:Class" of its TTS class
    types: str                      # default --types: those docs/families.md converts to
    keeps_going: str                # how the random model is kept from stopping, for the report
    text: str = ""
    prepare: Callable | None = None
    load: Callable | None = None
    weight_path: Callable | None = None        # type → the model file (its size: RAM check)
    stream_kwargs: Callable = lambda seed, frames: {"seed": seed}
    frames: Callable | None = None
    job: Callable | None = None
    pending: str | None = None

    def tts_class(self):
        module, name = self.tts.split(":")
        return getattr(importlib.import_module(module), name)

    def batched(self) -> bool:
        return self.tts_class().BATCHED is not None

    def blocked(self) -> str | None:
        """Why no row of this family can run now, or None."""
        if not self.batched():
            return (f"not batched yet ({self.tts.split(':')[1]}.BATCHED is None): no streams "
                    "decode together, nothing to compare")
        if self.pending:
            return f"batched, but the bench entry is incomplete: {self.pending}"
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
    from moss_tts.sampling import SamplingOptions

    return family.job(_nano_rows(tts), SamplingOptions(), seed, n)


NANO = Family(
    "nano", "moss_tts.models.nano_tts:NanoTTS", "f32,q8_0",
    "its checkpoint's stop_bias is −50 (bench/nano.py DIMS): the stop logit never wins",
    text=SENTENCE, prepare=_nano_prepare, load=_nano_load, weight_path=nano_gguf,
    stream_kwargs=lambda seed, frames: {"seed": seed, "max_frames": frames},
    frames=_nano_frames, job=_nano_job)

# --- the Qwen3 families: their benches' random checkpoints exist, their streams do not yet ----
# What each still needs for `tts.stream` at real dimensions: a tokenizer.json in the GGUF (their
# benches embed "{}"; fixtures.make_delay.make_tokenizer_json is what bench/realtime.py uses), a
# real-dims codec GGUF (24 kHz v1: bench/codec.py; 48 kHz v2 for Local v1.5: bench/codec48k.py
# --variants v2), and a way to keep the random model speaking inside the public API (their
# benches do it in their own loops, quoted below); and the decode-only `frames` / `job` of the
# family's BatchFamily once its `.job(...)` signature exists.
DELAY = Family(
    "delay", "moss_tts.models.delay_tts:DelayTTS", "q6_K,q4_K",
    "bench/delay.py times a fixed number of steps in its own loop (Steps), whatever the text "
    "head picks; inside tts.stream an end token would end the stream",
    pending="a stream entry (tokenizer, 24 kHz codec, keep-speaking) and DelayBatch's job")
LOCAL = Family(
    "local", "moss_tts.models.local_tts:LocalTTS", "q6_K",
    "bench/local.py writes audio_assistant_gen_slot_token_id into each row's text channel "
    "(\"random weights: keep speaking\")",
    pending="a stream entry (tokenizer, 24 kHz codec, keep-speaking) and LocalBatch's job")
LOCAL_V15 = Family(
    "local_v15", "moss_tts.models.local_v15_tts:LocalV15TTS", "q4_K",
    "bench/local_v15.py iterates LocalV15Model.iter_frames for a fixed max_frames",
    pending="a stream entry (tokenizer, 48 kHz v2 codec, keep-speaking) and LocalV15Batch's job")
REALTIME = Family(
    "realtime", "moss_tts.models.realtime_tts:RealtimeTTS", "q6_K",
    "bench/realtime.py feeds a session a fixed number of tokens and drains it (SilentTTS skips "
    "the codec)",
    pending="a stream entry (24 kHz codec, a token feed that keeps it speaking) and "
            "RealtimeBatch's job")

FAMILIES = {f.name: f for f in (NANO, DELAY, LOCAL, LOCAL_V15, REALTIME)}


def quiet_budget_warnings() -> None:
    """A bench stream always ends at its budget (the random model never stops): the
    BudgetWarning each one raises says nothing here."""
    from moss_tts.errors import BudgetWarning

    warnings.simplefilter("ignore", BudgetWarning)
