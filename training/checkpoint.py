"""Atomic, verified, asynchronous checkpoints.

Layout of ``--ckpt-dir`` (one full copy per node; local rank 0 of each node writes it)::

    step-00000100/state.pt     torch.save of the whole training state (CPU tensors)
    step-00000100/COMPLETE     JSON marker, written last: step, sizes and sha256 of every file
    .tmp-step-00000120-<pid>/  a save in progress (or killed mid-write: ignored, removed on start)
    corrupt-step-00000140-<t>/ a checkpoint that failed verification, moved aside (never deleted here)

Write protocol: stage tensors into reusable host buffers (the only part the training loop waits
for on a periodic save), then in a background thread write ``state.pt`` into a fresh temporary
directory while hashing it, fsync it, write and fsync ``COMPLETE``, fsync the directory, rename it to
``step-N`` and fsync the parent. A directory named ``step-N`` therefore only ever appears complete;
the marker and checksums additionally catch later truncation or bit rot. Loading walks the complete
checkpoints newest first and falls back (with a warning) past any that fail verification
(marker, size or sha256: :class:`CorruptCheckpoint`, moved aside). A checkpoint whose bytes verify but
that cannot be loaded (e.g. a newer torch rejects it, MemoryError) is *not* corrupt: it raises
:class:`UnloadableCheckpoint` and is left in place, so one bad load never discards good checkpoints.
"""
from __future__ import annotations

import hashlib
import os
import re
import shutil
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, cast

import torch
from pydantic import BaseModel, ConfigDict, Field, StrictInt, ValidationError, field_validator

from .contract import fsync_dir

MARKER = "COMPLETE"
STATE_FILE = "state.pt"
FORMAT = 1
STEP_DIR_RE = re.compile(r"^step-(\d{8,})$")  # a complete checkpoint's directory, here and in a bucket


