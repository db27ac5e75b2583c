"""Manifest parsing: structural problems stop the run naming the line; content problems stay
on their line."""

import hashlib

import pytest

from moss_tts.batch.manifest import derive_seed, read_manifest
from moss_tts.errors import InputError

from .conftest import write_jsonl


def test_jsonl_and_csv_give_the_same_lines(tmp_path):
    rows = [{"id": "a", "text": "Hello, there.", "seed": 7, "top_k": 10, "greedy": True},
            {"id": "b", "text": "Second.", "voice": "alice", "temperature": 0.5, "model": "m.gguf"}]
    jsonl = read_manifest(write_jsonl(tmp_path / "m.jsonl", rows))
    (tmp_path / "m.csv").write_text('id,text,seed,top_k,greedy,voice,temperature,model\n'
                                    'a,"Hello, there.",7,10,true,,,\n'
                                    'b,Second.,,,,alice,0.5,m.gguf\n')
    csv = read_manifest(tmp_path / "m.csv")
    def fields(lines):
        return [(x.id, x.text, x.seed, x.options, x.voice, x.model, x.error) for x in lines]
    assert fields(jsonl) == fields(csv)
    assert jsonl[0].options == {"greedy": True, "top_k": 10} and jsonl[0].seed == 7
    assert [line.number for line in csv] == [2, 3]          # the file's line numbers


def test_a_missing_seed_is_the_first_31_bits_of_the_ids_sha256(tmp_path):
    lines = read_manifest(write_jsonl(tmp_path / "m.jsonl", [{"id": "chapter-1.0", "text": "x"}]))
    want = int(hashlib.sha256(b"chapter-1.0").hexdigest()[:8], 16) >> 1
    assert lines[0].seed == derive_seed("chapter-1.0") == want
    assert derive_seed("chapter-1.1") != want


@pytest.mark.parametrize("bad_id", ["../x", "a/b", ".hidden", "", "x" * 129, "a..b", "ü", None,
                                    "tab\there"])
def test_an_unsafe_id_stops_the_run_naming_its_line(tmp_path, bad_id):
    rows = [{"id": "ok", "text": "fine"}, {"text": "no id"} if bad_id is None else
            {"id": bad_id, "text": "x"}]
    with pytest.raises(InputError, match=r"m\.jsonl:2: id .* not a safe file name"):
        read_manifest(write_jsonl(tmp_path / "m.jsonl", rows))


@pytest.mark.parametrize("again", ["a", "A"])
def test_a_duplicate_id_stops_the_run_naming_both_lines(tmp_path, again):
    rows = [{"id": "a", "text": "1"}, {"id": "b", "text": "2"}, {"id": again, "text": "3"}]
    with pytest.raises(InputError, match=rf"m\.jsonl:3: id '{again}' repeats line 1"):
        read_manifest(write_jsonl(tmp_path / "m.jsonl", rows))


def test_a_csv_saved_with_a_byte_order_mark_reads_its_header(tmp_path):
    (tmp_path / "m.csv").write_bytes("id,text\na,Hello.\n".encode("utf-8-sig"))
    assert [(line.id, line.text) for line in read_manifest(tmp_path / "m.csv")] == [("a", "Hello.")]


@pytest.mark.parametrize("content, message", [
    ('{"id": "a", "text": "x"}\n{"id": "b", "txt": "typo"}\n', r":2: unknown field\(s\) 'txt'"),
    ('{"id": "a", "text": "x"}\n{"id": "b", \n',
     r':2: not a JSON object .*one object like \{"id": \.\.\., "text": \.\.\.\}$'),
    ('["a", "b"]\n', r":1: expected a JSON object, got list"),
    ('\n\n', r"no lines"),
])
def test_malformed_rows_stop_the_run_naming_the_line(tmp_path, content, message):
    (tmp_path / "m.jsonl").write_text(content)
    with pytest.raises(InputError, match=message):
        read_manifest(tmp_path / "m.jsonl")


