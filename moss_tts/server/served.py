"""The registry of served models: each loaded TTS behind its own worker (worker.py), what the
event loop may know of it without touching it, and how a request picks one. The routes
(app.py) and the live endpoint (live.py) reach the models only through it."""

from __future__ import annotations

from ..errors import BackendLost, InputError, VoiceError
from ..knobs import KNOBS, bounded_text, check_required, synthesis_keywords, takes
from ..models.batching import stream_places
from ..speakers import speakers_argument
from .hosted import HostedModel, describe
from .request import RequestError, decode_upload
from .responses import first_line
from .settings import ServerSettings
from .voice_index import VoiceIndex
from .worker import ModelWorker

# OpenAI's model names: a request naming one (or none) is served by the first model
OPENAI_MODELS = ("tts-1", "tts-1-hd", "gpt-4o-mini-tts")


def served_name(kind: str) -> str:
    """The name a model of the family `kind` is served under (GET /v1/models, a request's
    `model`); serve names a second one of a family by its file instead."""
    return f"moss-tts-{kind}"


def streams_of(tts, max_streams: int | None) -> int:
    """The stream places of a model: --max-streams as given (N > 1 needs a model whose family
    has a batched decoder, its class's BATCHED, models/batching.py), or with None ("auto", the
    default) as models/batching.py stream_places gives a family with or without one."""
    info = describe(tts)
    if max_streams is not None and max_streams > 1 and not info.batched:
        raise InputError(f"--max-streams {max_streams}: {info.name} decodes one request at a "
                         "time; give --max-streams 1 or auto (only a family with a batched "
                         "decoder takes more)")
    return stream_places(max_streams, info.batched)


class ServedModel:
    """One loaded TTS behind its own worker, and what the event loop may know of it without
    touching it (only the worker thread uses the model)."""

    def __init__(self, name: str, tts, queue_depth: int, thread_name: str, max_streams: int = 1):
        from ..models.registry import family

        info = describe(tts)
        self.name, self.sample_rate, self.channels = name, info.sample_rate, info.channels
        self.family = family(info.family)
        # a model in a child process (hosted.py) can be lost and come back; one here cannot
        self.hosted = tts if isinstance(tts, HostedModel) else None
        self.clones = self.family.takes_reference    # `voice` / `reference_audio` clone one
        # the request fields it takes beyond OpenAI's own (/v1/models lists them, so a client,
        # the page among them, offers only those): a stored voice and uploaded speech where it
        # clones one, then its knobs by name; `required`: those it cannot speak without
        self.fields = (["voice", "reference_audio"] if self.clones else []) + [
            k.name for k in KNOBS if takes(self.family, k)]
        self.required = [k.name for k in KNOBS if k.keyword in self.family.required]
        self.live = info.live                      # /v1/audio/live serves it
        # its steps reach a streamed request as progress events (a callback cannot cross to a
        # model in a child process: a hosted one streams its audio only)
        self.progress = self.family.reports_progress and self.hosted is None
        # what its voices must have been made by (the page lists only those); None: no codec
        self.codec = info.codec
        self.worker = ModelWorker(tts, queue_depth, thread_name, max_streams)

    def status(self) -> dict:
        """{"available": bool, and while not: "problem", "retry_in" (s)}."""
        return self.hosted.status() if self.hosted is not None else {"available": True}

    def check_available(self) -> None:
        """A 503 for a request to a model whose backend is lost, before it takes a place."""
        if self.hosted is not None and not self.hosted.available:
            raise BackendLost(self.hosted.unavailable())

    def close(self) -> None:
        self.worker.close()
        if self.hosted is not None:
            self.hosted.close()

    def stream_keywords(self, req) -> dict:
        """`stream`'s keywords for a request's knobs: the family's options over its defaults,
        each knob checked against the family's own bounds, and the text against the family's
        (MOSS-SoundEffect's description; a live config has no text). OpenAI clients send
        `instructions` to any model: a family without a style prompt ignores it."""
        try:
            bounded_text(self.family.tts_class(), getattr(req, "text", None), "request")
            words = synthesis_keywords(self.family, req.knobs, "request",
                                       lenient=("instruction",), given_as=req.given_as)
            check_required(self.family, words, "request")
        except InputError as e:
            raise RequestError(400, first_line(e)) from None
        if req.reference_audio and not self.clones:
            raise RequestError(400, f"'reference_audio' is not a {self.family.name} option: "
                                    + self.voices_hint())
        return words

    def voices_hint(self) -> str:
        """Where a family that clones no single voice takes its voices, if anywhere."""
        if "speakers" in self.family.keywords:
            return ("give each speaker's voice in 'speakers' ([{\"voice\": NAME}, "
                    "{\"reference_audio\": ..., \"transcript\": ...}])")
        return "it takes no reference voice; leave it out"


