"""pydantic's validation errors as kit's InputError: one message format for every file kit validates.

pydantic reports a list of errors, each with a type, a location and a message written for programmers
("Input should be a valid dictionary or instance of _OffersFile", "Extra inputs are not permitted"). A
user gets the first one as *what* (an unknown key, a missing field, or pydantic's message with the value
it got), *where* (the file and the dotted field) and *how to fix it*, and a count of the rest.
"""

from __future__ import annotations

import reprlib
from typing import Annotated, Any

from pydantic import BeforeValidator, Field, ValidationError
from pydantic_core import PydanticCustomError

from kit.errors import InputError

# How to fix a value of the wrong type or range, by pydantic's error type
# (https://docs.pydantic.dev/latest/errors/validation_errors/).
FIXES = {
    "literal_error": "use one of the allowed values",
    "int_parsing": "use a whole number",
    "int_type": "use a whole number",
    "int_from_float": "use a whole number",
    "float_type": "use a number",
    "float_parsing": "use a number",
    "finite_number": "use a finite number",
    "bool_type": "use true or false",
    "bool_parsing": "use true or false",
    "string_type": "use a string",
    "string_too_short": "use a non-empty string",
    "dict_type": "use a mapping (key: value)",
    "list_type": "use a list",
    "too_short": "give at least one",
    "greater_than": "use a larger value",
    "greater_than_equal": "use a larger value",
    "less_than_equal": "use a smaller value",
}

MODEL_TYPES = ("model_type", "model_attributes_type")
# What a YAML document's top level is, in the user's words.
YAML_KINDS = {"list": "a list", "str": "a string", "int": "a number", "float": "a number", "bool": "true or false"}

# The value shown with a message, bounded: the input may be huge (a YAML alias bomb).
_SHORT = reprlib.Repr()
_SHORT.maxlevel, _SHORT.maxlist, _SHORT.maxdict, _SHORT.maxstring, _SHORT.maxother = 2, 4, 4, 60, 60
SHOWN_CHARS = 80


def shown(value: Any) -> str:
    """``value`` as a message quotes it: its repr, bounded (a value may be huge: a 900 KB name must not make a
    900 KB error)."""
    text = _SHORT.repr(value)
    return text[:SHOWN_CHARS] + "…" if len(text) > SHOWN_CHARS else text


def field_of(loc: tuple[Any, ...], top: str = "(top level)") -> str:
    """The dotted field a location names (``shapes.0.nodes``), or ``top`` for the document itself."""
    return ".".join(str(part) for part in loc) if loc else top


def more_problems(errors: list[Any]) -> str:
    """The " (and N more problems)" said after the first of ``errors`` (nothing when it is the only one)."""
    more = len(errors) - 1
    return f" (and {more} more problem{'s' if more > 1 else ''})" if more else ""


def describe(first: Any, loc: tuple[Any, ...], *, doc: str, unknown_hint: str = "",
             fallback_fix: str | None = None) -> tuple[str, str]:
    """What is wrong (one pydantic error at ``loc``) and how to fix it; ``doc`` documents the format,
    ``unknown_hint`` adds to the fix of an unknown key, ``fallback_fix`` replaces "see DOC" where
    :data:`FIXES` has no entry."""
    kind = first.get("type", "")
    if kind == "extra_forbidden":
        return f"unknown key {loc[-1]!r}", f"remove it (check the spelling against {doc}{unknown_hint})"
    if kind == "missing":
        return f"required field {loc[-1]!r} is missing", f"add {loc[-1]}: ..."
    got = shown(first.get("input"))
    if kind in MODEL_TYPES:  # pydantic's message names the class ("... or instance of _ShapeFile")
        return f"Input should be a mapping (got {got})", f"use a mapping with the keys {doc} lists"
    return f"{first.get('msg', 'invalid value')} (got {got})", FIXES.get(kind, fallback_fix or f"see {doc}")


def input_error(error: ValidationError, where: str, *, doc: str, fallback_fix: str | None = None) -> InputError:
    """The InputError for a document at ``where`` (a file, or a flag) that failed validation."""
    errors = error.errors(include_url=False)
    first = errors[0]
    loc = tuple(first.get("loc", ()))
    what, fix = describe(first, loc, doc=doc, fallback_fix=fallback_fix)
    return InputError(what + more_problems(errors), where=f"{where}: {field_of(loc)}", fix=fix)


def require_mapping(raw: Any, where: str, *, what: str, fix: str) -> None:
    """Refuse a document whose top level is not a mapping (an empty file is ``None`` to YAML)."""
    if raw is None:
        raise InputError(f"the {what} is empty", where=where, fix=fix)
    if not isinstance(raw, dict):
        kind = YAML_KINDS.get(type(raw).__name__, type(raw).__name__)
        raise InputError(f"the {what} must be a YAML mapping (key: value), not {kind}", where=where, fix=fix)


def _not_bool(value: Any) -> Any:
    """A number field refuses true/false: YAML 1.1 reads yes/no/on/off as booleans too, and Python takes a
    bool for the int 1 or 0 (``deadline_hours: yes`` would be a 1-hour deadline)."""
    if isinstance(value, bool):
        raise PydanticCustomError("float_type", "Input should be a number, not true/false (YAML reads yes, no, "
                                                "on and off as true/false)")
    return value


NotBool = BeforeValidator(_not_bool)  # for every number field of a file kit validates
Finite = Annotated[float, NotBool, Field(allow_inf_nan=False)]
