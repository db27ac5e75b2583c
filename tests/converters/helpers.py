"""Helpers shared by the converter tests."""

import shutil

from safetensors.numpy import save_file

from fixtures.make_codec import load_state


def edited_checkpoint(src, dst, edit):
    """A single-file copy of checkpoint `src` whose state dict went through `edit(state)`."""
    dst.mkdir(parents=True)
    shutil.copy(src / "config.json", dst / "config.json")
    state = dict(load_state(src))
    edit(state)
    save_file(state, str(dst / "model.safetensors"))
    return dst


def one_line(excinfo):
    msg = str(excinfo.value)
    assert msg and "\n" not in msg, msg
    return msg
