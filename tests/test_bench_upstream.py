"""The upstream PyTorch peers' pure pieces (no torch here: the peers run in another venv): where
the upstream files are found and copied, the checkpoint names handed to upstream's Nano TTS, the
waveform layout between ours and upstream's codec, the parity math, and the report lines that
put upstream beside ours."""

import math
import subprocess
from pathlib import Path

import numpy as np
import pytest

from bench import codec48k, nano, parity
from bench.harness import NANO_CODEC, NANO_TTS, upstream_file
from bench.upstream_codec import from_upstream_audio, to_upstream_audio
from bench.upstream_nano import cpu_config, split_ignored
from bench.upstream_torch import copy_upstream
from fixtures.make_nano import expected_tensor_names, tiny_nano_tts_config


# --- parity math ------------------------------------------------------------------------------


def test_codes_agreement_counts_per_codebook_and_names_the_first_that_differs():
    ref = np.arange(24).reshape(4, 6)
    ours = ref.copy()
    ours[2, 1] += 1
    ours[3, :3] += 1
    a = parity.codes_agreement(ours, ref)
    assert a["per_codebook"] == [1.0, 1.0, 5 / 6, 0.5]
    assert a["equal"] == pytest.approx(20 / 24) and a["first_diff_codebook"] == 2
    assert parity.codes_agreement(ref, ref)["first_diff_codebook"] is None
    with pytest.raises(ValueError, match=r"codes shape \(4, 5\) vs upstream \(4, 6\)"):
        parity.codes_agreement(ref[:, :5], ref)


def test_rel_diff_is_relative_to_upstreams_rms_over_the_common_length():
    ref = np.array([3.0, -4.0, 0.0, 5.0], np.float32)          # RMS = sqrt(50 / 4)
    ours = np.array([3.0, -4.5, 0.25], np.float32)               # one value short
    r = parity.rel_diff(ours, ref)
    rms = math.sqrt(25 / 3)                                       # over the 3 common values
    assert r["ref_rms"] == pytest.approx(rms)
    assert r["max_rel"] == pytest.approx(0.5 / rms)
    assert r["rms_rel"] == pytest.approx(math.sqrt((0.25 + 0.0625) / 3) / rms)
    assert r["n"] == 3 and r["same_length"] is False
    stereo = np.stack([ref, -ref], axis=1)                        # [n, 2] compares element-wise
    assert parity.rel_diff(stereo, stereo)["max_rel"] == 0.0
    with pytest.raises(ValueError, match="all zeros"):
        parity.rel_diff(ref, np.zeros(4))


def test_codec_parity_lines_compare_this_runs_saved_outputs(tmp_path):
    rng = np.random.default_rng(0)
    codes = rng.integers(0, 1024, (16, 10))
    ours = codes.copy()
    ours[5, 3] = (ours[5, 3] + 1) % 1024
    np.save(tmp_path / "nano_codes_upstream.npy", codes)
    np.save(tmp_path / "nano_codes_ggml_f32.npy", ours)
    np.save(tmp_path / "nano_codes_ggml_f16.npy", codes)
    audio = rng.standard_normal((50, 2)).astype(np.float32)
    np.save(tmp_path / "nano_audio_upstream.npy", audio)
    np.save(tmp_path / "nano_audio_ggml_f32.npy", audio + 1e-3)
    np.save(tmp_path / "codes_upstream.npy", codes)               # another variant's: not read
    lines = parity.codec_parity_lines(tmp_path, ["f32", "f16", "q8_0"], prefix="nano_",
                                      decode_input="codes16.npy")
    assert len(lines) == 3                                        # q8_0 saved nothing
    assert "codes ggml f32" in lines[0] and "all 16: 99.4 %" in lines[0]
    assert "first difference at codebook 5" in lines[0]
    assert "all 16: 100.0 %" in lines[1] and "first difference" not in lines[1]
    rms = float(np.sqrt(np.mean(audio.astype(np.float64) ** 2)))
    assert lines[2].startswith("- decode ggml f32 (random codes16.npy) vs upstream: max|Δ|/RMS "
                               f"{1e-3 / rms:.2e}")
    assert parity.codec_parity_lines(tmp_path, ["f32"], prefix="v2_") == []


# --- what the codec peer feeds upstream ----------------------------------------------------------


