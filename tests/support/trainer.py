"""Helpers for the trainer integration tests: launch `training.train` (directly or via torchrun),
watch its output, signal or SIGKILL its whole process tree."""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from kit.backends.local import descendants

REPO = Path(__file__).resolve().parents[2]
TINY = ["--model", "vit_tiny_patch16_224", "--image-size", "32", "--num-classes", "10", "--batch-size", "4",
        "--lr", "1e-3", "--warmup-steps", "2", "--device", "cpu", "--deterministic", "--log-every", "1"]
DIGEST_RE = re.compile(r"params_sha256=([0-9a-f]{64})")
RESUMED_RE = re.compile(r"resumed step=(\d+) from (\S+)")
STEP_RE = re.compile(r"^step=(\d+) ", re.MULTILINE)


def env() -> dict:
    e = dict(os.environ)
    e.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHONUNBUFFERED="1",
             PYTHONPATH=str(REPO) + os.pathsep + e.get("PYTHONPATH", ""))
    e.pop("RANK", None)
    e.pop("WORLD_SIZE", None)
    return e


def command(world: int, args: list[str], torchrun_args: list[str] | None = None) -> list[str]:
    if world == 1 and torchrun_args is None:
        return [sys.executable, "-m", "training.train", *args]
    tr = torchrun_args if torchrun_args is not None else ["--standalone", f"--nproc-per-node={world}"]
    return [sys.executable, "-m", "torch.distributed.run", *tr, "-m", "training.train", *args]


class Run:
    """A running trainer whose combined stdout+stderr is collected in the background."""

    def __init__(self, cmd: list[str]):
        self.cmd = cmd
        self.proc = subprocess.Popen(cmd, cwd=REPO, env=env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     text=True, start_new_session=True)
        self._chunks: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self._chunks.append(line)

    @property
    def output(self) -> str:
        return "".join(self._chunks)

    def wait_for(self, predicate, timeout: float = 180.0, what: str = "condition") -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if predicate():
                return
            if self.proc.poll() is not None and not predicate():
                self._reader.join(2)
                if predicate():
                    return
                raise AssertionError(f"trainer exited (rc={self.proc.returncode}) before {what}:\n{self.output}")
            time.sleep(0.02)
        raise AssertionError(f"timed out waiting for {what}:\n{self.output}")

    def max_step_logged(self) -> int:
        steps = [int(s) for s in STEP_RE.findall(self.output)]
        return max(steps) if steps else 0

    def finish(self, timeout: float = 300.0) -> int:
        try:
            rc = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            kill_tree(self.proc.pid)
            raise AssertionError(f"trainer did not finish in {timeout}s:\n{self.output}") from None
        self._reader.join(5)
        return rc

    def signal(self, sig: int) -> None:
        os.kill(self.proc.pid, sig)

    def kill_tree(self) -> None:
        kill_tree(self.proc.pid)
        self.proc.wait(30)
        self._reader.join(5)


def kill_tree(pid: int) -> None:
    """SIGKILL a process we started and all its descendants (by pid), like a node losing power."""
    for _ in range(5):
        pids = [pid, *descendants(pid)]
        for p in pids:
            try:
                os.kill(p, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.1)
        if not descendants(pid):
            break


def digest(output: str) -> str:
    found = DIGEST_RE.findall(output)
    assert found, f"no params_sha256 line in:\n{output}"
    return found[-1]


def resumed(output: str) -> tuple[int, str] | None:
    m = RESUMED_RE.search(output)
    return (int(m.group(1)), m.group(2)) if m else None


def complete_steps(ckpt_dir: Path) -> list[int]:
    if not ckpt_dir.is_dir():
        return []
    return sorted(int(p.name[5:]) for p in ckpt_dir.iterdir()
                  if p.name.startswith("step-") and (p / "COMPLETE").is_file())


def write_final_checkpoint(directory: Path, step: int) -> str:
    """A real checkpoint of the tiny model at ``step`` as the trainer lays it out; returns the
    parameters' digest (what the trainer would log as params_sha256)."""
    import torch

    from training.checkpoint import Checkpointer
    from training.model import create_model, parameter_names, params_sha256_of

    args = {"model": "vit_tiny_patch16_224", "num_classes": 10, "image_size": 32, "steps": step}
    model = create_model(args["model"], 10, 32)
    writer = Checkpointer(directory, keep=2, log=lambda *_: None)
    writer.save(step, {"step": step, "args": args, "model": model.state_dict(), "rng": {"t": torch.zeros(1)}},
                sync=True)
    writer.close()
    return params_sha256_of(model.state_dict(), parameter_names(args))
