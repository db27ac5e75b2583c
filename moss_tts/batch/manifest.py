"""A batch manifest (JSONL or CSV) → lines to synthesize.

Structural problems (unreadable rows, unknown fields, a missing, duplicate or unsafe id) stop
the run before any work, naming the line. A problem with one line's content (empty text, an
option that is not a number) is kept on that line, reported as its failure, and the rest run.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import re
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import InputError
from ..knobs import BY_NAME, SPELLINGS, parse

# ids become file names: no separators, no leading dot (hidden/partial files), no ".."
SAFE_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")
# per-line knobs (knobs.KNOBS, by any of their spellings) but the seed, a Line field of its own
OPTIONS = {spelling: knob for spelling, knob in SPELLINGS.items() if knob.name != "seed"}
FIELDS = {"id", "text", "voice", "reference", "seed", "model", *OPTIONS}
SEED_BITS = 31


@dataclass(frozen=True)
class Line:
    """One manifest line. `error` holds a content problem found while parsing (the line fails,
    the others run); `seed` is the given seed or `derive_seed(id)`, None when the given one is
    invalid (the line fails: a made-up seed would misreport it); `reference` is absolute,
    resolved against the manifest's directory."""

    number: int
    id: str
    text: str | None          # None: a sound described by the `sound` column instead
    seed: int | None
    voice: str | None = None
    reference: str | None = None
    model: str | None = None
    options: dict = field(default_factory=dict)
    error: str | None = None


def derive_seed(line_id: str) -> int:
    """The seed of a line that gives none: the first 31 bits of sha256(id), so a rerun (or
    another machine) samples the same audio."""
    digest = hashlib.sha256(line_id.encode("utf-8")).digest()
    return int.from_bytes(digest[:4], "big") >> (32 - SEED_BITS)


def read_manifest(path: str | Path) -> list[Line]:
    """Parse a .jsonl (one JSON object per line) or .csv (a header row) manifest."""
    path = Path(path)
    try:
        raw = path.read_text(encoding="utf-8-sig")    # spreadsheets often save CSV with a BOM
    except (OSError, UnicodeDecodeError) as e:
        raise InputError(f"{path}: cannot read the manifest ({e})") from None
    rows = _csv_rows(path, raw) if path.suffix.lower() == ".csv" else _jsonl_rows(path, raw)
    lines, seen = [], {}
    for number, row in rows:
        line = _line(path, number, row)
        folded = line.id.casefold()    # "A" and "a" are one file on macOS' and Windows' disks
        if folded in seen:
            raise InputError(f"{path}:{number}: id {line.id!r} repeats line {seen[folded]}; ids "
                             "must be unique, ignoring case (they name the output files)")
        seen[folded] = number
        lines.append(line)
    if not lines:
        raise InputError(f"{path}: the manifest has no lines")
    return lines


def _jsonl_rows(path: Path, raw: str):
    for number, text in enumerate(raw.splitlines(), 1):
        if not text.strip():
            continue
        try:
            row = json.loads(text)
        except json.JSONDecodeError as e:
            raise InputError(f"{path}:{number}: not a JSON object ({e.msg}); each line of a .jsonl "
                             'manifest is one object like {"id": ..., "text": ...}') from None
        if not isinstance(row, dict):
            raise InputError(f"{path}:{number}: expected a JSON object, got {type(row).__name__}")
        yield number, row


def _csv_rows(path: Path, raw: str):
    reader = csv.DictReader(io.StringIO(raw, newline=""))
    for row in reader:
        number = reader.line_num
        if None in row:
            raise InputError(f"{path}:{number}: more cells than header columns")
        # an empty cell means "not given", as a missing key does in JSONL
        yield number, {k: v for k, v in row.items() if v not in ("", None)}


def _line(path: Path, number: int, row: dict) -> Line:
    unknown = sorted(set(row) - FIELDS)
    if unknown:
        raise InputError(f"{path}:{number}: unknown field(s) {', '.join(map(repr, unknown))}; "
                         f"known: {', '.join(sorted(FIELDS))}")
    line_id = row.get("id")
    if isinstance(line_id, int) and not isinstance(line_id, bool):
        line_id = str(line_id)
    if not isinstance(line_id, str) or not SAFE_ID.match(line_id) or ".." in line_id:
        raise InputError(f"{path}:{number}: id {line_id!r} is not a safe file name: use 1-128 "
                         "letters, digits, '_', '-' or '.', starting with a letter or digit")
    problems = []
    text = row.get("text")
    if text is None and row.get("sound") is not None:
        pass                 # a sound effect described by its `sound` column has no text
    elif not isinstance(text, str):
        problems.append("text is missing" if text is None else
                        f"text must be a string, not {type(text).__name__} ({text!r})")
        text = ""
    elif not text.strip():
        problems.append("text is empty")
        text = ""
    seed = _seed(row, line_id, problems)
    options = _knobs(row, problems)
    strings = {k: _typed(row, k, str, problems) for k in ("voice", "reference", "model")}
    if strings["voice"] and strings["reference"]:    # as `tts` refuses --voice with --reference
        problems.append("give voice or reference, not both")
    if strings["reference"]:    # relative to the manifest, so a run works from any directory
        strings["reference"] = str((path.parent / strings["reference"]).resolve())
    for spec in options.get("speakers") or []:    # each speaker's speech file, likewise
        if spec is not None and "reference" in spec:
            spec["reference"] = str((path.parent / spec["reference"]).resolve())
    return Line(number=number, id=line_id, text=text, seed=seed, options=options,
                error="; ".join(problems) or None, **strings)


def _knobs(row: dict, problems: list) -> dict:
    """The line's knobs (knob name → value, typed: CSV cells arrive as text); a bad value
    joins `problems`, naming its column."""
    out = {}
    for spelling, knob in OPTIONS.items():
        if row.get(spelling) is None:
            continue
        if knob.name in out:
            problems.append(f"{spelling} and {knob.name} are the same column: give one")
            continue
        try:
            out[knob.name] = parse(knob, row[spelling], "manifest")
        except InputError as e:
            problems.append(str(e).replace(knob.name, spelling, 1))
    return out


def _seed(row: dict, line_id: str, problems: list) -> int | None:
    """The given seed, checked against numpy's range; derive_seed(id) when none is given."""
    if row.get("seed") is None:
        return derive_seed(line_id)
    try:
        return parse(BY_NAME["seed"], row["seed"], "manifest")    # numpy's range, as everywhere
    except InputError as e:
        problems.append(str(e))
        return None


def _typed(row: dict, key: str, kind: type, problems: list):
    """row[key] as `kind` (CSV cells arrive as text), or None; a bad value joins `problems`."""
    value = row.get(key)
    if value is None:
        return None
    try:
        return _convert(value, kind)
    except (TypeError, ValueError):
        problems.append(f"{key} {value!r} is not a valid {kind.__name__}")
        return None


def _convert(value, kind: type):
    if kind is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "1", "yes", "false", "0", "no"):
            return value.lower() in ("true", "1", "yes")
        raise ValueError(value)
    if kind is str:
        if not isinstance(value, str) or not value:
            raise ValueError(value)
        return value
    if isinstance(value, bool):
        raise TypeError(value)
    if kind is int:
        if isinstance(value, str):
            return int(value)
        if not float(value).is_integer():
            raise ValueError(value)
        return int(value)
    return float(value)