def test_stereo_reaches_upstream_as_channels_by_samples_and_comes_back():
    n = 7
    ours = np.stack([np.arange(n), -np.arange(n) - 100], axis=1).astype(np.float32)   # [n, 2]
    up = to_upstream_audio(ours)
    assert up.shape == (1, 2, n)
    assert up[0, 0].tolist() == list(range(n)) and up[0, 1, 0] == -100
    assert from_upstream_audio(up[0]).tolist() == ours.tolist()
    mono = np.linspace(-1, 1, n, dtype=np.float32)
    assert to_upstream_audio(mono).shape == (1, 1, n)
    assert from_upstream_audio(to_upstream_audio(mono)[0]).tolist() == mono.tolist()
    with pytest.raises(SystemExit, match=r"\[n\] or \[n, channels\]"):
        to_upstream_audio(np.zeros((1, 2, 3)))


# --- where the upstream files come from -----------------------------------------------------------


def _mirror(tmp_path):
    """A bare-style mirror bundling both Nano models in subfolders (files only in git HEAD)."""
    repo = tmp_path / "mirror"
    files = {"models/codec/hf_code/config.json": '{"codec": 1}',
             "models/llm/repo/config.json": '{"tts": 1}',
             "models/llm/repo/gpt2_decoder.py": "X = 1\n"}
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t"]
    repo.mkdir()
    subprocess.run(git[:3] + ["init", "-q"], check=True)
    for rel, text in files.items():
        (repo / rel).parent.mkdir(parents=True, exist_ok=True)
        (repo / rel).write_text(text)
    subprocess.run(git + ["add", "."], check=True)
    subprocess.run(git + ["commit", "-q", "-m", "c"], check=True)
    for rel in files:
        (repo / rel).unlink()
    return repo


def test_each_nano_model_reads_its_own_folder_of_a_bundling_mirror(tmp_path):
    repo = _mirror(tmp_path)
    assert upstream_file(repo, "config.json", NANO_CODEC) == '{"codec": 1}'
    assert upstream_file(repo, "config.json", NANO_TTS) == '{"tts": 1}'
    top = tmp_path / "own_repo"            # a model's own repository: the files at the top
    top.mkdir()
    (top / "config.json").write_text('{"own": 1}')
    assert upstream_file(top, "config.json", NANO_CODEC) == '{"own": 1}'
    with pytest.raises(SystemExit, match="no gpt2_decoder.py.*MOSS-Audio-Tokenizer-Nano"):
        upstream_file(repo, "gpt2_decoder.py", NANO_CODEC)


def test_copy_upstream_makes_a_package_and_reuses_it_without_a_source(tmp_path, monkeypatch):
    repo = _mirror(tmp_path)
    dest = tmp_path / "results" / "upstream_nano"
    monkeypatch.delenv(NANO_TTS.env, raising=False)
    commit = copy_upstream(dest, ("gpt2_decoder.py",), NANO_TTS, str(repo))
    assert len(commit) == 40
    assert (dest / "gpt2_decoder.py").read_text() == "X = 1\n" and (dest / "__init__.py").exists()
    assert copy_upstream(dest, ("gpt2_decoder.py",), NANO_TTS, None) == "?"   # earlier copy
    with pytest.raises(SystemExit, match=f"set {NANO_TTS.env}=DIR"):
        copy_upstream(dest, ("configuration_moss_tts_nano.py",), NANO_TTS, None)


# --- what the TTS peer hands upstream ---------------------------------------------------------------


def test_upstream_tts_gets_every_checkpoint_tensor_but_the_stale_local_wte():
    cfg = tiny_nano_tts_config(n_vq=4)
    names = expected_tensor_names(cfg)            # what bench/nano.py's checkpoint holds
    # upstream's MossTTSNanoForCausalLM._keys_to_ignore_on_load_unexpected
    keep, ignored = split_ignored(names, [r"local_transformer\.wte\.weight"])
    assert ignored == ["local_transformer.wte.weight"]
    assert keep == expected_tensor_names(cfg, stale_local_wte=False)
    assert split_ignored(names, []) == (sorted(names), [])


def test_upstream_tts_runs_sdpa_on_cpu_and_keeps_the_rest_of_the_config():
    cfg = tiny_nano_tts_config()
    assert cfg["attn_implementation"] == "flash_attention_2"
    out = cpu_config(cfg)
    assert out["attn_implementation"] == out["local_transformer_attn_implementation"] == "sdpa"
    assert {k: v for k, v in out.items() if "attn" not in k} == \
        {k: v for k, v in cfg.items() if "attn" not in k}
    assert cfg["attn_implementation"] == "flash_attention_2"      # the input is left alone


# --- reports: upstream beside ours ------------------------------------------------------------------


