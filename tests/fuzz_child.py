"""Child process of tests/test_fuzz_loaders.py: feed every case to one loader under an
address-space cap, and report each outcome on its own line:

    START <case>                  before each case (the last one names a crash or a hang)
    LOADED <case>                 the loader accepted it
    ERROR <case> <message>        a one-line error of the package's family (the wanted outcome)
    BAD <case> <what happened>    any other exception, a multi-line message, or a MemoryError

    python -m tests.fuzz_child LOADER CASE_PATH...
"""

import resource
import sys

ADDRESS_SPACE = 2 << 30   # a loader that tries a multi-GB allocation fails here instead


def load_gguf(path):
    """GGUFFile with every metadata value read, then the weights mapped (what `info` does)."""
    from moss_tts.ggml import GGUFFile, Weights
    with GGUFFile(path) as f:
        for key in f.keys():
            f.get(key)
    Weights.load(path).close()


def load_codec(path):
    from moss_tts.codec import Codec
    Codec.load(path, threads=1).close()


def load_nano(path):
    from moss_tts.models.nano_tts import NanoTTS
    NanoTTS.load(path, threads=1).close()


def load_audio(path):
    """An audio file read whole, its first second, and block by block."""
    from moss_tts.audio import read_audio, read_audio_blocks
    read_audio(path)
    read_audio(path, max_seconds=1.0)
    blocks, _, _ = read_audio_blocks(path)
    for _ in blocks:
        pass


def load_checkpoint(path):
    """A Hugging Face checkpoint directory: every tensor's shape and data."""
    from pathlib import Path

    from converters.checkpoint import open_checkpoint
    ckpt = open_checkpoint(Path(path))
    for name in ckpt.keys():
        ckpt.shape(name)
        ckpt[name]


def load_codes(path):
    from moss_tts.codec.io import load_codes as load
    load(path)


LOADERS = {"gguf": load_gguf, "codec": load_codec, "nano": load_nano,
           "checkpoint": load_checkpoint, "codes": load_codes, "audio": load_audio}


def main(argv):
    from moss_tts.errors import MossTTSError

    load, cases = LOADERS[argv[0]], argv[1:]
    resource.setrlimit(resource.RLIMIT_AS, (ADDRESS_SPACE, ADDRESS_SPACE))
    for case in cases:
        print("START", case, flush=True)
        try:
            load(case)
        except MossTTSError as e:
            msg = str(e)
            one_line = bool(msg) and "\n" not in msg
            print("ERROR" if one_line else "BAD", case, msg if one_line else repr(msg), flush=True)
        except BaseException as e:  # noqa: BLE001 - reporting every other outcome is the point
            detail = str(e).splitlines()[0] if str(e) else ""
            print("BAD", case, type(e).__name__, detail, flush=True)
        else:
            print("LOADED", case, flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
