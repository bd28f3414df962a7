"""What kit and every node agree on: the node contract. Used by ``kit/`` (bootstrap, backends,
watcher) and by ``training/`` (trainer, launcher, agent) alike, so each fact is written once.

Paths on a node, the rendezvous port, the market names, and how small state files are written
(atomically: a reader polling them never sees half a file) and read. Standard library only: the
launcher imports it on hosts where nothing but Python is installed yet.
"""
from __future__ import annotations

import json
import os
import threading
from pathlib import Path

DISK_MOUNT = "/mnt/kit-disk"                    # the node's data disk (checkpoints, progress, events)
CKPT_DIR = f"{DISK_MOUNT}/ckpt"                 # the trainer's checkpoint directory on it
PROGRESS_FILE = f"{DISK_MOUNT}/progress.json"   # the trainer's progress (kit reads it over SSH)
# what a progress report's detail repeats of that file (training/progress.py), for the watcher
PROGRESS_DETAIL = ("state", "params_sha256", "checkpoint_step", "checkpoint_bytes")
EVENTS_DIR = f"{DISK_MOUNT}/events"             # what the agent and the shutdown hook record
EVENTS_FILE = "events.jsonl"                   # the agent's record in its event dir: one report a line
PREEMPTION_NOTICE = "preemption-notice"        # the kind of report a cloud's preemption notice makes
STOP_FILE = "/run/kit/stop"                     # its appearance asks the trainer to save and stop
PREEMPTED_MARKER = "/run/kit/preempted"         # a node being preempted: the launcher does not restart
RENDEZVOUS_PORT = 29500                         # torchrun's c10d store on node 0

SPOT, ON_DEMAND = "spot", "on-demand"
MARKETS = (SPOT, ON_DEMAND)


def fsync_dir(path: str | os.PathLike) -> None:
    """Make the entries of directory ``path`` (a rename into it, a new file) durable: fsync(2) of
    the file alone does not persist its directory entry."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path: str | os.PathLike, text: str, *, durable: bool = False, mode: int = 0o666) -> None:
    """Write a small file so that a reader polling it never sees it half-written: a temporary file
    beside it, then a rename. ``durable``: fsync the file before the rename and the directory
    after it (a state that must survive a power loss, e.g. the final progress). ``mode``: the file's
    permissions from its creation on (less the umask), e.g. 0o600 for a secret, never readable wider."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    try:
        with os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode), "w") as f:
            f.write(text)
            if durable:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    if durable:
        fsync_dir(path.parent)


def write_json_atomic(path: str | os.PathLike, data: dict, *, durable: bool = False) -> None:
    write_atomic(path, json.dumps(data, sort_keys=True) + "\n", durable=durable)


def read_json(path: str | os.PathLike | None) -> dict | None:
    """A small JSON state file (the progress file, a node state file), or None when it is missing,
    half-written by a writer that does not rename, or not an object."""
    if not path:
        return None
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def recorded_reports(event_dir: str | os.PathLike) -> list[dict]:
    """The reports the node agent recorded in ``event_dir`` (``EVENTS_FILE``), oldest first; a line that is
    not a JSON object (torn by a crash mid-append) is skipped."""
    try:
        lines = (Path(event_dir) / EVENTS_FILE).read_text().splitlines()
    except OSError:
        return []
    reports = []
    for line in lines:
        try:
            report = json.loads(line)
        except ValueError:
            continue
        if isinstance(report, dict):
            reports.append(report)
    return reports