def _timing(ms_runs, **kw):
    s = sorted(ms_runs)
    return {"warm_s": [x / 1e3 for x in ms_runs], "median_s": s[len(s) // 2] / 1e3,
            "cold_s": 1.0, "foreign": 0.0, "peak_rss_gb": 0.5, "torch": "2.x",
            "threads": 2, "load_s": 1.0, "upstream_commit": "abc", **kw}


def test_nano_report_puts_upstreams_prefill_beside_ours(tmp_path, monkeypatch):
    monkeypatch.setattr(nano, "WORK", tmp_path)
    hidden = np.linspace(-1.0, 1.0, 768).astype(np.float32)
    np.save(tmp_path / "prefill_hidden_upstream.npy", hidden)
    np.save(tmp_path / "prefill_hidden_ggml_f32.npy", hidden + 2e-3)
    up = _timing([160.0, 150.0, 170.0, 155.0, 165.0], ms=160.0, attention="sdpa",
                 weight_gb=0.47, ignored=["local_transformer.wte.weight"])
    res = {nano.UPSTREAM_KEY: up,
           ("f32", "prefill"): {"ms": 80.0, "runs_ms": [80.0], "cold_ms": 500.0,
                                "peak_rss_gb": 0.6, "foreign": 0.0, "gflop": {"total": 16.0}}}
    driver = type("D", (), {"peak": {"peak": 400.0}})()
    text = "\n".join(nano.upstream_lines(["f32", "q8_0"], res, driver))
    assert "2.00x" in text and "160.0" in text and "80.0" in text
    # our graphs' 16 GFLOP over each side's time, against the 400 GFLOP/s peak
    assert "200 (50 %)" in text and "100 (25 %)" in text
    rms = float(np.sqrt(np.mean(hidden.astype(np.float64) ** 2)))
    assert f"ggml f32 vs upstream: max|Δ|/RMS {2e-3 / rms:.2e}" in text
    assert "ggml q8_0" not in text                    # no prefill result, no row
    assert nano.upstream_lines(["f32"], {}) == []     # without --upstream: nothing


def test_codec48k_report_puts_upstreams_encode_and_decode_beside_ours(tmp_path, monkeypatch):
    monkeypatch.setattr(codec48k, "WORK", tmp_path)
    res = {("nano", "upstream", "encode"): _timing([1800.0]),
           ("nano", "upstream", "decode"): _timing([1500.0]),
           ("nano", "f32", "encode"): {"median_s": 0.6}, ("nano", "f32", "decode"): {"median_s": 0.5}}
    codes = np.ones((16, 4), np.int32)
    np.save(tmp_path / "nano_codes_upstream.npy", codes)
    np.save(tmp_path / "nano_codes_ggml_f32.npy", codes)
    text = "\n".join(codec48k.upstream_lines(["f32"], res))
    assert "upstream s ÷ ours): encode 3.00x, decode 3.00x" in text
    assert "all 16: 100.0 %" in text
    assert codec48k.upstream_lines(["f32"], {}) == []


def test_nano_report_renders_whole_with_the_upstream_prefill(tmp_path, monkeypatch):
    """render walks every result (perf, profile): the upstream entry must not trip it."""
    from types import SimpleNamespace

    from bench.harness import Driver

    monkeypatch.setattr(nano, "WORK", tmp_path)
    up = _timing([160.0] * 5, ms=160.0, attention="sdpa", weight_gb=0.47, ignored=[])
    prefill = {"ms": 80.0, "runs_ms": [80.0], "cold_ms": 500.0, "peak_rss_gb": 0.6, "foreign": 0.0,
               "compute_ms": 75.0, "build_ms": 2.0, "alloc_ms": 0.2, "matmuls_ms": 60.0,
               "matmul_gflop": 17.0, "matmul_gflops": 280.0}
    args = SimpleNamespace(threads=2, frames=120, warmup=10, runs=5)
    d = Driver(args, tmp_path / "log.txt", script=Path(nano.__file__))
    text = nano.render(args, ["f32"], {("f32", "prefill"): prefill, nano.UPSTREAM_KEY: up}, {}, d, 1.0)
    assert "against upstream PyTorch f32" in text and "2.00x" in text and "CPU: " in text


def test_delay_upstream_takes_only_the_named_functions_of_an_app():
    """bench/delay_upstream.py runs the TTSD app's dialogue functions without importing the app
    (gradio, torchaudio at its top): the named functions, with `re`, and nothing else."""
    from bench.delay_upstream import functions_of

    src = ("import gradio\nX = 1\n\ndef a(t):\n    return re.sub('x', 'y', t)\n\n"
           "def b():\n    return X\n")
    ns = functions_of(src, ("a",))
    assert ns["a"]("xx") == "yy" and "b" not in ns and "gradio" not in ns
    with pytest.raises(SystemExit, match="lacks"):
        functions_of(src, ("a", "c"))
