"""`python -m moss_tts tts --live`: text read from stdin as it arrives (an LLM's output piped
in) is pushed into a live session (MOSS-TTS-Realtime) delta by delta, and its audio leaves as it
is made. Follows upstream's example_llm_stream_to_tts.py, with stdin as the LLM."""

from __future__ import annotations

import codecs
import os
from collections.abc import Iterator

from .errors import InputError

READ_BYTES = 4096    # one read returns what the pipe holds now, up to this


def check_live(args, cls) -> None:
    """--live needs a family with live sessions, and stdin for its text."""
    if not callable(getattr(cls, "session", None)):
        raise InputError(f"--live needs a MOSS-TTS-Realtime model; {args.model} is a "
                         f"{cls.NAME} one: leave out --live")
    if args.text is not None or args.text_file is not None:
        raise InputError("--live reads the text from stdin as it arrives: leave out "
                         "--text/--text-file and pipe the text in")


def stdin_deltas(fd: int) -> Iterator[str]:
    """The text on `fd` as it arrives: each read returns what is there without waiting for more,
    decoded as UTF-8 across read boundaries."""
    from .cli_tts import _utf8

    decoder = codecs.getincrementaldecoder("utf-8")()
    seen = b""      # for the error message: where the bad byte is
    while data := os.read(fd, READ_BYTES):
        seen += data
        try:
            text = decoder.decode(data)
        except UnicodeDecodeError:
            _utf8(seen, "stdin")
            raise
        if text:
            yield text
    try:
        decoder.decode(b"", final=True)
    except UnicodeDecodeError:
        _utf8(seen, "stdin")
        raise
