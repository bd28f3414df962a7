"""The durable tier: the newest complete checkpoint, copied to object storage in the background.

A node's disk is the fast path (a resume in the same zone reads it); the bucket is what lets the
job leave the zone, or survive a lost disk. One writer (global rank 0) copies each newly completed
checkpoint; a node that starts anywhere restores from the newest complete checkpoint, on its disk
first, then in the bucket (:func:`restore_newer`).

Storage is reached through fsspec (``s3://`` via s3fs, ``gs://`` via gcsfs, ``file://`` for a local
directory), so the same code runs on both clouds and in local mode. The bucket holds the local
layout unchanged (``<url>/step-00000100/state.pt`` and ``COMPLETE``), so the same marker and the
same sha256 checks (:mod:`training.checkpoint`) decide what is complete on either side.

Object stores have no atomic rename of a directory, so visibility comes from ordering instead:
the state files are uploaded, read back and hashed, and only when every sha256 matches the marker is
``COMPLETE`` written, last. A copy cut short (a preempted node, a network error) therefore never has
a marker and is never restored; a copy damaged later fails verification when it is downloaded and is
skipped for the next older one (and the next upload of that step replaces it). Pruning, and replacing
a copy, remove the marker first, for the same reason. While an upload runs, the trainer's local
retention keeps the directory it reads (:meth:`Uploader.in_use`).
"""
from __future__ import annotations

import os
import shutil
import threading
from contextlib import ExitStack
from pathlib import Path
from typing import cast

from pydantic import ValidationError

from .checkpoint import (
    MARKER,
    STEP_DIR_RE,
    CorruptCheckpoint,
    Marker,
    hash_stream,
    read_marker,
    read_marker_bytes,
    step_dir_name,
    step_of,
    verify,
    write_marker,
)
from .contract import fsync_dir

STOP_FLUSH_S = 20.0  # a stop save's upload gets this long (GCP's notice is 30 s); the disk keeps it anyway


class Bucket:
    """One job's checkpoints under an fsspec URL (``s3://bucket/prefix``, ``gs://...``, ``file:///dir``)."""

    def __init__(self, url: str, keep: int = 2, log=print, verify_remote: bool = True):
        import fsspec

        if keep < 1:
            raise ValueError("keep must be >= 1")
        self.url = url.rstrip("/")
        self.fs, self.root = fsspec.core.url_to_fs(self.url)
        self.root = self.root.rstrip("/")
        self.keep, self.log, self.verify_remote = keep, log, verify_remote
        # step -> why its copy here failed to restore (:meth:`restore_newer`): the trainer names them
        # when it refuses to start from step 0, and :meth:`upload` replaces such a copy
        self.failed: dict[int, str] = {}

    def _steps(self, pattern: str) -> list[int]:
        self.fs.invalidate_cache()  # s3fs/gcsfs cache listings; another process may have written
        try:
            found = self.fs.glob(f"{self.root}/{pattern}")
        except FileNotFoundError:
            return []
        steps = set()
        for path in found:
            m = STEP_DIR_RE.match(str(path).rstrip("/").removesuffix(f"/{MARKER}").rsplit("/", 1)[-1])
            if m:
                steps.add(int(m.group(1)))
        return sorted(steps, reverse=True)

    def complete_steps(self) -> list[int]:
        """Steps whose copy has its marker, newest first (not yet verified)."""
        return self._steps(f"step-*/{MARKER}")

    def _remote(self, step: int, name: str = "") -> str:
        return f"{self.root}/{step_dir_name(step)}" + (f"/{name}" if name else "")

    # -- upload -----------------------------------------------------------------------------
    def upload(self, path: Path) -> bool:
        """Copy the complete local checkpoint ``path``; False when the bucket already holds it
        (:meth:`_copy_needed`). Raises CorruptCheckpoint when the local files do not match their
        marker, OSError on I/O.

        The marker is read and validated once, and every file it lists opened, before anything is
        copied; the copy uses those bytes and descriptors, so local retention removing the directory
        meanwhile cannot cut it short (POSIX: an unlinked file stays readable through a descriptor
        opened before, https://pubs.opengroup.org/onlinepubs/9799919799/functions/unlink.html)."""
        path = Path(path)
        marker, raw = read_marker_bytes(path)
        step = marker.step
        with ExitStack() as stack:
            sources = {name: stack.enter_context(open(path / name, "rb")) for name in marker.files}
            if not self._copy_needed(marker, path):
                return False
            self.fs.makedirs(self._remote(step), exist_ok=True)
            for name, entry in marker.files.items():
                with self.fs.open(self._remote(step, name), "wb") as dst:
                    digest, size = hash_stream(sources[name], dst)
                if (digest, size) != (entry.sha256, entry.bytes):
                    raise CorruptCheckpoint(f"{path / name}: local bytes do not match the marker; not uploaded")
                if self.verify_remote:
                    self._check_remote(step, name, entry.sha256, entry.bytes)
        self.fs.pipe_file(self._remote(step, MARKER), raw)
        self.failed.pop(step, None)
        self.prune()
        return True

    def _copy_needed(self, marker: Marker, path: Path) -> bool:
        """False when the bucket's copy of this step stands for the local one: its marker lists the
        same files, sizes and sha256 (so these very bytes were uploaded and read back before that
        marker was written) and the copy did not fail to restore in this process (:attr:`failed`).
        Any other copy is replaced, its marker removed first so that a copy half-replaced is never
        restored. Hashing the bucket's bytes here instead would download every checkpoint uploaded
        twice; a copy damaged later is found by the restore that reads it, and then replaced."""
        step = marker.step
        try:
            theirs: Marker | None = Marker.model_validate_json(self.fs.cat_file(self._remote(step, MARKER)))
        except FileNotFoundError:
            return True
        except ValidationError:
            theirs = None
        if theirs is not None and theirs.files == marker.files and step not in self.failed:
            return False
        why = self.failed.get(step) or "its marker does not list the same files and sha256"
        self.log(f"WARNING replacing the bucket copy {self._remote(step)} with {path}: {why}")
        self.fs.rm(self._remote(step, MARKER))
        return True

    def _check_remote(self, step: int, name: str, sha256: str, size: int) -> None:
        with self.fs.open(self._remote(step, name), "rb") as f:
            digest, n = hash_stream(f, None)
        if (digest, n) != (sha256, size):
            raise OSError(f"{self._remote(step, name)}: read back {n} bytes with another sha256; marker not written")

    def prune(self) -> None:
        """Keep the ``keep`` newest complete copies; older ones lose their marker first. Copies
        without a marker older than the newest complete one are leftovers of cut-short uploads."""
        complete = self.complete_steps()
        for step in complete[self.keep:]:
            self.fs.rm(self._remote(step, MARKER))
            self.fs.rm(self._remote(step), recursive=True)
        if complete:
            for step in self._steps("step-*"):
                if step < complete[0] and step not in complete[: self.keep]:
                    self.fs.rm(self._remote(step), recursive=True)

    # -- restore ----------------------------------------------------------------------------
    def restore_newer(self, ckpt_dir: Path, than: int) -> int | None:
        """Download the newest complete copy newer than step ``than`` into ``ckpt_dir`` (atomically:
        a temporary directory, verified, then renamed to ``step-N``); copies that fail their marker
        or their download are skipped for older ones, and noted in :attr:`failed`. Returns the step
        restored, or None."""
        ckpt_dir = Path(ckpt_dir)
        for step in self.complete_steps():
            if step <= than:
                return None
            final = ckpt_dir / step_dir_name(step)
            if final.exists():
                self.failed[step] = f"{final} exists but did not verify locally; not overwritten (move it aside)"
                self.log(f"WARNING {self.failed[step]}")
                continue
            tmp = ckpt_dir / f".tmp-bucket-{step_dir_name(step)}-{os.getpid()}"
            try:
                self._download(step, tmp)
                os.rename(tmp, final)
                fsync_dir(ckpt_dir)
                return step
            except (CorruptCheckpoint, OSError) as error:
                self.failed[step] = f"{type(error).__name__}: {error}"
                self.log(f"WARNING bucket copy {self._remote(step)} skipped: {error}")
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
        return None

    def _download(self, step: int, tmp: Path) -> None:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        write_marker(tmp, self.fs.cat_file(self._remote(step, MARKER)))
        marker = read_marker(tmp)
        if marker.step != step:
            raise CorruptCheckpoint(f"the marker says step {marker.step}")
        for name in marker.files:
            with self.fs.open(self._remote(step, name), "rb") as src, open(tmp / name, "wb") as dst:
                hash_stream(src, dst)
                dst.flush()
                os.fsync(dst.fileno())
        verify(tmp)
        fsync_dir(tmp)


