"""The family registry (moss_tts/models/registry.py): one row per family, consistent with the
family's own modules, so a front end can rely on the row alone."""

import dataclasses
import inspect

import pytest

from converters.registry import converter
from moss_tts.errors import ConfigError
from moss_tts.models.registry import (BY_KIND, CODEC, CONVERTIBLE, DEFAULT, FAMILIES,
                                      family_of_config)


@pytest.mark.parametrize("row", FAMILIES, ids=lambda f: f.kind)
def test_a_row_names_its_tts_class_options_and_converter(row):
    cls = row.tts_class()
    assert cls.FAMILY == row.kind and cls.NAME == row.name
    assert cls.OPTIONS is row.options_class()
    assert callable(converter(row).convert)      # converters/registry.py runs it
    assert hasattr(__import__(row.converter, fromlist=["convert"]), "convert")


def test_every_familys_options_class_is_one_a_sampling_knob_is_checked_against():
    """knobs.parse checks a sampling value against sampling.OPTIONS_CLASSES before the family
    is known (the knob table sits below the registry): each family's class must be there."""
    from moss_tts.sampling import OPTIONS_CLASSES

    assert list(dict.fromkeys(row.options_class() for row in FAMILIES)) == list(OPTIONS_CLASSES)


@pytest.mark.parametrize("row", FAMILIES, ids=lambda f: f.kind)
def test_a_rows_keywords_are_what_its_stream_takes(row):
    """Every keyword the row offers is a parameter of `stream` or one of its prompt fields
    (what `**fields` takes); nothing else may be offered to users."""
    cls = row.tts_class()
    params = set(inspect.signature(cls.stream).parameters) | set(
        getattr(cls, "PROMPT_FIELDS", ())) | {"seconds", "prompt_text"}
    for word in row.keywords:
        assert word in params, (row.kind, word)
    budget = cls.BUDGET
    assert budget.keyword in row.keywords, "the frame budget is a knob of the family"
    assert 1 <= budget.default <= budget.limit


def test_exactly_one_row_detects_each_config():
    configs = {"nano": {"model_type": "moss_tts_nano", "gpt2_config": {}},   # as Nano's own
               "delay": {"model_type": "moss_tts_delay"},
               "local": {"model_type": "moss_tts_delay", "local_num_layers": 1},
               "local-v15": {"model_type": "moss_tts_delay", "gpt2_config": {},
                             "local_num_layers": 1},
               "realtime": {"model_type": "moss_tts_realtime"},
               "codec": {"model_type": "speech_tokenizer", "encoder_kwargs": []},
               # a diffusers pipeline's model_index.json (its root has no config.json)
               "sfx-v2": {"_class_name": "MossSoundEffectPipeline", "sample_rate": 48000,
                          "max_inference_seconds": 30}}
    # a published checkpoint of another row's architecture (MOSS-TTSD, ...) shares its config
    # shape: only its names tell it apart (tests/models/test_delay_checkpoints.py)
    assert set(configs) == {k for k, f in CONVERTIBLE.items() if not f.arch}
    for kind, config in configs.items():
        assert [f.kind for f in (CODEC, *FAMILIES) if f.detect(config) and not f.arch] == [kind]
        assert family_of_config(config).kind == kind
        assert all(f.arch == kind for f in FAMILIES if f.detect(config) and f.kind != kind)


def test_a_config_of_no_family_names_the_model_type():
    with pytest.raises(ConfigError, match="'llama': the checkpoint matches no family"):
        family_of_config({"model_type": "llama"})


def test_rows_are_unique_and_the_default_is_a_family():
    assert len(BY_KIND) == len(FAMILIES) and DEFAULT in FAMILIES
    assert all(dataclasses.is_dataclass(f) for f in FAMILIES)


def test_the_readmes_families_table_is_the_registrys():
    """README and --help state each family's frame budget default (issue 22): the README's
    table is generated from the code, so a changed default cannot leave it stale."""
    from pathlib import Path

    from moss_tts.models.registry import families_table

    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text(encoding="utf-8")
    start = readme.index("<!-- families table: families_table() -->\n") + len(
        "<!-- families table: families_table() -->\n")
    assert readme[start:readme.index("<!-- end of families table -->")] == families_table()
