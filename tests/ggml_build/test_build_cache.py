"""ggml_build.build's cache locking: a build of one key (a long CUDA compile) must not hold up
an install that needs another key's cached build, and two builds of one key still run once."""

import importlib
import json
import threading
from types import SimpleNamespace

import pytest

# the module (the package's `build` is its function of that name)
build_mod = importlib.import_module("ggml_build.build")

GUARD = 60      # seconds a waited-for event may take: only a broken lock gets there


@pytest.fixture
def fake_builds(tmp_path, monkeypatch):
    """build() over a cache in tmp_path with everything but the locking stubbed: the key is
    the calling thread's `key`; a build of "slow" waits for `release`; `built` lists each
    real build's key."""
    state = SimpleNamespace(local=threading.local(), built=[], started=threading.Event(),
                            release=threading.Event())

    def fake_build(plan, cmake, dest):
        if plan.key == "slow":
            state.started.set()
            assert state.release.wait(GUARD), "the test never released the slow build"
        dest.mkdir(parents=True)
        (dest / "libggml.so").write_bytes(b"")
        (dest / build_mod.MANIFEST).write_text(json.dumps({"libraries": ["libggml.so"]}))
        state.built.append(plan.key)

    monkeypatch.setattr(build_mod, "cache_dir", lambda: tmp_path)
    monkeypatch.setattr(build_mod, "find_cmake", lambda: "cmake")
    monkeypatch.setattr(build_mod, "find_compilers", lambda: {})
    monkeypatch.setattr(build_mod, "cmake_flags", lambda: ({}, []))
    monkeypatch.setattr(build_mod, "obtain_source", lambda: None)
    monkeypatch.setattr(build_mod, "_plan", lambda *a: SimpleNamespace(key=state.local.key,
                                                                       version="test"))
    monkeypatch.setattr(build_mod, "_build", fake_build)
    monkeypatch.setattr(build_mod, "install", lambda built, manifest, target: None)

    def run(key, done=None):
        state.local.key = key
        build_mod.build(tmp_path / "target")
        if done is not None:
            done.set()
    state.run = run
    return state


def test_a_build_of_another_key_does_not_wait_for_one_in_progress(fake_builds):
    slow = threading.Thread(target=fake_builds.run, args=("slow",))
    slow.start()
    try:
        assert fake_builds.started.wait(GUARD)
        fast_done = threading.Event()
        threading.Thread(target=fake_builds.run, args=("fast", fast_done), daemon=True).start()
        assert fast_done.wait(GUARD), "the other key's build waited for the slow one"
        assert fake_builds.built == ["fast"]
    finally:
        fake_builds.release.set()
        slow.join(GUARD)
    assert fake_builds.built == ["fast", "slow"]


def test_two_builds_of_one_key_compile_it_once(fake_builds):
    first = threading.Thread(target=fake_builds.run, args=("slow",))
    first.start()
    assert fake_builds.started.wait(GUARD)
    second_done = threading.Event()
    second = threading.Thread(target=fake_builds.run, args=("slow", second_done))
    second.start()
    fake_builds.release.set()
    first.join(GUARD)
    second.join(GUARD)
    assert second_done.is_set() and fake_builds.built == ["slow"]   # the second reused it
