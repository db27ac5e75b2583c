"""`synthesize_many` says which request a warning or an error is about (issue 31, finding 10):
`requests[i]: ...`, as its own check of the requests' form does; with an `around` hook the
caller attributes warnings itself (batch/work.py), so they are left as `synthesize` words
them. On the tiny Nano model that never stops."""

import contextlib

import pytest

from moss_tts.errors import BudgetWarning, InputError

from .test_nano_tts import NEVER_STOPS


def budget_warnings(seen) -> list[str]:
    return sorted(str(w.message) for w in seen if issubclass(w.category, BudgetWarning))


def test_each_requests_budget_warning_is_led_by_its_index(nano_tts):
    tts = nano_tts(*NEVER_STOPS)
    requests = [{"text": "Hi.", "seed": 1, "max_frames": 6},
                {"text": "Hello there.", "seed": 2, "max_frames": 7}]
    with pytest.warns(BudgetWarning) as seen:
        tts.synthesize_many(requests)
    got = budget_warnings(seen)
    assert [w.split(": ", 1)[0] for w in got] == ["requests[0]", "requests[1]"]
    assert "(6 frames" in got[0] and "(7 frames" in got[1]
    # with `around` the caller tells them apart: the words are synthesize's own
    with pytest.warns(BudgetWarning) as seen:
        tts.synthesize_many(requests, around=lambda i: contextlib.nullcontext())
    with pytest.warns(BudgetWarning) as alone:
        tts.synthesize(**requests[0])
    assert budget_warnings(alone)[0] in budget_warnings(seen)
    assert not any(w.startswith("requests[") for w in budget_warnings(seen))


def test_an_error_is_led_by_the_index_of_the_request_that_raised_it(nano_tts):
    tts = nano_tts(*NEVER_STOPS)
    with pytest.raises(InputError, match=r"^requests\[1\]: seed must be at least 0, got -1$"):
        tts.synthesize_many([{"text": "Hi.", "seed": 1, "max_frames": 6},
                             {"text": "Hi.", "seed": -1, "max_frames": 6}])
    with pytest.raises(InputError, match=r"^requests\[0\]: text is empty"):
        tts.synthesize_many([{"text": "   ", "seed": 1}, {"text": "Hi.", "seed": 1}])