class FileEntry(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    bytes: StrictInt = Field(ge=0)
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")


class Marker(BaseModel):
    """The ``COMPLETE`` marker, written last by the checkpointer and validated before any resume:
    one model for both sides, so a marker that parses as JSON but lacks a key, has a key of the
    wrong type, or lists no files is an incomplete checkpoint (fallen back past), never a crash."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    format: StrictInt
    step: StrictInt = Field(ge=0)
    time: float = Field(allow_inf_nan=False)
    files: dict[str, FileEntry] = Field(min_length=1)

    @field_validator("format")
    @classmethod
    def _known_format(cls, value: int) -> int:
        if value != FORMAT:
            raise ValueError(f"format {value} is not {FORMAT}")
        return value

    @field_validator("files")
    @classmethod
    def _plain_names_with_state(cls, files: dict[str, FileEntry]) -> dict[str, FileEntry]:
        bad = [name for name in files if not name or "/" in name or name in (".", "..")]
        if bad:
            raise ValueError(f"file names must be plain names in the checkpoint directory, not {bad}")
        if STATE_FILE not in files:
            raise ValueError(f"{STATE_FILE} is not listed")
        return files


class CorruptCheckpoint(Exception):
    """The files do not match their marker (missing/unreadable marker, wrong size, sha256 mismatch)."""


class UnloadableCheckpoint(Exception):
    """The files match their marker (so the bytes are what was written) but loading them failed or
    gave an inconsistent state. Not a reason to fall back or move anything: callers must stop."""


def step_dir_name(step: int) -> str:
    return f"step-{step:08d}"


class SaveCancelled(Exception):
    """A background write given up for a newer save that supersedes it (:meth:`Checkpointer.cancel`)."""


SYNC_EVERY = 64 << 20  # bytes written between two fdatasync calls of a checkpoint file


class _HashingWriter:
    """File-like object torch.save writes through: sha256 on the way (no second read), the file synced
    every ``SYNC_EVERY`` bytes and ``cancel`` checked before each such chunk.

    Syncing as it goes bounds what a cancelled write leaves for the disk to flush (otherwise the whole
    file sits in the page cache until the final fsync, which a cancel cannot interrupt), and splitting
    one large tensor into chunks bounds how long a cancel waits."""

    def __init__(self, f, cancel: threading.Event | None = None):
        self.f = f
        self.cancel = cancel
        self.h = hashlib.sha256()
        self.n = 0
        self.unsynced = 0

    def write(self, b) -> int:
        mv = memoryview(b).cast("B")
        for i in range(0, mv.nbytes, SYNC_EVERY):
            if self.cancel is not None and self.cancel.is_set():
                raise SaveCancelled()
            chunk = mv[i:i + SYNC_EVERY]
            self.h.update(chunk)
            self.f.write(chunk)
            self.n += chunk.nbytes
            self.unsynced += chunk.nbytes
            if self.unsynced >= SYNC_EVERY:
                self.f.flush()
                os.fdatasync(self.f.fileno())
                self.unsynced = 0
        return mv.nbytes

    def flush(self) -> None:
        self.f.flush()


def hash_stream(src, dst=None, chunk: int = 8 << 20) -> tuple[str, int]:
    """sha256 and size of everything ``src`` (a binary file object) reads, copied to ``dst`` on the way
    when given (so copying a checkpoint costs no second read to check it)."""
    h = hashlib.sha256()
    n = 0
    while True:
        b = src.read(chunk)
        if not b:
            return h.hexdigest(), n
        h.update(b)
        n += len(b)
        if dst is not None:
            dst.write(b)


def sha256_file(path: Path, chunk: int = 8 << 20) -> tuple[str, int]:
    with open(path, "rb") as f:
        return hash_stream(f, chunk=chunk)


def list_complete(directory: Path) -> list[tuple[int, Path]]:
    """Checkpoints that carry a completeness marker, newest first (not yet verified)."""
    out: list[tuple[int, Path]] = []
    if not directory.is_dir():
        return out
    for p in directory.iterdir():
        step = step_of(p)
        if step is not None and (p / MARKER).is_file():
            out.append((step, p))
    out.sort(key=lambda t: t[0], reverse=True)
    return out


def step_of(path: Path) -> int | None:
    """The step a checkpoint directory's name (``step-N``) says, or None for another name."""
    named = STEP_DIR_RE.match(Path(path).name)
    return int(named.group(1)) if named else None


def read_marker_bytes(path: Path) -> tuple[Marker, bytes]:
    """The checkpoint's marker, validated (:class:`Marker`) and consistent with its directory name,
    with the exact bytes it was parsed from (a copy writes those, not a second read that may find the
    directory gone). Raises CorruptCheckpoint: the checkpoint is incomplete, whatever the marker says."""
    try:
        raw = (path / MARKER).read_bytes()
        marker = Marker.model_validate_json(raw)
    except OSError as e:
        raise CorruptCheckpoint(f"{path}: unreadable marker ({e})") from e
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join(str(p) for p in first.get("loc", ())) or "marker"
        raise CorruptCheckpoint(f"{path}: the marker fails its schema ({e.error_count()} problem(s); "
                                f"{where}: {first.get('msg')})") from None
    named = step_of(path)
    if named is not None and named != marker.step:
        raise CorruptCheckpoint(f"{path}: the marker says step {marker.step}")
    return marker, raw


def write_marker(directory: Path, raw: bytes) -> None:
    """Write a checkpoint's ``COMPLETE`` marker into the temporary directory that becomes ``step-N``,
    synced before that rename (a save's and a download's alike)."""
    with open(directory / MARKER, "wb") as f:
        f.write(raw)
        f.flush()
        os.fsync(f.fileno())


def read_marker(path: Path) -> Marker:
    """:func:`read_marker_bytes` without the bytes."""
    return read_marker_bytes(path)[0]


def marked_bytes(path: Path) -> int | None:
    """The bytes a complete checkpoint holds, as its marker lists them (what a move to another zone
    copies); None when the marker is missing or fails its schema."""
    try:
        return sum(entry.bytes for entry in read_marker(path).files.values())
    except CorruptCheckpoint:
        return None


def verify(path: Path) -> dict:
    """Check the marker and every file's size and sha256; return the marker (as a dict). Raises
    CorruptCheckpoint."""
    marker = read_marker(path)
    for name, meta in marker.files.items():
        f = path / name
        try:
            size = f.stat().st_size
        except OSError as e:
            raise CorruptCheckpoint(f"{f}: missing ({e})") from e
        if size != meta.bytes:
            raise CorruptCheckpoint(f"{f}: {size} bytes, marker says {meta.bytes} (truncated?)")
        digest, _ = sha256_file(f)
        if digest != meta.sha256:
            raise CorruptCheckpoint(f"{f}: sha256 mismatch")
    return marker.model_dump()


def read_verified(path: Path) -> dict:
    """Verify, then load. CorruptCheckpoint: the bytes are damaged. UnloadableCheckpoint: the bytes
    are intact but cannot be loaded (software/environment problem: never a reason to discard it)."""
    marker = verify(path)
    try:
        state = torch.load(path / STATE_FILE, map_location="cpu", weights_only=True)
    except Exception as e:  # MemoryError, an unpickler rejection after a torch upgrade, ...
        raise UnloadableCheckpoint(
            f"{path}: sha256 verified but torch.load failed: {type(e).__name__}: {e}") from e
    try:
        saved_step = int(state.get("step", -1))
    except (AttributeError, TypeError, ValueError) as e:
        raise UnloadableCheckpoint(f"{path}: sha256 verified but the state has no step ({e})") from e
    if saved_step != marker["step"]:
        raise UnloadableCheckpoint(
            f"{path}: sha256 verified but state step {saved_step} != marker {marker['step']}")
    return state


def unmarked(directory: Path) -> list[Path]:
    """``step-N`` directories that hold a state file but no marker. A save never leaves one (the
    directory is renamed into place after its marker is written), so the marker was lost or
    deleted: the files are kept, and the trainer refuses to start from step 0 over them."""
    directory = Path(directory)
    if not directory.is_dir():
        return []
    return sorted(p for p in directory.iterdir() if STEP_DIR_RE.match(p.name) and not (p / MARKER).exists()
                  and (p / STATE_FILE).exists())


def quarantined(directory: Path) -> list[Path]:
    """Checkpoints moved aside as corrupt (kept for a human; never deleted automatically)."""
    directory = Path(directory)
    if not directory.is_dir():
        return []
    return sorted(p for p in directory.iterdir() if p.name.startswith("corrupt-"))


def newest_loadable(directory: Path, log=print, quarantine: bool = True) -> tuple[int, Path, dict] | None:
    """Newest checkpoint that verifies; corrupt newer ones are reported and (optionally) moved aside.

    Raises UnloadableCheckpoint (and moves nothing) when a checkpoint verifies but does not load.
    """
    for step, path in list_complete(Path(directory)):
        try:
            return step, path, read_verified(path)
        except CorruptCheckpoint as e:
            log(f"WARNING checkpoint {path} is corrupt, falling back to the previous one: {e}")
            if quarantine:
                _quarantine(path, log)
    return None


def _quarantine(path: Path, log=print) -> None:
    """Move a corrupt checkpoint aside (atomic rename); nothing is deleted."""
    target = path.with_name(f"corrupt-{path.name}-{int(time.time() * 1000)}")
    try:
        os.rename(path, target)
        fsync_dir(path.parent)
    except OSError as e:
        log(f"WARNING could not move {path} aside: {e}")


@dataclass
class SaveStats:
    step: int
    stall_s: float = 0.0      # time the training loop waited (previous write + staging)
    wait_s: float = 0.0       # of which: waiting for the previous background write
    write_s: float | None = None  # background write duration (filled in when it finishes)
    bytes: int = 0
    path: str | None = None
    error: str | None = None
    skipped: bool = False     # this node already had a complete checkpoint of this step (if_missing)
    cancelled: bool = False   # given up for a newer save (:meth:`Checkpointer.cancel`); nothing written
    previous: SaveStats | None = None  # the earlier background write this save waited for, if any


class HostStager:
    """Copies a nested state (tensors anywhere) into reusable host buffers (pinned for CUDA)."""

    def __init__(self):
        self._buffers: dict[tuple, torch.Tensor] = {}

    def stage(self, obj, key=()):
        if isinstance(obj, torch.Tensor):
            t = obj.detach()
            buf = self._buffers.get(key)
            if buf is None or buf.shape != t.shape or buf.dtype != t.dtype:
                buf = torch.empty(t.shape, dtype=t.dtype, device="cpu", pin_memory=t.is_cuda)
                self._buffers[key] = buf
            buf.copy_(t, non_blocking=t.is_cuda)
            return buf
        if isinstance(obj, dict):
            return {k: self.stage(v, key + (k,)) for k, v in obj.items()}
        if isinstance(obj, (list, tuple)):
            return type(obj)(self.stage(v, key + (i,)) for i, v in enumerate(obj))
        return obj


class Checkpointer:
    """Periodic asynchronous saves and synchronous stop saves into one directory.

    ``writer`` is False on ranks that do not write (everyone except local rank 0 of each node); they
    keep the same call sequence so collectives around saves stay aligned.
    """

    def __init__(self, directory: str | os.PathLike, keep: int = 3, writer: bool = True, log=print,
                 write_delay_s: float = 0.0, in_use: Callable[[], Iterable[Path]] | None = None):
        if keep < 2:
            raise ValueError("keep must be >= 2 (the newest may be mid-write when a node dies)")
        self.directory = Path(directory)
        self.keep = keep
        self.writer = writer
        self.log = log
        self.stager = HostStager()
        self._thread: threading.Thread | None = None
        self._pending: SaveStats | None = None
        self._cancel = threading.Event()  # of the write in flight; each write gets a fresh one
        self.history: list[SaveStats] = []
        self.write_delay_s = write_delay_s  # tests only: two sleeps inside every write
        self.in_use = in_use  # checkpoints retention must not remove yet (training.bucket.Uploader.in_use)
        if writer:
            self.directory.mkdir(parents=True, exist_ok=True)
            self._clean_tmp()

    def _clean_tmp(self) -> None:
        for p in self.directory.iterdir():
            if p.name.startswith(".tmp-"):
                shutil.rmtree(p, ignore_errors=True)

    # -- saving -------------------------------------------------------------------------------
    def prepare(self, state: dict) -> SaveStats | None:
        """Allocate the (pinned) staging buffers ahead of the first save, so its stall is only a copy.

        Waits for an in-flight background write first (it reads the same buffers); returns that
        write's stats like :meth:`wait`."""
        done = self.wait()
        if self.writer:
            self.stager.stage(state)
            if torch.cuda.is_available() and torch.cuda.is_initialized():
                torch.cuda.current_stream().synchronize()
        return done

    def wait(self) -> SaveStats | None:
        """Block until the in-flight background write (if any) has finished."""
        t = self._thread
        if t is not None:
            t.join()
            self._thread = None
        done, self._pending = self._pending, None
        return done

    def cancel(self) -> SaveStats | None:
        """Give up the in-flight background write, if any, and return its stats like :meth:`wait`.

        For a save whose newer state supersedes it (the stop save): waiting for it can take as long
        as the stop save itself, out of a preemption notice's seconds. It stops at its next chunk
        (:data:`SYNC_EVERY`) and leaves nothing behind; one whose state file is written completes.
        The complete checkpoints before it are untouched, so nothing saved is lost."""
        if self._thread is not None:
            self._cancel.set()
        return self.wait()

    def has(self, step: int) -> bool:
        return (self.directory / step_dir_name(step) / MARKER).is_file()

    def bytes_of(self, step: int) -> int | None:
        """The size of this node's complete checkpoint of ``step`` (:func:`marked_bytes`)."""
        return marked_bytes(self.directory / step_dir_name(step))

    def save(self, step: int, state: dict, sync: bool = False, if_missing: bool = False) -> SaveStats:
        """Save ``state`` (live tensors are fine: they are staged before this returns).

        ``if_missing``: do nothing on a node that already holds a complete checkpoint of ``step``
        (e.g. the resume step, which only a replaced node lacks)."""
        t0 = time.perf_counter()
        finished = self.wait()
        stats = SaveStats(step=step)
        stats.wait_s = time.perf_counter() - t0
        stats.previous = finished
        if not self.writer or (if_missing and self.has(step)):
            stats.skipped = self.writer
            stats.stall_s = time.perf_counter() - t0
            return stats
        staged = self.stager.stage(state)
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            torch.cuda.current_stream().synchronize()
        stats.stall_s = time.perf_counter() - t0
        self.history.append(stats)
        if sync:
            self._write(step, staged, stats, threading.Event())
            if stats.error:
                raise OSError(stats.error)
        else:
            self._pending = stats
            self._cancel = threading.Event()
            self._thread = threading.Thread(target=self._write, args=(step, staged, stats, self._cancel),
                                            name=f"ckpt-write-{step}", daemon=True)
            self._thread.start()
        return stats

    def _write(self, step: int, staged: dict, stats: SaveStats, cancel: threading.Event) -> None:
        t0 = time.perf_counter()
        final = self.directory / step_dir_name(step)
        tmp = self.directory / f".tmp-{step_dir_name(step)}-{os.getpid()}-{threading.get_ident()}"
        try:
            if tmp.exists():
                shutil.rmtree(tmp)
            tmp.mkdir(parents=True)
            if self.write_delay_s and cancel.wait(self.write_delay_s):  # tests: before the buffers are read ...
                raise SaveCancelled()
            with open(tmp / STATE_FILE, "wb") as f:
                w = _HashingWriter(f, cancel)
                torch.save(staged, cast(IO[bytes], w))  # duck-typed: torch.save only calls write and flush
                f.flush()
                os.fsync(f.fileno())
            if self.write_delay_s:  # ... and with state.pt written but no marker yet (completes)
                cancel.wait(self.write_delay_s)
            marker = Marker(format=FORMAT, step=step, time=time.time(),
                            files={STATE_FILE: FileEntry(bytes=w.n, sha256=w.h.hexdigest())})
            write_marker(tmp, marker.model_dump_json().encode())
            fsync_dir(tmp)
            trash = None
            if final.exists():  # same step written again (rare: save(if_missing=False) of a held step)
                trash = self.directory / f".tmp-replaced-{final.name}-{os.getpid()}"
                os.rename(final, trash)
            os.rename(tmp, final)
            fsync_dir(self.directory)
            if trash is not None:
                shutil.rmtree(trash, ignore_errors=True)
            stats.bytes = w.n
            stats.path = str(final)
            self._prune()
        except Exception as e:  # noqa: BLE001 - reported, training continues (periodic) / raises (sync)
            shutil.rmtree(tmp, ignore_errors=True)
            # torch.save's C++ writer turns SaveCancelled into its own error ("unexpected pos"), so a
            # cancel is known by its event, not by the exception that reached here
            if cancel.is_set():
                stats.cancelled = True
                self.log(f"checkpoint step {step} cancelled: a newer save supersedes it")
            else:
                stats.error = f"checkpoint step {step} failed: {e}"
                self.log(f"ERROR {stats.error}")
        stats.write_s = time.perf_counter() - t0

    def _prune(self) -> None:
        """Remove complete checkpoints beyond the newest ``keep``, except those ``in_use`` names.

        With a bucket that is the one being uploaded and the one queued next: removing the first
        fails its upload (and, with uploads slower than ``keep`` saves, every upload), removing the
        second fails the next. Any other one is safe to remove before it reaches the bucket, because
        the uploader only ever copies the newest checkpoint submitted: an older one that is neither
        in flight nor queued would never be copied, so keeping it makes the bucket no fresher, while
        keeping everything newer than the bucket's copy would fill the disk whenever the bucket is
        unreachable (and then the saves themselves fail). Retention therefore holds at most two
        directories beyond ``keep``."""
        busy = {Path(p).resolve() for p in self.in_use()} if self.in_use is not None else set()
        for _, path in list_complete(self.directory)[self.keep:]:
            if path.resolve() in busy:
                continue
            trash = path.with_name(f".tmp-pruned-{path.name}-{os.getpid()}")
            try:
                os.rename(path, trash)  # atomic: never a half-deleted step-N
            except OSError:
                continue
            shutil.rmtree(trash, ignore_errors=True)

    def poll(self) -> SaveStats | None:
        """The finished background save, if one finished since the last call (non-blocking)."""
        t = self._thread
        if t is not None and not t.is_alive():
            return self.wait()
        return None

    def close(self) -> None:
        self.wait()
