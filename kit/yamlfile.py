"""The files a user hands kit (the spec, an inventory, a trace, a public key): read once, safely, with
errors that say what, where and how to fix.

:func:`read_regular_file` reads only a regular file, and at most a limit: a FIFO waits for a writer,
a device such as ``/dev/zero`` never ends, a directory holds no text. PyYAML's ``safe_load`` takes the last of two equal
keys without a word and recurses without a bound on nesting; here a repeated key is refused with its
line, and input nested deeper than ``MAX_DEPTH`` (or deep enough to exhaust Python's recursion) is
refused as well.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

import yaml

from kit.errors import InputError

MAX_DEPTH = 64  # a cluster spec or an inventory is a few levels deep
MAX_ALIASES = 100  # anchors reused this often are an alias bomb ("billion laughs"), not a spec
MAX_BYTES = 1 << 20  # 1 MiB: a spec is a few KiB, a 1,000-node inventory a few hundred
MERGE_TAG = "tag:yaml.org,2002:merge"  # the ``<<`` key: https://yaml.org/type/merge.html

REGULAR_FILE = "a regular file"
DIRECTORY = "a directory"
_KINDS = ((stat.S_ISREG, REGULAR_FILE), (stat.S_ISDIR, DIRECTORY), (stat.S_ISFIFO, "a FIFO (named pipe)"),
          (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))


def _kind(mode: int) -> str:
    return next((name for is_kind, name in _KINDS if is_kind(mode)), "not a file kit can read")


def file_kind(path: Path, *, where: str, fix: str) -> str | None:
    """What ``path`` is (:data:`REGULAR_FILE`, :data:`DIRECTORY`, "a FIFO (named pipe)", ...; links followed),
    None when nothing is there. Any other OS error (a name too long, a loop of links, a parent that may not be
    searched) is an InputError naming the path and the OS's reason, not a traceback."""
    try:
        return _kind(os.stat(path).st_mode)
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as error:
        raise InputError(f"cannot use {path}: {error.strerror}", where=where, fix=fix) from None


def read_regular_file(path: Path, *, what: str, limit: int, fix: str, where: str | None = None) -> bytes:
    """The bytes of ``path`` (``what`` names it in errors; ``where`` defaults to the path), refused unless it
    is a regular file of at most ``limit`` bytes. Anything else is refused before it is opened: reading a
    FIFO waits for a writer, reading a device may never end."""
    where = str(path) if where is None else where
    _require_regular(file_kind(path, where=where, fix=fix), what, where, fix)
    try:
        # O_NONBLOCK: should the path turn into a FIFO after the stat, the open returns at once instead of
        # waiting for a writer, and fstat refuses it (https://man7.org/linux/man-pages/man2/open.2.html)
        with os.fdopen(os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0)), "rb") as handle:
            _require_regular(_kind(os.fstat(handle.fileno()).st_mode), what, where, fix)
            # limit + 1 bytes, whatever st_size says: /proc files report 0, and a file may grow meanwhile
            data = handle.read(limit + 1)
    except OSError as error:
        raise InputError(f"cannot read the {what}: {error.strerror}", where=where, fix=fix) from None
    if len(data) > limit:
        raise InputError(f"{what} is larger than {limit} bytes", where=where, fix=f"is this the right file? {fix}")
    return data


def _require_regular(kind: str | None, what: str, where: str, fix: str) -> None:
    if kind is None:
        raise InputError(f"{what} not found", where=where, fix=fix)
    if kind != REGULAR_FILE:
        raise InputError(f"{what} is {kind}, not a regular file", where=where, fix=fix)


def value_error_text(error: ValueError) -> str:
    """A ValueError of reading a value, for a user: Python's advice on its integer limit (a call to
    sys.set_int_max_str_digits) is for programmers, not for the author of a file."""
    return str(error).split("; use sys.set_int_max_str_digits()")[0]


class _UniqueKeyLoader(yaml.SafeLoader):
    """SafeLoader that refuses a mapping with the same key twice, a key that is not a scalar, and nesting
    over MAX_DEPTH."""

    def __init__(self, stream: Any):
        super().__init__(stream)
        self._aliases = self._depth = 0
        # each mapping's keys as written: merging (<<) puts the merged keys among them when constructed
        self._written_keys: dict[yaml.MappingNode, list[yaml.Node]] = {}

    def compose_mapping_node(self, anchor: Any) -> yaml.MappingNode:
        node = super().compose_mapping_node(anchor)
        self._written_keys[node] = [key for key, _ in node.value if key.tag != MERGE_TAG]
        return node

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        # merge keys first, as SafeConstructor.construct_mapping does: a key written beside a merge overrides
        # the merged one (https://yaml.org/type/merge.html), so only keys written twice are duplicates
        self.flatten_mapping(node)
        seen: dict[Any, int] = {}
        for key_node in self._written_keys[node]:
            if not isinstance(key_node, yaml.ScalarNode):
                raise yaml.constructor.ConstructorError(
                    None, None, "a key must be a scalar (a string or a number), not a list or a mapping",
                    key_node.start_mark)
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"key {key!r} appears twice (first on line {seen[key] + 1})", key_node.start_mark)
            seen[key] = key_node.start_mark.line
        return super().construct_mapping(node, deep=deep)

    def construct_object(self, node: yaml.Node, deep: bool = False) -> Any:
        """A value Python refuses (an integer over its 4300 digits,
        https://docs.python.org/3/library/stdtypes.html#int-max-str-digits, a date like 2025-13-01) is a
        YAML error at its line."""
        try:
            return super().construct_object(node, deep=deep)
        except ValueError as error:
            raise yaml.constructor.ConstructorError(None, None, value_error_text(error), node.start_mark) from None

    def compose_node(self, parent: yaml.Node | None, index: Any) -> yaml.Node | None:
        if self.check_event(yaml.AliasEvent):
            self._aliases += 1
            if self._aliases > MAX_ALIASES:
                raise yaml.composer.ComposerError(None, None, f"more than {MAX_ALIASES} aliases (*name)",
                                                  self.peek_event().start_mark)
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                raise yaml.composer.ComposerError(None, None, f"nested deeper than {MAX_DEPTH} levels",
                                                  self.peek_event().start_mark)
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


def read_yaml(path: str | Path, *, what: str, fix: str) -> Any:
    """The YAML document in ``path`` (``what`` names it in errors, ``fix`` says how to repair syntax)."""
    path = Path(path)
    shown = str(path)
    data = read_regular_file(path, what=what, limit=MAX_BYTES, fix="check the path")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise InputError(f"{what} is not UTF-8 text (byte {error.start})", where=shown,
                         fix="save it as UTF-8") from None
    try:
        return yaml.load(text, Loader=_UniqueKeyLoader)
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f"{shown}:{mark.line + 1}" if mark else shown
        raise InputError(f"not valid YAML: {getattr(error, 'problem', error)}", where=where, fix=fix) from None
    except RecursionError:
        raise InputError(f"{what} is nested too deeply to read", where=shown, fix=fix) from None
    except ValueError as error:  # one the constructor's line-aware catch above did not see
        raise InputError(f"not valid YAML: {value_error_text(error)}", where=shown, fix=fix) from None