def test_content_problems_stay_on_their_line(tmp_path):
    rows = [{"id": "empty", "text": "   "}, {"id": "seed", "text": "x", "seed": "soon"},
            {"id": "k", "text": "x", "top_k": 2.5}, {"id": "g", "text": "x", "greedy": "maybe"},
            {"id": "fine", "text": "x"}]
    lines = {line.id: line for line in read_manifest(write_jsonl(tmp_path / "m.jsonl", rows))}
    assert lines["empty"].error == "text is empty"
    assert lines["seed"].error == "seed must be a whole number, got 'soon'"
    assert lines["k"].error == "top_k must be a whole number, got 2.5"
    assert lines["g"].error == "greedy must be true or false, got 'maybe'"
    assert lines["fine"].error is None


def test_an_unreadable_manifest_is_one_error(tmp_path):
    with pytest.raises(InputError, match="cannot read the manifest"):
        read_manifest(tmp_path / "missing.jsonl")


def test_text_that_is_not_a_string_is_named_so_not_called_empty(tmp_path):
    """issue 22 #9: `"text": 5` said "text is empty"."""
    rows = [{"id": "number", "text": 5}, {"id": "list", "text": ["Hi."]}, {"id": "none"}]
    lines = {x.id: x for x in read_manifest(write_jsonl(tmp_path / "m.jsonl", rows))}
    assert lines["number"].error == "text must be a string, not int (5)"
    assert lines["list"].error == "text must be a string, not list (['Hi.'])"
    assert lines["none"].error == "text is missing"


@pytest.mark.parametrize("seed", [1e30, -1, 2**32, "4294967296"])
def test_a_seed_outside_numpys_range_fails_its_line_with_no_seed_made_up(tmp_path, seed):
    """issue 22 #9: `"seed": 1e30` was accepted; an invalid seed became derive_seed(id)."""
    lines = read_manifest(write_jsonl(tmp_path / "m.jsonl", [{"id": "a", "text": "x",
                                                              "seed": seed}]))
    assert lines[0].error in ("seed must be at least 0, got -1",
                              f"seed must be at most 4294967295, got {float(seed):g}"
                              if isinstance(seed, float) else
                              f"seed must be at most 4294967295, got {int(seed)}")
    assert lines[0].seed is None


def test_the_edges_of_the_seed_range_are_accepted(tmp_path):
    rows = [{"id": "low", "text": "x", "seed": 0}, {"id": "high", "text": "x", "seed": 2**32 - 1}]
    lines = read_manifest(write_jsonl(tmp_path / "m.jsonl", rows))
    assert [(x.seed, x.error) for x in lines] == [(0, None), (2**32 - 1, None)]


def test_an_unparsable_seed_is_not_replaced_by_a_derived_one(tmp_path):
    """issue 22 #9: the record named derive_seed(id) for a line whose seed was "soon"."""
    lines = read_manifest(write_jsonl(tmp_path / "m.jsonl", [{"id": "a", "text": "x",
                                                              "seed": "soon"}]))
    assert lines[0].seed is None and lines[0].error == "seed must be a whole number, got 'soon'"


def test_voice_and_reference_together_fail_the_line_as_the_cli_refuses_them(tmp_path):
    """issue 22 #9: both were accepted (and the voice silently won)."""
    rows = [{"id": "both", "text": "x", "voice": "alice", "reference": "ref.wav"},
            {"id": "voice", "text": "x", "voice": "alice"}]
    lines = read_manifest(write_jsonl(tmp_path / "m.jsonl", rows))
    assert lines[0].error == "give voice or reference, not both" and lines[1].error is None


def test_a_relative_reference_is_the_manifests_neighbour_and_an_absolute_one_stays(
        tmp_path, monkeypatch):
    """issue 22 #9: a relative `reference` was resolved against the working directory."""
    (tmp_path / "corpus").mkdir()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    rows = [{"id": "rel", "text": "x", "reference": "refs/a.wav"},
            {"id": "abs", "text": "x", "reference": "/data/b.wav"}]
    lines = read_manifest(write_jsonl(tmp_path / "corpus" / "m.jsonl", rows))
    assert lines[0].reference == str(tmp_path / "corpus" / "refs" / "a.wav")
    assert lines[1].reference == "/data/b.wav"
