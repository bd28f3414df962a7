"""The one error handler of kit's command line, and the Typer app class every command group uses.

A command raises :class:`kit.errors.KitError` for anything the user can fix; :func:`handled`
prints it (what, where, fix; no traceback) and exits with its code; Ctrl-C exits 130, and SIGTERM takes
the same orderly path and exits 143 (:class:`kit.errors.Terminated`). Every
command is registered through :class:`App`, which wraps it once, so no command catches errors itself.
"""

from __future__ import annotations

import contextlib
import functools
import signal
import threading
from collections.abc import Callable, Iterator
from typing import Any

import typer
from rich.console import Console
from rich.markup import escape

from kit.errors import KitError, interrupt_for, interrupted_exit_code

err_console = Console(stderr=True)


def fail(error: KitError) -> None:
    """Print a user-fixable error (no traceback) and exit with its code. The error's text is escaped: it
    quotes paths, YAML and cloud messages, and rich would read ``[...]`` in them as markup (dropping it,
    or raising on a closing tag like ``[/b]``)."""
    err_console.print(f"[bold red]error:[/bold red] {escape(error.render())}", highlight=False, soft_wrap=True)
    raise typer.Exit(error.exit_code)


def handled(command: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(command)
    def run(*args: Any, **kwargs: Any) -> Any:
        try:
            with sigterm_as_interrupt():
                return command(*args, **kwargs)
        except KitError as error:
            fail(error)
        except KeyboardInterrupt as interrupt:
            raise typer.Exit(interrupted_exit_code(interrupt)) from None
        return None

    return run


def _raise_interrupt(signum: int, frame: object) -> None:
    raise interrupt_for(signum)


@contextlib.contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """While a command runs, SIGTERM raises :class:`kit.errors.Terminated` (a KeyboardInterrupt), so every
    path that handles Ctrl-C handles it: ``kit train`` lets its trainers save, ``kit watch`` says where it
    stopped. Left alone where whoever started kit ignores SIGTERM, and outside the main thread (Python
    runs handlers only there); the previous handler comes back after the command."""
    if threading.current_thread() is not threading.main_thread() or signal.getsignal(signal.SIGTERM) != signal.SIG_DFL:
        yield
        return
    previous = signal.signal(signal.SIGTERM, _raise_interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


class App(typer.Typer):
    """A Typer app whose commands all go through :func:`handled`."""

    def __init__(self, **kwargs: Any):
        kwargs.setdefault("pretty_exceptions_enable", False)
        kwargs.setdefault("add_completion", False)
        super().__init__(**kwargs)

    def command(self, *args: Any, **kwargs: Any):
        register = super().command(*args, **kwargs)

        def decorator(fn: Callable[..., Any]) -> Callable[..., Any]:
            register(handled(fn))
            return fn

        return decorator
