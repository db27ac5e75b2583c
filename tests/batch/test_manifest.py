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
    assert lines["seed"].error == "seed 'soon' is not a valid int"
    assert lines["k"].error == "top_k 2.5 is not a valid int"
    assert lines["g"].error == "greedy 'maybe' is not a valid bool"
    assert lines["fine"].error is None


def test_an_unreadable_manifest_is_one_error(tmp_path):
    with pytest.raises(InputError, match="cannot read the manifest"):
        read_manifest(tmp_path / "missing.jsonl")