class ServedModels:
    """name → ServedModel, the first being the default (it also answers to OpenAI's names);
    each model gets its own worker, with `settings.queue_depth` places in its line. `voices`
    indexes the stored voices (voice_index.py); the routes and the live endpoint read their
    deadlines and limits from `settings` (settings.py)."""

    def __init__(self, models: dict, settings: ServerSettings):
        places = {name: streams_of(tts, settings.max_streams)    # before any worker starts
                  for name, tts in models.items()}
        self.settings = settings
        self.voices = VoiceIndex(settings.voices_root, settings.max_voices)
        self.voices_root = self.voices.root
        self.models = {name: ServedModel(name, tts, settings.queue_depth,
                                         "moss-tts-model" if i == 0 else f"moss-tts-model-{name}",
                                         places[name])
                       for i, (name, tts) in enumerate(models.items())}
        self.default = next(iter(self.models.values()))

    def pick(self, name: str | None) -> ServedModel:
        """The request's model: by its name; OpenAI's names (or none) mean the first."""
        if name is None or name in OPENAI_MODELS:
            return self.default
        if name not in self.models:
            raise RequestError(400, f"unknown model {name!r}; available: "
                                    f"{', '.join(self.models)} (or {', '.join(OPENAI_MODELS)} "
                                    f"for {self.default.name})")
        return self.models[name]

    def live_rows(self) -> dict:
        """The session keyword for --live-context (none: the model's own default)."""
        rows = self.settings.live_context
        return {} if rows is None else {"max_rows": rows}

    def live_names(self) -> list[str]:
        return [name for name, m in self.models.items() if m.live]

    def stream_inputs(self, model, served_model: ServedModel, req, words: dict) -> dict:
        """Worker side: `stream`'s keywords for a request: its knobs (`words`), its voice where
        the family clones one, and its speakers read (stored voices, uploaded speech). A
        stored voice named in `voice` for a family that clones none is refused, not dropped;
        OpenAI's names (alloy, ...) are dropped as everywhere."""
        kw = dict(words)
        if served_model.clones:
            kw["reference"] = self.reference_for(model, req)
        elif req.voice and self.voices.known(req.voice):
            raise RequestError(400, f"'voice' {req.voice!r} is not a {served_model.family.name}"
                                    f" option: {served_model.voices_hint()}")
        if kw.get("speakers") is not None:
            kw["speakers"] = speakers_argument(
                kw["speakers"],
                voice=lambda name: self.speaker_voice(model, name, served_model.name),
                speech=lambda data: decode_upload(data, "speakers"))
        return kw

    def speaker_voice(self, model, name: str, model_name: str):
        if not self.voices.known(name):
            raise RequestError(400, f"'speakers': no stored voice named {name!r} (GET "
                                    "/v1/audio/voices lists them; POST adds one)")
        return self.stored_voice(model, name, "'speakers'", model_name)

    def reference_for(self, model, req):
        """Worker side: the request's voice, from uploaded audio or a stored name (looked up
        in the index: reading every voice file per request slowed even `alloy`)."""
        if req.reference_audio:
            return model.encode_reference(*decode_upload(req.reference_audio, "reference_audio"))
        if req.voice and self.voices.known(req.voice):
            return self.stored_voice(model, req.voice, "'voice'", self.pick(req.model).name)
        return None   # OpenAI's voice names (alloy, ...) fall back to the default voice

    def stored_voice(self, model, name: str, field: str, model_name: str):
        """Worker side: stored voice `name` as `model`'s reference; one it cannot use
        (unreadable, made by another codec) is a 400 saying how to store it again here, where
        the CLI's message names `voice add` and its flags."""
        try:
            return model.voice(name, root=self.voices_root)
        except VoiceError as e:
            raise RequestError(400, f"{field}: {e.problem}: store it again for this model: "
                                    f"DELETE /v1/audio/voices/{name}, then POST "
                                    f"/v1/audio/voices with \"model\": \"{model_name}\"") from None

    def close(self) -> None:
        for m in self.models.values():
            m.close()
