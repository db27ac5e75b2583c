"""`convert ttsd` / `voicegen` / `sfx` (and `delay`) check that the checkpoint is the one named
(converters/naming.py checkpoint_candidates: its config.json, its names, its shape): a plain MOSS-TTS
directory was converted as MOSS-TTSD and its GGUF recorded MOSS-TTSD-v1.0 (issue 31, finding
10). Refused in one line saying what the directory is and the command that converts it.
Test names stay clear of the names a checkpoint goes by: pytest's directories are named after
them, and a directory's names are read."""

import json

import pytest

from fixtures.make_delay import make_tiny_delay_checkpoint, tiny_config
from fixtures.make_nano import make_tiny_nano_tts_checkpoint
from fixtures.make_spm import make_tiny_spm
from moss_tts.cli import main
from moss_tts.models.registry import BY_KIND


def convert_error(capsys, kind, model, out) -> str:
    assert main(["convert", kind, "--model", str(model), "-o", str(out)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1, err
    assert not out.exists()
    return err


def plain(tmp_path, how):
    """A plain MOSS-TTS checkpoint: in a directory of that name, unnamed (the tiny one's 4
    codebooks), or with the real model's 32 codebooks (its config.json: nothing else is read
    before the refusal)."""
    if how == "named":
        return make_tiny_delay_checkpoint(tmp_path / "MOSS-TTS", seed=0)
    if how == "unnamed":
        return make_tiny_delay_checkpoint(tmp_path / "hf", seed=0)
    d = tmp_path / "hf"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(tiny_config(n_vq=32)))
    return d


@pytest.mark.parametrize("kind", ["ttsd", "voicegen", "sfx"])
@pytest.mark.parametrize("how, why", [
    ("named", "by its name"),
    ("unnamed", "4 codebooks, where the other published checkpoints have 16"),
    ("real size", "32 codebooks, where the other published checkpoints have 16"),
])
def test_a_plain_checkpoint_converted_as_a_published_one_is_refused(tmp_path, capsys, kind, how,
                                                                    why):
    model = plain(tmp_path, how)
    err = convert_error(capsys, kind, model, tmp_path / "m.gguf")
    assert err == (f"error: {model} is MOSS-TTS ({why}), not {BY_KIND[kind].checkpoint}: "
                   "convert it with `python -m moss_tts convert delay`\n")


def test_the_plain_checkpoint_converts_as_what_it_is(tmp_path, capsys):
    from moss_tts.ggml import GGUFFile

    model, out = plain(tmp_path, "unnamed"), tmp_path / "m.gguf"
    assert main(["convert", "delay", "--model", str(model), "-o", str(out), "--quiet"]) == 0
    with GGUFFile(out) as f:
        assert f.get("moss.checkpoint") == "MOSS-TTS"


def test_another_architecture_converted_as_a_delay_checkpoint_names_its_own(tmp_path, capsys):
    model = make_tiny_nano_tts_checkpoint(tmp_path / "hf", seed=0,
                                          tokenizer_model_bytes=make_tiny_spm())
    for kind in ("ttsd", "delay"):
        err = convert_error(capsys, kind, model, tmp_path / "m.gguf")
        assert err == (f"error: {model} is MOSS-TTS-Nano (its config.json's model_type "
                       f"'moss_tts_nano'), not {BY_KIND[kind].checkpoint}: convert it with "
                       "`python -m moss_tts convert nano`\n")
