"""Atomic, verified, asynchronous checkpoints.

Layout of ``--ckpt-dir`` (one full copy per node; local rank 0 of each node writes it)::

    step-00000100/state.pt     torch.save of the whole training state (CPU tensors)
    step-00000100/COMPLETE     JSON marker, written last: step, sizes and sha256 of every file
    .tmp-step-00000120-<pid>/  a save in progress (or killed mid-write: ignored, removed on start)
    corrupt-step-00000140-<t>/ a checkpoint that failed verification, moved aside (newest one kept)

Write protocol: stage tensors into reusable host buffers (the only part the training loop waits
for on a periodic save), then in a background thread write ``state.pt`` into a fresh temporary
directory while hashing it, fsync it, write and fsync ``COMPLETE``, fsync the directory, rename it to
``step-N`` and fsync the parent. A directory named ``step-N`` therefore only ever appears complete;
the marker and checksums additionally catch later truncation or bit rot. Loading walks the complete
checkpoints newest first and falls back (with a warning) past any that fail verification.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import torch

MARKER = "COMPLETE"
STATE_FILE = "state.pt"
FORMAT = 1
_STEP_RE = re.compile(r"^step-(\d{8,})$")


class CorruptCheckpoint(Exception):
    pass


def step_dir_name(step: int) -> str:
    return f"step-{step:08d}"


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class _HashingWriter:
    """File-like object: torch.save writes through it, so hashing costs no second read."""

    def __init__(self, f):
        self.f = f
        self.h = hashlib.sha256()
        self.n = 0

    def write(self, b) -> int:
        mv = memoryview(b)
        self.h.update(mv)
        self.n += mv.nbytes
        return self.f.write(mv)

    def flush(self) -> None:
        self.f.flush()


def sha256_file(path: Path, chunk: int = 8 << 20) -> tuple[str, int]:
    h = hashlib.sha256()
    n = 0
    with open(path, "rb") as f:
        while True:
            b = f.read(chunk)
            if not b:
                break
            h.update(b)
            n += len(b)
    return h.hexdigest(), n


def list_complete(directory: Path) -> list[tuple[int, Path]]:
    """Checkpoints that carry a completeness marker, newest first (not yet verified)."""
    out = []
    if not directory.is_dir():
        return out
    for p in directory.iterdir():
        m = _STEP_RE.match(p.name)
        if m and (p / MARKER).is_file():
            out.append((int(m.group(1)), p))
    out.sort(key=lambda t: t[0], reverse=True)
    return out


def verify(path: Path) -> dict:
    """Check the marker and every file's size and sha256; return the marker. Raises CorruptCheckpoint."""
    try:
        marker = json.loads((path / MARKER).read_text())
        files = marker["files"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise CorruptCheckpoint(f"{path}: unreadable marker ({e})") from e
    for name, meta in files.items():
        f = path / name
        try:
            size = f.stat().st_size
        except OSError as e:
            raise CorruptCheckpoint(f"{f}: missing ({e})") from e
        if size != meta["bytes"]:
            raise CorruptCheckpoint(f"{f}: {size} bytes, marker says {meta['bytes']} (truncated?)")
        digest, _ = sha256_file(f)
        if digest != meta["sha256"]:
            raise CorruptCheckpoint(f"{f}: sha256 mismatch")
    return marker


def read_verified(path: Path) -> dict:
    marker = verify(path)
    try:
        state = torch.load(path / STATE_FILE, map_location="cpu", weights_only=True)
    except Exception as e:
        raise CorruptCheckpoint(f"{path}: cannot load ({e})") from e
    if int(state.get("step", -1)) != int(marker["step"]):
        raise CorruptCheckpoint(f"{path}: step {state.get('step')} != marker {marker['step']}")
    return state


def newest_loadable(directory: Path, log=print, quarantine: bool = True) -> tuple[int, Path, dict] | None:
    """Newest checkpoint that verifies; corrupt newer ones are reported and (optionally) moved aside."""
    for step, path in list_complete(Path(directory)):
        try:
            return step, path, read_verified(path)
        except CorruptCheckpoint as e:
            log(f"WARNING checkpoint {path} is corrupt, falling back to the previous one: {e}")
            if quarantine:
                _quarantine(path, log)
    return None


def _quarantine(path: Path, log=print) -> None:
    target = path.with_name(f"corrupt-{path.name}-{int(time.time() * 1000)}")
    try:
        os.rename(path, target)
    except OSError as e:
        log(f"WARNING could not move {path} aside: {e}")
        return
    olds = sorted(p for p in path.parent.iterdir() if p.name.startswith("corrupt-") and p != target)
    for p in olds:
        shutil.rmtree(p, ignore_errors=True)


@dataclass
class SaveStats:
    step: int
    stall_s: float = 0.0      # time the training loop waited (previous write + staging)
    write_s: float | None = None  # background write duration (filled in when it finishes)
    bytes: int = 0
    path: str | None = None
    error: str | None = None


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

    def __init__(self, directory: str | os.PathLike, keep: int = 3, writer: bool = True, log=print):
        if keep < 2:
            raise ValueError("keep must be >= 2 (the newest may be mid-write when a node dies)")
        self.directory = Path(directory)
        self.keep = keep
        self.writer = writer
        self.log = log
        self.stager = HostStager()
        self._thread: threading.Thread | None = None
        self._pending: SaveStats | None = None
        self.history: list[SaveStats] = []
        if writer:
            self.directory.mkdir(parents=True, exist_ok=True)
            self._clean_tmp()

    def _clean_tmp(self) -> None:
        for p in self.directory.iterdir():
            if p.name.startswith(".tmp-"):
                shutil.rmtree(p, ignore_errors=True)

    # -- saving -------------------------------------------------------------------------------
    def prepare(self, state: dict) -> None:
        """Allocate the (pinned) staging buffers ahead of the first save, so its stall is only a copy."""
        if self.writer:
            self.stager.stage(state)
            if torch.cuda.is_available() and torch.cuda.is_initialized():
                torch.cuda.current_stream().synchronize()

    def wait(self) -> SaveStats | None:
        """Block until the in-flight background write (if any) has finished."""
        t = self._thread
        if t is not None:
            t.join()
            self._thread = None
        done, self._pending = self._pending, None
        return done

    def save(self, step: int, state: dict, sync: bool = False) -> SaveStats:
        """Save ``state`` (live tensors are fine: they are staged before this returns)."""
        t0 = time.perf_counter()
        self.wait()
        stats = SaveStats(step=step)
        if not self.writer:
            stats.stall_s = time.perf_counter() - t0
            return stats
        staged = self.stager.stage(state)
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            torch.cuda.current_stream().synchronize()
        stats.stall_s = time.perf_counter() - t0
        self.history.append(stats)
        if sync:
            self._write(step, staged, stats)
            if stats.error:
                raise OSError(stats.error)
        else:
            self._pending = stats
            self._thread = threading.Thread(target=self._write, args=(step, staged, stats),
                                            name=f"ckpt-write-{step}", daemon=True)
            self._thread.start()
        return stats

    def _write(self, step: int, staged: dict, stats: SaveStats) -> None:
        t0 = time.perf_counter()
        final = self.directory / step_dir_name(step)
        tmp = self.directory / f".tmp-{step_dir_name(step)}-{os.getpid()}-{threading.get_ident()}"
        try:
            if tmp.exists():
                shutil.rmtree(tmp)
            tmp.mkdir(parents=True)
            with open(tmp / STATE_FILE, "wb") as f:
                w = _HashingWriter(f)
                torch.save(staged, w)
                f.flush()
                os.fsync(f.fileno())
            marker = {"format": FORMAT, "step": step, "time": time.time(),
                      "files": {STATE_FILE: {"bytes": w.n, "sha256": w.h.hexdigest()}}}
            with open(tmp / MARKER, "w") as f:
                json.dump(marker, f)
                f.flush()
                os.fsync(f.fileno())
            _fsync_dir(tmp)
            if final.exists():  # same step saved again (e.g. after falling back past a corrupt one)
                trash = self.directory / f".tmp-replaced-{final.name}-{os.getpid()}"
                os.rename(final, trash)
                shutil.rmtree(trash, ignore_errors=True)
            os.rename(tmp, final)
            _fsync_dir(self.directory)
            stats.bytes = w.n
            stats.path = str(final)
            self._prune()
        except Exception as e:  # noqa: BLE001 - reported, training continues (periodic) / raises (sync)
            stats.error = f"checkpoint step {step} failed: {e}"
            self.log(f"ERROR {stats.error}")
            shutil.rmtree(tmp, ignore_errors=True)
        stats.write_s = time.perf_counter() - t0

    def _prune(self) -> None:
        for _, path in list_complete(self.directory)[self.keep:]:
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
