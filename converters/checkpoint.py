"""Reading a Hugging Face checkpoint: a local directory or a repo id (through huggingface_hub),
`config.json`, and safetensors tensors — single file or sharded with an index — loaded lazily."""

from __future__ import annotations

import json
import logging
import math
import pickle
import zipfile
from pathlib import Path

import numpy as np

from moss_tts.errors import ModelFileError
from moss_tts.ggml.backend import NativeResource, released_on_error

logger = logging.getLogger(__name__)


def resolve_model_dir(model: str, *,
                      allow_patterns=("*.json", "*.safetensors", "*.model", "*.md")) -> Path:
    """`model` is a directory, or a Hugging Face repo id downloaded (once) into the HF cache."""
    path = Path(model).expanduser()
    if path.is_dir():
        return path
    if path.exists() or model.startswith((".", "/", "~")) or model.count("/") != 1:
        raise ModelFileError(f"{model}: not a checkpoint directory or a Hugging Face repo id "
                             "(owner/name)")
    try:
        from huggingface_hub import snapshot_download
        from huggingface_hub.errors import LocalEntryNotFoundError
    except ImportError:  # pragma: no cover - a declared dependency
        raise ModelFileError("huggingface_hub is not installed: pip install huggingface_hub") from None
    try:
        return Path(snapshot_download(model, allow_patterns=list(allow_patterns)))
    except LocalEntryNotFoundError:
        raise ModelFileError(f"{model}: not in the local Hugging Face cache and the hub cannot be "
                             "reached (offline?) — download it elsewhere and pass the directory") from None
    except Exception as e:  # network, auth, missing repo: one line naming the repo
        raise ModelFileError(f"{model}: cannot download from the Hugging Face hub "
                             f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}) — "
                             "pass a local checkpoint directory instead") from None


def read_config(model_dir: Path) -> dict:
    """config.json, or a diffusers pipeline's model_index.json (MOSS-SoundEffect v2.0's root
    has no config.json: its components have theirs)."""
    model_dir = Path(model_dir)
    if not (model_dir / "config.json").exists() and (model_dir / "model_index.json").exists():
        return read_json(model_dir / "model_index.json")
    if not (model_dir / "config.json").exists():
        raise ModelFileError(f"{model_dir}: no config.json — is this a Hugging Face checkpoint "
                             "directory?")
    return read_json(model_dir / "config.json")


def read_json(path: Path) -> dict:
    """A JSON object file; a missing or malformed one is a ModelFileError naming it."""
    try:
        value = json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ModelFileError(f"{path}: missing") from None
    except (ValueError, UnicodeDecodeError) as e:
        raise ModelFileError(f"{path}: not valid JSON ({e})") from None
    if not isinstance(value, dict):
        raise ModelFileError(f"{path}: a JSON {type(value).__name__}, not an object")
    return value


class SafetensorsCheckpoint(NativeResource):
    """name → numpy array over one or several safetensors files, read on access."""

    def __init__(self, model_dir: Path):
        self._handles = {}
        with released_on_error(self):   # no file stays mapped when one shard is refused
            self._open(model_dir)

    def close(self) -> None:
        """Unmap the files (a with-block or a failed conversion does it)."""
        for h in getattr(self, "_handles", {}).values():
            h.__exit__(None, None, None)   # safetensors unmaps the file here
        self._handles = {}

    def _open(self, model_dir: Path) -> None:
        from safetensors import safe_open

        index = model_dir / "model.safetensors.index.json"
        if index.exists():
            try:
                weight_map = json.loads(index.read_text())["weight_map"]
            except (ValueError, KeyError, TypeError) as e:
                raise ModelFileError(f"{index}: unreadable shard index ({e})") from None
            if not isinstance(weight_map, dict) or not all(
                    isinstance(v, str) for v in weight_map.values()):
                raise ModelFileError(f"{index}: weight_map is not a map of tensor → shard file")
            files = sorted(set(weight_map.values()))
        else:
            files = sorted(p.name for p in model_dir.glob("*.safetensors"))
            if not files:
                raise ModelFileError(f"{model_dir}: no *.safetensors files (a .bin checkpoint "
                                     "must be converted to safetensors first)")
            weight_map = None
        self._paths: dict[str, Path] = {}
        self._where: dict[str, str] = {}
        for name in files:
            path = model_dir / name
            if not path.exists():
                raise ModelFileError(f"{path}: shard listed in the index is missing")
            try:
                h = safe_open(str(path), framework="np")
            except Exception as e:
                raise ModelFileError(f"{path}: not a readable safetensors file ({e})") from None
            self._handles[name] = h
            self._paths[name] = path
            for key in h.keys():
                self._where[key] = name
        if weight_map is not None:
            missing = [k for k, f in weight_map.items() if self._where.get(k) != f]
            if missing:
                raise ModelFileError(f"{index}: {len(missing)} tensor(s) not found in their "
                                     f"shards, e.g. {missing[0]}")

    def keys(self) -> list[str]:
        return list(self._where)

    def __contains__(self, name: str) -> bool:
        return name in self._where

    def __getitem__(self, name: str) -> np.ndarray:
        h = self._handles[self._where[name]]
        if h.get_slice(name).get_dtype() == "BF16":   # numpy has no bfloat16: widen to f32
            return read_bf16(self._paths[self._where[name]], name)
        return h.get_tensor(name)

    def shape(self, name: str) -> tuple:
        """A tensor's shape, read from the header (no data is loaded)."""
        return tuple(self._handles[self._where[name]].get_slice(name).get_shape())


