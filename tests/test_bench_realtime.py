"""bench/realtime.py's real-dimension peer describes the model the bench times for ours: the
config.json it hands upstream parses (through our converter's reader) to the same shapes."""

from bench.realtime import REAL, REAL_LOCAL, config, real_config_json
from converters.realtime import realtime_config


def test_the_peers_real_config_is_the_benched_model():
    parsed = realtime_config(real_config_json())
    ours = config(tiny=False)
    assert parsed.language_config == REAL and parsed.local_config == REAL_LOCAL
    assert (parsed.vocab_size, parsed.rvq, parsed.audio_vocab_size, parsed.audio_pad_token) == \
        (ours.vocab_size, ours.rvq, ours.audio_vocab_size, ours.audio_pad_token) == \
        (151936, 16, 1027, 1024)
