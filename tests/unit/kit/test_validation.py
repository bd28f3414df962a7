"""kit.validation: pydantic's errors in the user's words (what, where, how to fix), one format for every file."""

from __future__ import annotations

import pytest
from pydantic import BaseModel, ConfigDict, ValidationError

from kit.errors import InputError
from kit.validation import input_error, require_mapping


class _Inner(BaseModel):
    model_config = ConfigDict(extra="forbid")
    nodes: int


class _Doc(BaseModel):
    model_config = ConfigDict(extra="forbid")
    inner: _Inner
    names: list[str] = []


def error_for(raw) -> InputError:
    with pytest.raises(ValidationError) as info:
        _Doc.model_validate(raw)
    return input_error(info.value, "f.yaml", doc="docs/x.md")


def test_unknown_key_missing_field_and_wrong_type():
    err = error_for({"inner": {"nodes": 1, "colour": "blue"}})
    assert (err.where, err.what) == ("f.yaml: inner.colour", "unknown key 'colour'")
    assert err.fix == "remove it (check the spelling against docs/x.md)"
    err = error_for({"inner": {}})
    assert (err.where, err.what, err.fix) == ("f.yaml: inner.nodes", "required field 'nodes' is missing", "add nodes: ...")
    err = error_for({"inner": {"nodes": "four"}})
    assert err.what.endswith("(got 'four')") and err.fix == "use a whole number"


def test_a_model_of_the_wrong_type_is_a_mapping_to_the_user_not_a_class():
    err = error_for({"inner": "x"})
    assert err.what == "Input should be a mapping (got 'x')" and "_Inner" not in err.render()
    assert err.fix == "use a mapping with the keys docs/x.md lists"


def test_the_value_shown_is_bounded_and_the_other_problems_counted():
    err = error_for({"inner": {"nodes": "9" * 10_000}, "names": [1, 2]})
    assert len(err.what) < 200 and "..." in err.what
    assert err.what.endswith("(and 2 more problems)")
    assert error_for({"inner": {"nodes": 1}, "names": [1]}).what.endswith("(got 1)")


@pytest.mark.parametrize(("raw", "what"), [(None, "the file is empty"), ([1], "not a list"), ("x", "not a string"),
                                           (3, "not a number"), (True, "not true or false")])
def test_a_document_that_is_not_a_mapping(raw, what):
    with pytest.raises(InputError) as info:
        require_mapping(raw, "f.yaml", what="file", fix="write key: value")
    assert what in info.value.what and info.value.where == "f.yaml" and info.value.exit_code == 2
    require_mapping({}, "f.yaml", what="file", fix="")