def read_bf16(path: Path, name: str) -> np.ndarray:
    """One BF16 tensor of a safetensors file as float32 (bf16 is the top half of an f32),
    read through a memory map so only this tensor is in memory."""
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        info = json.loads(f.read(n))[name]
    a, b = info["data_offsets"]
    raw = np.memmap(path, dtype=np.uint16, mode="r", offset=8 + n + a, shape=((b - a) // 2,))
    return (raw.astype(np.uint32) << 16).view(np.float32).reshape(info["shape"])


def fuse_weight_norm(g: np.ndarray, v: np.ndarray) -> np.ndarray:
    """torch weight_norm(dim=0) → dense weight: W[o] = g[o] · v[o] / ‖v[o]‖₂, norm over every
    axis but the output one, no epsilon; a 1×1 conv kernel (out, in, 1) becomes (out, in)."""
    v64 = v.astype(np.float64).reshape(v.shape[0], -1)
    norm = np.sqrt((v64 ** 2).sum(axis=1, keepdims=True))
    w = g.astype(np.float64).reshape(-1, 1) * v64 / norm
    return w.astype(np.float32)


class TorchBinCheckpoint(NativeResource):
    """name → numpy array from a PyTorch `torch.save` zip (e.g. pytorch_model.bin), read without
    torch: a restricted unpickler that knows only tensor rebuilding, storages and OrderedDict."""

    _DTYPES = {"FloatStorage": np.float32, "HalfStorage": np.float16, "DoubleStorage": np.float64,
               "BFloat16Storage": "bfloat16", "LongStorage": np.int64, "IntStorage": np.int32,
               "ShortStorage": np.int16, "CharStorage": np.int8, "ByteStorage": np.uint8,
               "BoolStorage": np.bool_}

    def __init__(self, path: Path):
        try:
            self._zip = zipfile.ZipFile(path)
        except (zipfile.BadZipFile, OSError) as e:
            raise ModelFileError(f"{path}: not a PyTorch zip checkpoint ({e}); legacy "
                                 "(pre-1.6) torch.save files are not supported") from None
        with released_on_error(self):
            self._read_state(path)

    def close(self) -> None:
        if getattr(self, "_zip", None) is not None:
            self._zip.close()

    def _read_state(self, path: Path) -> None:
        names = self._zip.namelist()
        pkl = next((n for n in names if n.endswith("/data.pkl") or n == "data.pkl"), None)
        if pkl is None:
            raise ModelFileError(f"{path}: no data.pkl inside — not a torch.save checkpoint")
        root = pkl[: -len("data.pkl")]
        zf, dtypes = self._zip, self._DTYPES

        class Storage:
            def __init__(self, kind, key):
                self.kind, self.key = kind, key
                try:
                    self.name = f"{root}data/{key}"
                    nbytes = zf.getinfo(self.name).file_size
                except (KeyError, TypeError):
                    raise ModelFileError(f"{path}: storage {key!r} is missing from the "
                                         "archive") from None
                width = 2 if dtypes[kind] == "bfloat16" else np.dtype(dtypes[kind]).itemsize
                self.size = nbytes // width   # elements

            def array(self):
                raw = zf.read(self.name)
                if dtypes[self.kind] == "bfloat16":  # widen bf16 bits to f32
                    return (np.frombuffer(raw, np.uint16).astype(np.uint32) << 16).view(np.float32)
                return np.frombuffer(raw, dtypes[self.kind])

        def rebuild_tensor(storage, offset, shape, stride, *_):
            return _LazyTensor.checked(path, storage, offset, shape, stride)

        class Unpickler(pickle.Unpickler):
            def find_class(self, module, name):
                if (module, name) in (("torch._utils", "_rebuild_tensor_v2"),
                                      ("torch._utils", "_rebuild_tensor")):
                    return rebuild_tensor
                if module == "torch" and name in dtypes:
                    return name
                if (module, name) == ("collections", "OrderedDict"):
                    import collections
                    return collections.OrderedDict
                raise ModelFileError(f"{path}: unsupported object {module}.{name} in the "
                                     "checkpoint (only tensors are read)")

            def persistent_load(self, pid):
                if not (isinstance(pid, tuple) and pid and pid[0] == "storage"):
                    raise ModelFileError(f"{path}: unsupported persistent id {pid!r}")
                kind = pid[1] if isinstance(pid[1], str) else getattr(pid[1], "__name__", "")
                if kind not in dtypes:
                    raise ModelFileError(f"{path}: unsupported storage type {kind}")
                return Storage(kind, pid[2])

        try:
            with zf.open(pkl) as f:
                state = Unpickler(f).load()
        except ModelFileError:
            raise
        except Exception as e:  # a damaged pickle fails in many ways (EOF, bad opcode, args)
            raise ModelFileError(f"{path}: unreadable data.pkl ({type(e).__name__}: "
                                 f"{str(e).splitlines()[0] if str(e) else ''})") from None
        # audiotools' BaseModel.save: {"state_dict": ..., "metadata": {"kwargs": ...}}
        self.metadata = None
        if isinstance(state, dict) and "state_dict" in state and isinstance(state["state_dict"], dict):
            meta = state.get("metadata")
            self.metadata = meta if isinstance(meta, dict) else None
            state = state["state_dict"]
        if not isinstance(state, dict):
            raise ModelFileError(f"{path}: data.pkl holds a {type(state).__name__}, not a "
                                 "state dict of tensors")
        self._tensors = {k: v for k, v in state.items() if isinstance(v, _LazyTensor)}

    def keys(self) -> list[str]:
        return list(self._tensors)

    def __contains__(self, name: str) -> bool:
        return name in self._tensors

    def __getitem__(self, name: str) -> np.ndarray:
        return self._tensors[name].numpy()

    def shape(self, name: str) -> tuple:
        return self._tensors[name].shape


class _LazyTensor:
    def __init__(self, storage, offset: int, shape: tuple, stride: tuple):
        self.storage, self.offset, self.shape, self.stride = storage, offset, shape, stride

    @classmethod
    def checked(cls, path, storage, offset, shape, stride) -> "_LazyTensor":
        """A tensor record whose every element lies in its storage (a corrupt record would
        otherwise read out of bounds or copy a broadcast view of terabytes)."""
        try:
            offset, shape, stride = int(offset), tuple(map(int, shape)), tuple(map(int, stride))
        except (TypeError, ValueError):
            raise ModelFileError(f"{path}: a tensor record is malformed") from None
        if len(shape) != len(stride) or min((offset, *shape, *stride), default=0) < 0:
            raise ModelFileError(f"{path}: tensor record offset {offset}, shape {shape}, stride "
                                 f"{stride} is invalid")
        n = math.prod(shape)
        last = offset + sum((d - 1) * s for d, s in zip(shape, stride)) if n else offset
        if n and (last >= storage.size or n > storage.size):
            raise ModelFileError(f"{path}: a tensor of shape {shape} (offset {offset}, stride "
                                 f"{stride}) does not fit its storage of {storage.size} elements")
        return cls(storage, offset, shape, stride)

    def numpy(self) -> np.ndarray:
        flat = self.storage.array()
        item = flat.itemsize
        return np.lib.stride_tricks.as_strided(
            flat[self.offset:], shape=self.shape, strides=tuple(s * item for s in self.stride)).copy()


def report_unmapped(model_dir: Path, unmapped: list[str], strict: bool) -> None:
    """Checkpoint tensors the conversion does not use: an error with `strict`, else a warning
    (never dropped silently)."""
    if unmapped:
        msg = f"{len(unmapped)} checkpoint tensor(s) not used: {', '.join(unmapped[:8])}"
        if strict:
            raise ModelFileError(f"{model_dir}: {msg} (--strict)")
        logger.warning("%s", msg)


def expected_tensors(model_dir: Path, tensors: dict, expected: dict[str, tuple]) -> dict:
    """`tensors` in the order of `expected`; every missing or misshapen one listed in one
    ModelFileError."""
    problems = [f"{n}: missing" for n in expected if n not in tensors]
    problems += [f"{n}: shape {tuple(tensors[n].shape)}, expected {s}"
                 for n, s in expected.items() if n in tensors and tuple(tensors[n].shape) != s]
    if problems:
        raise ModelFileError(f"{model_dir}: {len(problems)} tensor problem(s): "
                             + "; ".join(problems[:8]))
    return {n: tensors[n] for n in expected}


def open_checkpoint(model_dir: Path):
    """Safetensors when present, else a PyTorch pytorch_model.bin read without torch."""
    if any(model_dir.glob("*.safetensors")) or (model_dir / "model.safetensors.index.json").exists():
        return SafetensorsCheckpoint(model_dir)
    bins = sorted(model_dir.glob("*.bin"))
    if not bins:
        raise ModelFileError(f"{model_dir}: no *.safetensors or pytorch_model.bin weights")
    if len(bins) > 1:
        raise ModelFileError(f"{model_dir}: several .bin files; sharded .bin checkpoints are not "
                             "supported — convert them to safetensors")
    return TorchBinCheckpoint(bins[0])
