"""Which published MossTTSDelay checkpoint a directory is (converters/naming.py
family_of_checkpoint): by its names (config.json's `_name_or_path`, its model card's title, the
repo id or directory it came from, nearest first), else by its shape; the converter records the name in the GGUF, the
loaders pick the class from it, and a checkpoint converted as another is refused."""

import json

import pytest

from converters.delay import convert
from fixtures.make_delay import (PUBLISHED, make_tiny_delay_checkpoint,
                                 make_tiny_published_checkpoint, tiny_config)
from moss_tts.errors import ConfigError, ModelFileError
from moss_tts.ggml import GGUFFile
from converters.naming import family_of_checkpoint
from converters.registry import convert as convert_as
from moss_tts.models.registry import BY_KIND, CHECKPOINT_KEY, family_of_model


def config_only(d, **overrides):
    """A directory holding only a config.json (all that recognition reads besides a README)."""
    d.mkdir(parents=True, exist_ok=True)
    (d / "config.json").write_text(json.dumps(tiny_config(**overrides)))
    return d


@pytest.mark.parametrize("kind", sorted(PUBLISHED))
def test_each_published_checkpoint_converts_to_a_gguf_that_names_it(tmp_path, kind):
    ckpt = make_tiny_published_checkpoint(kind, tmp_path, seed=0)
    assert family_of_checkpoint(ckpt) is BY_KIND[kind]
    gguf = convert(str(ckpt), tmp_path / "m.gguf", strict=True)
    with GGUFFile(gguf) as f:
        assert f.get(CHECKPOINT_KEY) == PUBLISHED[kind][0]
        assert f.get("moss.kind") == "delay"          # the same runtime loads it
    assert family_of_model(gguf) is BY_KIND[kind]


def test_moss_tts_is_the_base_and_an_old_gguf_without_the_name_is_moss_tts(tmp_path,
                                                                          delay_files):
    ckpt = make_tiny_delay_checkpoint(tmp_path / "MOSS-TTS-v1.5", seed=0)
    assert family_of_checkpoint(ckpt) is BY_KIND["delay"]
    with GGUFFile(convert(str(ckpt), tmp_path / "m.gguf")) as f:
        assert f.get(CHECKPOINT_KEY) == "MOSS-TTS"
    assert family_of_model(delay_files()[3]) is BY_KIND["delay"]


@pytest.mark.parametrize("names, want", [
    ({"_name_or_path": "OpenMOSS-Team/MOSS-TTSD-v1.0"}, "ttsd"),
    ({"_name_or_path": "/ckpt/moss_sound_effect_v1"}, "sfx"),
    ({"_name_or_path": "OpenMOSS-Team/MOSS-VoiceGenerator"}, "voicegen"),
])
def test_config_name_or_path_names_the_checkpoint(tmp_path, names, want):
    assert family_of_checkpoint(config_only(tmp_path / "x", **names)) is BY_KIND[want]


def test_a_hugging_face_cache_directory_is_named_by_its_repo(tmp_path):
    snap = config_only(tmp_path / "models--OpenMOSS-Team--MOSS-SoundEffect" / "snapshots" / "ab12")
    assert family_of_checkpoint(snap) is BY_KIND["sfx"]
    # the repo id a front end was given names it too
    assert family_of_checkpoint(config_only(tmp_path / "y"),
                                source="OpenMOSS-Team/MOSS-TTSD-v1.0") is BY_KIND["ttsd"]


def test_the_nearest_name_wins_so_a_folder_above_names_nothing(tmp_path):
    ckpt = config_only(tmp_path / "sfx-experiments" / "MOSS-TTS-v1.5")
    assert family_of_checkpoint(ckpt) is BY_KIND["delay"]


def test_the_model_card_title_names_it_but_its_body_does_not(tmp_path):
    d = config_only(tmp_path / "a")
    (d / "README.md").write_text("---\nlicense: apache-2.0\n---\n# MOSS-TTS\n\n"
                                 "Siblings: MOSS-TTSD, MOSS-SoundEffect.\n")
    assert family_of_checkpoint(d) is BY_KIND["delay"]
    (d / "README.md").write_text("# MOSS-SoundEffect\n")
    assert family_of_checkpoint(d) is BY_KIND["sfx"]


def test_an_unnamed_checkpoint_is_told_by_its_shape_or_the_error_says_how_to_name_it(tmp_path):
    # upstream's VoiceGenerator: 16 codebooks on a 2048-wide (1.7B) backbone
    lc = dict(tiny_config()["language_config"], hidden_size=2048)
    assert family_of_checkpoint(config_only(tmp_path / "v", n_vq=16, language_config=lc)) \
        is BY_KIND["voicegen"]
    lc8b = dict(lc, hidden_size=4096)
    with pytest.raises(ConfigError) as e:
        family_of_checkpoint(config_only(tmp_path / "t", n_vq=16, language_config=lc8b))
    assert "MOSS-TTSD or MOSS-SoundEffect" in str(e.value) and "convert ttsd" in str(e.value)
    assert "\n" not in str(e.value)


def test_converting_a_named_checkpoint_as_another_is_refused(tmp_path):
    ttsd = make_tiny_published_checkpoint("ttsd", tmp_path, seed=0)
    with pytest.raises(ConfigError, match=r"is MOSS-TTSD-v1.0 \(named 'MOSS-TTSD'\), not "
                                          r"MOSS-TTS: convert it with `python -m moss_tts "
                                          r"convert ttsd`$"):
        convert_as(BY_KIND["delay"], str(ttsd), tmp_path / "wrong.gguf")
    assert not (tmp_path / "wrong.gguf").exists()


def test_the_command_names_an_unnamed_16_codebook_8b_checkpoint(tmp_path):
    """16 codebooks at 8B is MOSS-TTSD or MOSS-SoundEffect: `convert ttsd` or `convert sfx`
    says which; `convert delay` or `voicegen` is refused."""
    from converters.delay import checkpoint_of

    lc = dict(tiny_config()["language_config"], hidden_size=4096)
    d = config_only(tmp_path / "u", n_vq=16, language_config=lc)
    for kind in ("ttsd", "sfx"):
        assert checkpoint_of(d, BY_KIND[kind]) is BY_KIND[kind]
    for kind in ("delay", "voicegen"):
        with pytest.raises(ConfigError, match=r"is MOSS-TTSD-v1.0 or MOSS-SoundEffect \(16 "
                                              r"codebooks at width 4096\), not .*: convert it "
                                              r"with `python -m moss_tts convert ttsd` \(or "
                                              r"`sfx`\)$"):
            checkpoint_of(d, BY_KIND[kind])


def test_a_class_refuses_the_gguf_of_another_checkpoint_naming_the_one_that_fits(
        published_files, delay_files):
    from moss_tts.models.delay_tasks import DialogueTTS
    from moss_tts.models.delay_tts import DelayTTS

    with pytest.raises(ModelFileError, match=r"a MOSS-TTSD-v1.0 GGUF, not MOSS-TTS \(Delay\): "
                                             r"load it with load_tts\(\) \(or DialogueTTS.load\)"):
        DelayTTS.load(published_files("ttsd")[2])
    with pytest.raises(ModelFileError, match="a MOSS-TTS GGUF"):
        DialogueTTS.load(delay_files()[3])
