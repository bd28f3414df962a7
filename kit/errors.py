"""One error type for everything a user can fix.

Every message says *what* is wrong, *where* (file, field, resource) and *how to fix it*;
the CLI prints it without a traceback and exits with ``exit_code``.
"""

from __future__ import annotations

import signal


class KitError(Exception):
    """An error the user can act on. ``exit_code`` 2 means bad input, 1 a failed operation."""

    exit_code = 1

    def __init__(self, what: str, *, where: str | None = None, fix: str | None = None):
        self.what = what
        self.where = where
        self.fix = fix
        super().__init__(self.render())

    def render(self) -> str:
        lines = [self.what if not self.where else f"{self.where}: {self.what}"]
        if self.fix:
            lines.append(f"fix: {self.fix}")
        return "\n".join(lines)


class InputError(KitError):
    """Bad user input (spec, flags, files). Nothing has been written or applied."""

    exit_code = 2


INTERRUPTED_EXIT = 130  # 128 + SIGINT: how a shell reports a process Ctrl-C ended


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised in the main thread where Ctrl-C raises KeyboardInterrupt (``kit.cli.app`` arranges it
    while a command runs): a service manager, ``timeout``, ``docker stop`` or a cancelled CI job stops kit
    the same orderly way as Ctrl-C (the trainers save first, the ledger keeps the time), not mid-step."""

    exit_code = 143  # 128 + SIGTERM


def interrupt_for(signum: int) -> KeyboardInterrupt:
    """The interrupt a signal that ends a command stands for: SIGTERM :class:`Terminated`, SIGINT (Ctrl-C)
    KeyboardInterrupt."""
    return Terminated() if signum == signal.SIGTERM else KeyboardInterrupt()


def interrupted_exit_code(interrupt: BaseException) -> int:
    """The exit code of a command that ``interrupt`` (a KeyboardInterrupt) ended."""
    return Terminated.exit_code if isinstance(interrupt, Terminated) else INTERRUPTED_EXIT
