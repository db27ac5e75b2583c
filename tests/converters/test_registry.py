"""The family registry (moss_tts.models.registry) behind `convert <family>`, and the finish
step every converter shares (converters/registry.py: unused keys, --strict, shape checks,
atomic write)."""

import importlib
import logging

import numpy as np
import pytest

from converters import codec, delay, nano
from converters.gguf_io import matmul_types
from converters.registry import finish
from moss_tts.models.registry import CONVERTIBLE, family as row
from moss_tts.errors import ModelFileError
from moss_tts.ggml import GGUFFile

EXPECTED = {"a.weight": (4, 8), "b.bias": (4,)}


def tensors(**extra):
    rng = np.random.default_rng(0)
    out = {n: rng.standard_normal(s).astype(np.float32) for n, s in EXPECTED.items()}
    return out | extra


def run_finish(tmp_path, ts, unmapped=(), strict=True):
    return finish(tmp_path, tmp_path / "out.gguf", ts, list(unmapped), EXPECTED, {"t.x": 1},
                  kind="test", version=1, type_for=matmul_types("f32", lambda name, spec: False),
                  strict=strict)


def test_registry_maps_each_family_to_its_converter():
    for kind, module in (("nano", nano), ("codec", codec), ("delay", delay)):
        assert importlib.import_module(row(kind).converter) is module
    with pytest.raises(ModelFileError, match="unknown model family 'gpt5'; known: codec, nano, delay"):
        row("gpt5")


def test_cli_offers_exactly_the_registered_families():
    from moss_tts.cli import build_parser
    sub = next(a for a in build_parser()._subparsers._group_actions)
    family = next(a for a in sub.choices["convert"]._actions if a.dest == "family")
    assert list(family.choices) == list(CONVERTIBLE)


def test_finish_writes_expected_tensors_in_declaration_order(tmp_path):
    ts = tensors()
    path = run_finish(tmp_path, dict(reversed(list(ts.items()))))
    with GGUFFile(path) as f:
        assert list(f.tensors) == list(EXPECTED) and f["t.x"] == 1


def test_finish_strict_rejects_unmapped_and_unplaced_keys_and_writes_nothing(tmp_path):
    with pytest.raises(ModelFileError, match=r"2 checkpoint tensor\(s\) not used: stray, c.weight"):
        run_finish(tmp_path, tensors(**{"c.weight": np.zeros(3, np.float32)}), ["stray"])
    assert not list(tmp_path.iterdir())


def test_finish_without_strict_warns_and_drops_unused_keys(tmp_path, caplog):
    with caplog.at_level(logging.WARNING):
        path = run_finish(tmp_path, tensors(), ["stray"], strict=False)
    assert "1 checkpoint tensor(s) not used: stray" in caplog.text
    with GGUFFile(path) as f:
        assert list(f.tensors) == list(EXPECTED)


def test_finish_lists_every_missing_or_misshapen_tensor_at_once(tmp_path):
    ts = {"a.weight": np.zeros((8, 4), np.float32)}
    with pytest.raises(ModelFileError, match=r"2 tensor problem\(s\): b.bias: missing; "
                                             r"a.weight: shape \(8, 4\), expected \(4, 8\)"):
        run_finish(tmp_path, ts)
    assert not list(tmp_path.iterdir())
