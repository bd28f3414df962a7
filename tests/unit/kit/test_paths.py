"""kit.paths: an output file is checked before any work."""

from __future__ import annotations

import pytest

from kit.errors import InputError
from kit.paths import check_output_file, check_plot_file


def test_an_output_name_too_long_is_an_input_error(tmp_path):
    for check, name, flag in ((check_output_file, "r.json", "--json-report"), (check_plot_file, "p.png", "--plot")):
        path = tmp_path / ("a" * 300 + name)
        with pytest.raises(InputError, match="File name too long") as info:
            check(path, flag)
        assert info.value.where == flag and str(path) in info.value.what
