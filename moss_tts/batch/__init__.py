"""Batch synthesis of a whole manifest into a directory, resumable, on local worker processes
or Ray actors (`python -m moss_tts batch`)."""

from .driver import Summary, run_batch
from .manifest import Line, derive_seed, read_manifest

__all__ = ["Line", "Summary", "derive_seed", "read_manifest", "run_batch"]
