"""Harness: SIGKILL a checkpoint writer at random moments, check what loads.

Run as ``python tests/trainer_ckpt_harness.py DIR REPS SEED [atomic|naive]`` (naive = negative
control with a non-atomic writer, which must be caught). The parent imports torch once and
forks, per repetition, a child that keeps saving checkpoints through the real
``training.checkpoint.Checkpointer`` (asynchronous saves, some synchronous) and is SIGKILLed after a
random delay. After every kill the parent checks that the newest complete checkpoint (marker
present) verifies and loads with the right content, without falling back. Prints one JSON line.
"""
from __future__ import annotations

import json
import os
import random
import signal
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from training.checkpoint import Checkpointer, list_complete, newest_loadable

N = 1 << 20  # 4 MB payload + 4 MB "optimizer" per checkpoint


def state(step: int) -> dict:
    return {"step": step, "model": {"w": torch.full((N,), float(step))},
            "optimizer": {"m": torch.full((N,), float(-step)), "step": torch.tensor(float(step))},
            "rng": {"rank_0": {"python": random.getstate()}}}


def naive_write(self, step, staged, stats, cancel=None):
    """Negative control: marker first, data written in place (no tmp dir, no rename)."""
    import hashlib
    import io

    buf = io.BytesIO()
    torch.save(staged, buf)
    data = buf.getvalue()
    final = self.directory / f"step-{step:08d}"
    final.mkdir(exist_ok=True)
    marker = {"format": 1, "step": step,
              "files": {"state.pt": {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}}}
    (final / "COMPLETE").write_text(json.dumps(marker))
    with open(final / "state.pt", "wb") as f:
        for i in range(0, len(data), 1 << 16):
            f.write(data[i:i + (1 << 16)])
            f.flush()
            time.sleep(0.001)  # widen the window so the control fails reliably
    self._prune()


def child(directory: Path, start: int, mode: str) -> None:
    if mode == "naive":
        Checkpointer._write = naive_write
    ck = Checkpointer(directory, keep=3, writer=True, log=lambda m: None)
    step = start
    while True:
        step += 1
        ck.save(step, state(step), sync=(step % 5 == 0))


def main() -> int:
    directory, reps, seed = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    mode = sys.argv[4] if len(sys.argv) > 4 else "atomic"
    rng = random.Random(seed)
    directory.mkdir(parents=True, exist_ok=True)
    results = []
    for rep in range(reps):
        existing = list_complete(directory)
        start = existing[0][0] if existing else 0
        pid = os.fork()
        if pid == 0:  # child: never returns
            try:
                child(directory, start, mode)
            finally:
                os._exit(1)
        time.sleep(rng.uniform(0.02, 0.35))
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        tmp_left = [p.name for p in directory.iterdir() if p.name.startswith(".tmp-")]
        complete = list_complete(directory)
        warnings: list[str] = []
        loaded = newest_loadable(directory, log=warnings.append, quarantine=False)
        ok = True
        detail = ""
        if complete:
            if loaded is None:
                ok, detail = False, "nothing loads"
            else:
                step, _, st = loaded
                ok = (step == complete[0][0] and not warnings and st["step"] == step
                      and bool((st["model"]["w"] == float(step)).all())
                      and bool((st["optimizer"]["m"] == float(-step)).all()))
                detail = f"newest={complete[0][0]} loaded={step} warnings={warnings}"
        results.append({"rep": rep, "ok": ok, "mid_write": bool(tmp_left), "complete": len(complete),
                        "newest": complete[0][0] if complete else None, "detail": detail})
    print(json.dumps({"reps": reps, "results": results}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