class Uploader:
    """A background thread that copies the newest submitted checkpoint (older pending ones are
    skipped: only the newest matters). Failures are logged, never raised into training."""

    def __init__(self, bucket: Bucket):
        self.bucket = bucket
        self._cv = threading.Condition()
        self._pending: Path | None = None
        self._current: Path | None = None  # the one being uploaded
        self._closed = False
        self.uploaded: list[int] = []
        self._thread = threading.Thread(target=self._run, name="ckpt-upload", daemon=True)
        self._thread.start()

    def submit(self, path: Path) -> None:
        if step_of(Path(path)) is None:
            raise ValueError(f"{path}: not a checkpoint directory (step-N); nothing to upload")
        with self._cv:
            self._pending = Path(path)
            self._cv.notify_all()

    def in_use(self) -> list[Path]:
        """The checkpoint being uploaded and the one queued next, which local retention keeps
        (``Checkpointer(in_use=...)``; :meth:`training.checkpoint.Checkpointer._prune` says why these
        two suffice). A path moves from queued to uploading under the lock: it is never missing."""
        with self._cv:
            return [p for p in (self._current, self._pending) if p is not None]

    def _run(self) -> None:
        while True:
            with self._cv:
                while self._pending is None and not self._closed:
                    self._cv.wait()
                if self._pending is None:
                    return
                path, self._pending = self._pending, None
                self._current = path
            try:
                if self.bucket.upload(path):
                    self.uploaded.append(cast(int, step_of(path)))  # submit admits step-N paths only
            except Exception as error:  # noqa: BLE001 - the disk still holds it; the next save tries again
                self.bucket.log(f"WARNING upload of {path} to {self.bucket.url} failed: {type(error).__name__}: {error}")
            with self._cv:
                self._current = None
                self._cv.notify_all()

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until nothing is pending or in flight; False on timeout."""
        with self._cv:
            return self._cv.wait_for(lambda: self._pending is None and self._current is None, timeout)

    def close(self, timeout: float | None = None) -> bool:
        done = self.flush(timeout)
        with self._cv:
            self._closed = True
            self._cv.notify_all()
        return done
