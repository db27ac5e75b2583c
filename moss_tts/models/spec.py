"""Declarations shared by every model: a block's tensors declared once (`TensorSpec`), from which
the weights record, the expected shapes and the converter's name mapping derive; and a frozen
`*Config` read from (and written to) GGUF metadata by field name (style C4, C5, C20, C21)."""

from __future__ import annotations

from dataclasses import MISSING, dataclass, fields, is_dataclass

# GGUFFile's typed read per config field type: a value of the wrong type in a corrupt or foreign
# file is a ModelFileError naming the key, not a TypeError deep in the model
_READERS = {"int": "integer", "int | None": "integer", "float": "real", "float | None": "real",
            "str": "text", "str | None": "text"}


@dataclass(frozen=True)
class TensorSpec:
    """One tensor of a block: its GGUF name below the block prefix, its numpy shape (Linear
    weights (out, in)), and its checkpoint name below the checkpoint's block prefix when that
    differs (a llama.cpp name for a Qwen3 backbone)."""

    name: str
    shape: tuple
    source: str | None = None
    optional: bool = False

    @property
    def attr(self) -> str:
        """The weights record's attribute: the name with dots turned into underscores (C20)."""
        return self.name.replace(".", "_")


def shapes(specs, prefix: str = "") -> dict[str, tuple]:
    """{full GGUF name: numpy shape} of a block's tensors under `prefix`."""
    return {prefix + s.name: tuple(s.shape) for s in specs}


def optional_names(specs, prefix: str = "") -> tuple[str, ...]:
    return tuple(prefix + s.name for s in specs if s.optional)


def source_names(specs, prefix: str, source_prefix: str) -> dict[str, str]:
    """{checkpoint name: GGUF name} for the converter."""
    return {source_prefix + (s.source or s.name): prefix + s.name for s in specs}


def fill_record(cls, tensors, prefix: str, specs):
    """The weights record `cls` of one block, each attribute read from `tensors` by its declared
    name (an absent optional tensor is None)."""
    return cls(**{s.attr: (tensors.get(prefix + s.name) if s.optional else tensors[prefix + s.name])
                  for s in specs})


def config_from_gguf(cls, meta, prefix: str, keys: dict[str, str] | None = None, **given):
    """A frozen config dataclass from metadata: field f is read from `keys[f]` when given (a
    llama.cpp key), else `<prefix>.<f>`; an absent key keeps the field default, and a
    required one raises ModelFileError naming the key and the file (through `meta[key]`).
    Fields passed in `given` (a nested config) are not read."""
    keys = keys or {}
    values = dict(given)
    for f in fields(cls):
        if f.name in given:
            continue
        key = keys.get(f.name, f"{prefix}.{f.name}")
        if key in meta or f.default is MISSING:   # a missing required key: ModelFileError
            read = getattr(meta, _READERS.get(f.type, ""), None)
            values[f.name] = read(key) if read else meta[key]
    return cls(**values)


def config_to_metadata(cfg, prefix: str, keys: dict[str, str] | None = None) -> dict:
    """`keys[field]` or `<prefix>.<field>` for every field that is set (None means the
    upstream default) and is not a nested config: the inverse of `config_from_gguf`."""
    keys = keys or {}
    values = {f.name: getattr(cfg, f.name) for f in fields(cfg)}
    # nested configs write their own keys (config_from_gguf takes them as `given`)
    return {keys.get(k, f"{prefix}.{k}"): v for k, v in values.items()
            if v is not None and not is_dataclass(v)}
