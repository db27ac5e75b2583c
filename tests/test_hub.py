"""A model argument given as a checkpoint directory or a Hugging Face repo id is converted by
the family its config.json names (P26: V2 says moss_tts_delay too), into the cache, once —
through huggingface_hub's own offline cache here (no network in tests)."""

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
import soundfile as sf

from converters.delay import convert as convert_delay
from moss_tts.models.registry import family_of_config
from fixtures.make_delay import make_tiny_delay_checkpoint
from moss_tts.errors import ConfigError

ROWS = 16


@pytest.fixture(scope="module")
def files(tmp_path_factory, tiny_codec):
    d = tmp_path_factory.mktemp("hub")
    delay = make_tiny_delay_checkpoint(d / "delay", seed=0, gen_bias=4.0)
    codec = tiny_codec()
    return d, delay, codec.parent / "hf", codec    # the checkpoint beside its GGUF


def put_in_hf_cache(hf_home, repo_id: str, checkpoint) -> None:
    """The layout huggingface_hub reads offline: refs/main → a snapshot folder of files."""
    repo = hf_home / "hub" / f"models--{repo_id.replace('/', '--')}"
    commit = "0" * 40
    shutil.copytree(checkpoint, repo / "snapshots" / commit)
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(commit)


def cli(*args, env):
    return subprocess.run([sys.executable, "-m", "moss_tts", *map(str, args)],
                          capture_output=True, text=True, env={**os.environ, **env})


@pytest.mark.parametrize("config, family", [
    ({"model_type": "moss_tts_nano"}, "nano"),
    ({"model_type": "moss_tts_delay", "language_config": {}}, "delay"),
    ({"model_type": "speech_tokenizer", "encoder_kwargs": []}, "codec"),
    ({"model_type": "moss-audio-tokenizer"}, "codec"),
    ({"model_type": "moss_tts_delay", "local_num_layers": 4}, "local"),          # P26
    ({"model_type": "moss_tts_delay", "gpt2_config": {}}, "local-v15"),
    ({"model_type": "moss_tts_local"}, "local-v15"),
    ({"model_type": "moss_tts_realtime"}, "realtime"),
])
def test_the_family_comes_from_config_json(config, family):
    assert family_of_config(config).kind == family


@pytest.mark.parametrize("config", [{"model_type": "llama"}, {}])
def test_a_config_of_no_known_family_is_refused_by_name(config):
    with pytest.raises(ConfigError, match="matches no family this version converts"):
        family_of_config(config)


def test_a_delay_checkpoint_dir_and_repo_id_convert_as_delay_at_q6_k(files, tmp_path):
    d, delay, _, codec = files
    hf = tmp_path / "hf"
    put_in_hf_cache(hf, "Someone/tiny-moss-tts", delay)
    env = {"MOSS_TTS_CACHE": str(tmp_path / "cache"), "HF_HOME": str(hf), "HF_HUB_OFFLINE": "1"}
    want_gguf = convert_delay(str(delay), tmp_path / "want.gguf", outtype="q6_K")
    args = ("--codec", codec, "--text", "Hello there.", "--greedy", "--max-new-rows", ROWS)
    outs = {}
    for name, model in (("file", want_gguf), ("dir", delay), ("repo", "Someone/tiny-moss-tts")):
        outs[name] = tmp_path / f"{name}.wav"
        r = cli("tts", "--model", model, *args, "-o", outs[name], env=env)
        assert r.returncode == 0, r.stderr
    made = sorted(p.name for p in (tmp_path / "cache" / "gguf").iterdir())
    assert made == ["Someone--tiny-moss-tts-q6_K.gguf", "delay-delay-q6_K.gguf"]
    want = sf.read(outs["file"])[0]
    assert want.size and all(np.array_equal(sf.read(outs[k])[0], want) for k in ("dir", "repo"))
    # the second run finds the conversion in the cache, even with the hub cache gone
    shutil.rmtree(hf)
    r = cli("tts", "--model", "Someone/tiny-moss-tts", *args, "-o", tmp_path / "again.wav", env=env)
    assert r.returncode == 0, r.stderr
    assert np.array_equal(sf.read(tmp_path / "again.wav")[0], want)


def test_a_codec_given_as_the_model_says_to_pass_it_as_codec(files, tmp_path):
    _, _, codec_dir, codec = files
    r = cli("tts", "--model", codec_dir, "--codec", codec, "--text", "Hi.", "-o", tmp_path / "x.wav",
            env={"MOSS_TTS_CACHE": str(tmp_path / "cache")})
    assert r.returncode != 0 and "audio codec checkpoint" in r.stderr and "--codec" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def test_an_unknown_config_names_the_families(files, tmp_path):
    _, delay, _, codec = files
    odd = tmp_path / "odd"
    shutil.copytree(delay, odd)
    (odd / "config.json").write_text(json.dumps({"model_type": "llama"}))
    r = cli("tts", "--model", odd, "--codec", codec, "--text", "Hi.", "-o", tmp_path / "x.wav",
            env={"MOSS_TTS_CACHE": str(tmp_path / "cache")})
    assert r.returncode != 0 and "model_type 'llama'" in r.stderr and "delay" in r.stderr
