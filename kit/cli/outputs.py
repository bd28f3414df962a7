"""The files a command writes at its end (``--plot``, ``--json-report``): tried before any work, so that a
name that cannot be written is refused at once, not after a whole run or replay."""

from __future__ import annotations

from pathlib import Path


def try_writing(path: Path, flag: str) -> None:
    """Create ``path`` and remove it again (a file already there is opened for appending and left as it was).
    Permission bits say too little: root passes access(2) in /sys and /proc, where the kernel still refuses
    to create a file (sysfs(5), proc(5))."""
    from kit.errors import InputError

    existed = False
    try:
        existed = path.exists()
        with open(path, "ab" if existed else "xb"):
            pass
    except OSError as error:
        raise InputError(f"cannot write {path}: {error.strerror or error}", where=flag,
                         fix="name a file in a directory you can write") from None
    if not existed:
        path.unlink(missing_ok=True)


def check_output(path: Path, flag: str) -> None:
    """An output file (:func:`kit.paths.check_output_file`), then tried (:func:`try_writing`)."""
    from kit.paths import check_output_file

    check_output_file(Path(path), flag)
    try_writing(Path(path), flag)


def check_plot(path: Path, flag: str = "--plot") -> None:
    """A figure's file (:func:`kit.paths.check_plot_file`: a writable ``*.png``), then tried (:func:`try_writing`)."""
    from kit.paths import check_plot_file

    check_plot_file(Path(path), flag)
    try_writing(Path(path), flag)
