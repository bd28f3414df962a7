"""kit.yamlfile: only a regular file is read, and YAML a user wrote is refused with its line, never a traceback."""

from __future__ import annotations

import os

import pytest
import yaml

from kit.errors import InputError
from kit.yamlfile import read_yaml


def _read(path):
    return read_yaml(path, what="spec file", fix="fix it")


@pytest.mark.timeout(10)  # the old reader waited for a FIFO's writer forever
def test_a_fifo_or_a_directory_is_refused_before_it_is_read(tmp_path):
    os.mkfifo(tmp_path / "fifo.yaml")
    (tmp_path / "dir.yaml").mkdir()
    for name, kind in (("fifo.yaml", "a FIFO (named pipe)"), ("dir.yaml", "a directory")):
        with pytest.raises(InputError) as info:
            _read(tmp_path / name)
        assert info.value.what == f"spec file is {kind}, not a regular file"
        assert info.value.where == str(tmp_path / name) and info.value.exit_code == 2


def test_a_name_too_long_is_an_input_error(tmp_path):
    with pytest.raises(InputError, match="File name too long") as info:
        _read(tmp_path / ("a" * 300 + ".yaml"))
    assert "a" * 300 in info.value.render()


@pytest.mark.parametrize("text, line, what", [
    ("name: x\n? [a, b]\n: 1\n", 2, "a key must be a scalar"),
    ("name: x\n? {a: 1}\n: 2\n", 2, "a key must be a scalar"),
    ("name: x\nnodes: " + "9" * 5000 + "\n", 2, "4300 digits"),
    ("name: x\nwhen: 2025-13-45\n", 2, "month must be in 1..12"),
])
def test_a_key_or_value_python_cannot_hold_is_refused_with_its_line(tmp_path, text, line, what):
    path = tmp_path / "s.yaml"
    path.write_text(text)
    with pytest.raises(InputError, match="not valid YAML") as info:
        _read(path)
    assert what in info.value.what and info.value.where == f"{path}:{line}"
    assert "set_int_max_str_digits" not in info.value.what, "Python's advice is for programmers"


def test_merge_keys_merge_and_only_a_key_written_twice_is_a_duplicate(tmp_path):
    """``<<`` merges as YAML says (https://yaml.org/type/merge.html): a key written beside it overrides the
    merged one, the first of merged mappings wins; the same as PyYAML's safe_load."""
    text = ("a: &a {x: 1, y: 2}\nb: &b\n  <<: *a\n  x: 3\nc:\n  <<: [*b, {x: 9, z: 1}]\n  z: 2\n"
            "outer:\n  d: &d\n    <<: {x: 1}\n    x: 2\ne:\n  <<: *d\n")
    path = tmp_path / "m.yaml"
    path.write_text(text)
    assert _read(path) == yaml.safe_load(text)
    assert _read(path)["b"] == {"x": 3, "y": 2} and _read(path)["c"]["z"] == 2
    path.write_text("a: &a {x: 1}\nb:\n  <<: *a\n  x: 3\n  x: 4\n")
    with pytest.raises(InputError, match="'x' appears twice") as info:
        _read(path)
    assert info.value.where == f"{path}:5"
