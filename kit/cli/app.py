"""The one error handler of kit's command line, and the Typer app class every command group uses.

A command raises :class:`kit.errors.KitError` for anything the user can fix; :func:`handled`
prints it (what, where, fix; no traceback) and exits with its code, and Ctrl-C exits 130. Every
command is registered through :class:`App`, which wraps it once, so no command catches errors itself.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import typer
from rich.console import Console
from rich.markup import escape

from kit.errors import KitError

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
            return command(*args, **kwargs)
        except KitError as error:
            fail(error)
        except KeyboardInterrupt:
            raise typer.Exit(130) from None
        return None

    return run


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
