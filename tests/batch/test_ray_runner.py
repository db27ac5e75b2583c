"""The same manifest on a real Ray cluster started here on loopback, with one actor killed
mid-job: the dead actor is replaced, its unfinished lines re-run, each line is recorded once,
and the audio equals the local run's."""

import pytest

from moss_tts.batch import run_batch
from moss_tts.batch.ray_runner import NAMESPACE

from .conftest import no_partials, outputs, records, speech_rows, write_jsonl

ray = pytest.importorskip("ray", reason="Ray is not installed (pip install -e \".[batch]\")")


def test_a_killed_actor_is_replaced_and_the_outputs_equal_the_local_run(batch_models, tmp_path):
    manifest = write_jsonl(tmp_path / "m.jsonl", speech_rows(12, max_frames=40))
    kw = {"model": str(batch_models["nano0"]), "codec": str(batch_models["codec"]), "threads": 1}
    local = tmp_path / "local"
    run_batch(manifest, local, workers=1, **kw)
    killed = []

    def kill_an_actor(done, total, audio, elapsed):
        if not killed:      # after the first line: both actors are mid-chunk
            ray.kill(ray.get_actor("worker-1", namespace=NAMESPACE))
            killed.append(done)

    out = tmp_path / "ray"
    summary = run_batch(manifest, out, ray="local", workers=2, chunk=4, progress=kill_an_actor, **kw)
    assert killed and killed[0] < 12
    assert summary.replaced_workers == 1 and summary.made == 12 and not summary.failed
    recs = records(out)
    assert sorted(r["id"] for r in recs) == [f"line{i:03d}" for i in range(12)]  # once each
    assert sum(r["attempts"] for r in recs) > 12          # the killed actor's unfinished lines
    assert outputs(out) == outputs(local) and no_partials(out)                   # same audio


def test_ray_auto_without_a_running_cluster_is_one_error(batch_models, tmp_path, monkeypatch):
    from moss_tts.errors import InputError

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    manifest = write_jsonl(tmp_path / "m.jsonl", speech_rows(1))
    with pytest.raises(InputError, match=r"--ray auto: no Ray cluster there .*--ray local"):
        run_batch(manifest, tmp_path / "out", model=str(batch_models["nano0"]),
                  codec=str(batch_models["codec"]), ray="auto")
    assert records(tmp_path / "out") == []        # nothing ran, nothing recorded
