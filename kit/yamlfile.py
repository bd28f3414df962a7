"""The YAML files a user hands kit (the spec, an inventory): read once, safely, with errors that
say what, where and how to fix.

PyYAML's ``safe_load`` takes the last of two equal keys without a word and recurses without a
bound on nesting; here a repeated key is refused with its line, and input nested deeper than
``MAX_DEPTH`` (or deep enough to exhaust Python's recursion) is refused as well.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from kit.errors import InputError

MAX_DEPTH = 64  # a cluster spec or an inventory is a few levels deep
MAX_ALIASES = 100  # anchors reused this often are an alias bomb ("billion laughs"), not a spec
MAX_BYTES = 1 << 20  # 1 MiB: a spec is a few KiB, a 1,000-node inventory a few hundred


class _UniqueKeyLoader(yaml.SafeLoader):
    """SafeLoader that refuses a mapping with the same key twice, and nesting over MAX_DEPTH."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"key {key!r} appears twice (first on line {seen[key] + 1})", key_node.start_mark)
            seen[key] = key_node.start_mark.line
        return super().construct_mapping(node, deep=deep)

    def compose_node(self, parent: yaml.Node | None, index: Any) -> yaml.Node | None:
        if self.check_event(yaml.AliasEvent):
            self._aliases = getattr(self, "_aliases", 0) + 1
            if self._aliases > MAX_ALIASES:
                raise yaml.composer.ComposerError(None, None, f"more than {MAX_ALIASES} aliases (*name)",
                                                  self.peek_event().start_mark)
        self._depth = getattr(self, "_depth", 0) + 1
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
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise InputError(f"{what} not found", where=shown, fix="check the path") from None
    except UnicodeDecodeError as error:
        raise InputError(f"{what} is not UTF-8 text (byte {error.start})", where=shown,
                         fix="save it as UTF-8") from None
    except OSError as error:
        raise InputError(f"cannot read the {what}: {error.strerror}", where=shown, fix="check the path") from None
    if len(text) > MAX_BYTES:
        raise InputError(f"{what} is larger than {MAX_BYTES} bytes", where=shown, fix=f"is this the right file? {fix}")
    try:
        return yaml.load(text, Loader=_UniqueKeyLoader)
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f"{shown}:{mark.line + 1}" if mark else shown
        raise InputError(f"not valid YAML: {getattr(error, 'problem', error)}", where=where, fix=fix) from None
    except RecursionError:
        raise InputError(f"{what} is nested too deeply to read", where=shown, fix=fix) from None
