"""SIGKILL during checkpoint writes (>= 20 random moments) never leaves a newest complete
checkpoint that fails to load. A non-atomic writer (negative control) is caught by the same check."""
from __future__ import annotations

import json
import os
import subprocess
import sys

from tests.support import REPO

HARNESS = REPO / "tests" / "support" / "ckpt_harness.py"


def run_harness(tmp_path, reps, mode):
    env = dict(os.environ, OMP_NUM_THREADS="1")
    out = subprocess.run([sys.executable, str(HARNESS), str(tmp_path / mode), str(reps), "7", mode],
                         capture_output=True, text=True, env=env, timeout=300, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])["results"]


def test_d_sigkill_during_checkpoint_write_newest_complete_always_loads(tmp_path):
    results = run_harness(tmp_path, 24, "atomic")
    assert len(results) == 24
    bad = [r for r in results if not r["ok"]]
    assert not bad, bad
    assert sum(r["mid_write"] for r in results) >= 5, results  # the kills really hit writes in progress
    newest = [r["newest"] for r in results if r["newest"] is not None]
    assert newest == sorted(newest) and newest[-1] > newest[0]  # progress despite the kills


def test_d_negative_control_non_atomic_writer_is_detected(tmp_path):
    results = run_harness(tmp_path, 12, "naive")
    assert any(not r["ok"] for r in results), results


def _state(step: int, n: int = 1000) -> dict:
    import torch

    return {"step": step, "model": {"w": torch.arange(n, dtype=torch.float32) + step}}


def test_cancel_gives_up_the_write_in_flight_and_keeps_every_complete_checkpoint(tmp_path):
    """The stop save cancels an older periodic write instead of waiting for it: at once, nothing of
    it left behind, the checkpoints before it untouched, and the next save proceeds."""
    import time

    from training.checkpoint import Checkpointer, list_complete, read_verified

    ck = Checkpointer(tmp_path, keep=3)
    ck.save(1, _state(1), sync=True)
    ck.write_delay_s = 5.0  # the next write pauses 5 s before state.pt
    ck.save(2, _state(2))
    t0 = time.perf_counter()
    cancelled = ck.cancel()
    assert time.perf_counter() - t0 < 1.0
    assert cancelled is not None and cancelled.step == 2 and cancelled.cancelled and not cancelled.error
    assert [s for s, _ in list_complete(tmp_path)] == [1]
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".tmp-")]
    ck.write_delay_s = 0.0
    ck.save(3, _state(3), sync=True)
    assert [s for s, _ in list_complete(tmp_path)] == [3, 1]
    assert read_verified(tmp_path / "step-00000003")["model"]["w"][0].item() == 3.0
    assert ck.cancel() is None  # nothing in flight: nothing to give up


def test_a_cancel_stops_a_write_between_chunks_of_one_large_tensor(tmp_path, monkeypatch):
    """The writer syncs and checks for a cancel every SYNC_EVERY bytes, inside a tensor too, so a
    cancel never waits for a whole multi-gigabyte tensor or for a page cache full of it."""
    import hashlib
    import threading

    from training import checkpoint

    monkeypatch.setattr(checkpoint, "SYNC_EVERY", 1024)
    cancel, syncs = threading.Event(), []

    def fdatasync(fd):
        syncs.append(os.fstat(fd).st_size)
        if len(syncs) == 3:
            cancel.set()

    monkeypatch.setattr(checkpoint.os, "fdatasync", fdatasync)
    data = bytes(range(256)) * 40  # 10 KiB in one write call
    with open(tmp_path / "f", "wb") as f:
        w = checkpoint._HashingWriter(f, cancel)
        try:
            w.write(data)
            raised = False
        except checkpoint.SaveCancelled:
            raised = True
    assert raised and syncs == [1024, 2048, 3072] and w.n == 3072
    with open(tmp_path / "g", "wb") as f:  # not cancelled: the same bytes and hash as one write
        w = checkpoint._HashingWriter(f, threading.Event())
        assert w.write(memoryview(data)) == len(data)
    assert (tmp_path / "g").read_bytes() == data and w.h.hexdigest() == hashlib.sha256(data).hexdigest()


def test_a_cancel_inside_torch_save_is_reported_as_cancelled_not_as_a_failed_write(tmp_path, monkeypatch):
    """torch.save's C++ writer replaces the writer's SaveCancelled with its own error ("unexpected
    pos"); the cancel must still read as one (no ERROR line, nothing left behind)."""
    from training import checkpoint

    logs: list[str] = []
    ck = checkpoint.Checkpointer(tmp_path, keep=2, log=logs.append)
    monkeypatch.setattr(checkpoint, "SYNC_EVERY", 4096)
    syncs = []

    def fdatasync(fd):
        syncs.append(fd)
        if len(syncs) == 2:
            ck._cancel.set()  # as ck.cancel() does, while torch.save is writing

    monkeypatch.setattr(checkpoint.os, "fdatasync", fdatasync)
    ck.save(1, {"a": _state(1, 4000), "b": _state(2, 4000)})
    stats = ck.wait()
    assert stats is not None and stats.cancelled and stats.error is None, (stats, logs)
    assert not [m for m in logs if "ERROR" in m] and logs == ["checkpoint step 1 cancelled: a newer save supersedes it"]
    assert list(tmp_path.iterdir()) == []
