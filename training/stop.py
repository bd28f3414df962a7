"""Stop requests: signals and the stop file only set a flag; ranks agree at step boundaries.

The SIGTERM/SIGINT/SIGHUP/SIGQUIT handlers never do work themselves (a save started inside a
handler could run in the middle of a collective). The training loop calls :meth:`StopMonitor.poll`
once per step boundary; the local flag (signal seen or stop file present) is all-reduced with MAX
over the control-plane group so that every rank stops at the same step, even if only one of them got
the signal.
"""
from __future__ import annotations

import os
import signal
import time
from pathlib import Path


class StopMonitor:
    # torchrun forwards whichever of these it received (TORCHELASTIC_SIGNALS_TO_HANDLE's default)
    STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT)

    def __init__(self, stop_file: str | None = None, signals=STOP_SIGNALS):
        self.stop_file = Path(stop_file) if stop_file else None
        self.signal_seen: int | None = None
        self.signal_time: float | None = None
        self._previous = {}
        for sig in signals:
            self._previous[sig] = signal.signal(sig, self._handler)

    def _handler(self, signum, frame):
        if self.signal_seen is None:
            self.signal_seen = signum
            self.signal_time = time.time()

    def local_request(self) -> bool:
        if self.signal_seen is not None:
            return True
        return self.stop_file is not None and self.stop_file.exists()

    def reason(self) -> str:
        if self.signal_seen is not None:
            return signal.Signals(self.signal_seen).name
        if self.stop_file is not None and self.stop_file.exists():
            return f"stop file {self.stop_file}"
        return "peer rank"

    def consume_stop_file(self) -> None:
        """Remove the stop file after the stop save, so a relaunch on the same node trains again."""
        if self.stop_file is not None:
            try:
                self.stop_file.unlink()
            except FileNotFoundError:
                pass

    def restore(self) -> None:
        for sig, prev in self._previous.items():
            signal.signal(sig, prev)


def agree(flags: list[bool], group=None, world_size: int = 1) -> list[bool]:
    """All-reduce MAX a small vector of booleans (CPU tensor on the gloo control-plane group)."""
    if world_size <= 1:
        return [bool(f) for f in flags]
    import torch
    import torch.distributed as dist

    t = torch.tensor([1 if f else 0 for f in flags], dtype=torch.int32)
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
    return [bool(v) for v in t.tolist()]


def ignore_stop_signals_in_worker(worker_id: int | None = None) -> None:
    """DataLoader ``worker_init_fn``: workers share the trainer's process group, so torchrun's
    killpg(SIGTERM) reaches them too; they must survive until the main process has saved."""
    for sig in StopMonitor.STOP_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)
    os.environ["KIT_DATALOADER_WORKER"] = "1"
