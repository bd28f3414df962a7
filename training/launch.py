"""Build (and run) the node's torchrun command from ``/etc/kit/train.env``-style values.

Used by ``kit-trainer.service`` (``ExecStart=<venv>/bin/python -m training.launch --env-file
/etc/kit/train.env``). Restart semantics for systemd (``Restart=on-failure``,
``RestartForceExitStatus=75``, ``RestartPreventExitStatus=2``): exit 0 = training finished (no
restart), exit 75 (``training.exitcodes.PREEMPTED``) or a crash = restart (resume from the newest
checkpoint), exit 2 = bad flags or env file (a restart cannot fix it). Under torchrun a worker's 75
surfaces as 1; :func:`main` maps it back to 75 via the progress file.

Before starting torchrun :func:`main`:

* exits 2 when ``TRAIN_FLAGS`` are not valid ``training.train`` flags (``validate``), so a typo does not
  restart the unit every 10 s forever;
* exits 75 without starting anything while the preemption marker (``PREEMPTED_MARKER``, default
  ``/run/kit/preempted``; the node agent writes it on a notice, ``/run`` is emptied at boot) exists: a node
  that is being preempted must not rejoin the rendezvous after its stop save;
* exits 0 when the progress file says the run already finished (``state == "done"`` at the requested
  ``--steps``), so a bootstrap re-run, a reboot or a restart does not train again.

While torchrun runs, SIGTERM/SIGINT/SIGHUP (``systemctl stop``, an OS shutdown) are not fatal: the
signal writes the stop file (all ranks agree on a step, save and exit 75, with no time cap of its own)
and is forwarded to torchrun only after ``--signal-grace`` seconds (or at once on a second signal), in
case a worker is still starting up and has not looked at the stop file yet. torchrun SIGKILLs its
workers 30 s after it gets a SIGTERM, so forwarding at once would cap the emergency save at 30 s. While
torchrun has no worker at all (still in its rendezvous: no one can see the stop file, and there is
nothing to save) the signal is forwarded at once: a restart of a node waiting for a replaced head
waited out the whole grace.
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import subprocess
import sys
import time

from training.contract import PROGRESS_FILE, write_atomic
from training.exitcodes import DONE, PREEMPTED, USAGE, outcome

DEFAULT_STOP_FILE = "/run/kit/stop"
DEFAULT_MARKER = "/run/kit/preempted"
DEFAULT_PROGRESS = PROGRESS_FILE
SIGNAL_GRACE_S = 60.0


def read_env_file(path: str) -> dict[str, str]:
    env: dict[str, str] = {}
    with open(path) as f:
        for line in f:
            line = line.strip()
            if not line or line.startswith("#") or "=" not in line:
                continue
            key, _, value = line.partition("=")
            value = value.strip()
            if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
                value = value[1:-1]
            env[key.strip()] = value
    return env


def _train_args(env: dict[str, str]) -> list[str]:
    flags = shlex.split(env.get("TRAIN_FLAGS", ""))
    args = list(flags)
    if env.get("CKPT_DIR") and "--ckpt-dir" not in flags:
        args += ["--ckpt-dir", env["CKPT_DIR"]]
    args += ["--stop-file", env.get("STOP_FILE", DEFAULT_STOP_FILE),
             "--progress-file", env.get("PROGRESS_FILE", DEFAULT_PROGRESS)]
    return args


def build_command(env: dict[str, str], python: str | None = None) -> list[str]:
    """torchrun command from NNODES, NODE_RANK, RDZV_ENDPOINT, NPROC_PER_NODE, RDZV_ID, CKPT_DIR,
    TRAIN_FLAGS (shell-quoted), STOP_FILE, PROGRESS_FILE."""
    missing = [k for k in ("NNODES", "NODE_RANK", "RDZV_ENDPOINT") if not env.get(k)]
    if missing:
        raise ValueError(f"train env lacks {', '.join(missing)}")
    python = python or env.get("KIT_PYTHON") or sys.executable
    nproc = env.get("NPROC_PER_NODE") or "1"
    try:
        nnodes, node_rank = int(env["NNODES"]), int(env["NODE_RANK"])
    except ValueError as err:
        raise ValueError(f"train env: NNODES and NODE_RANK must be integers ({err})") from err
    return [python, "-m", "torch.distributed.run", f"--nnodes={nnodes}",
            f"--nproc-per-node={nproc}", f"--node-rank={node_rank}", "--rdzv-backend=c10d",
            f"--rdzv-endpoint={env['RDZV_ENDPOINT']}", f"--rdzv-id={env.get('RDZV_ID', 'kit')}",
            "--max-restarts=0", "-m", "training.train", *_train_args(env)]


def parse_train_args(env: dict[str, str]) -> argparse.Namespace:
    """``training.train``'s own parser and ``validate`` on the flags (no torch import); ValueError if bad."""
    import contextlib
    import io

    from training.train import build_parser, validate

    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            args = build_parser().parse_args(_train_args(env))
    except SystemExit as exc:
        lines = err.getvalue().strip().splitlines()
        raise ValueError(f"bad TRAIN_FLAGS: {lines[-1] if lines else exc}") from None
    problem = validate(args, check_paths=False)
    if problem:
        raise ValueError(f"bad TRAIN_FLAGS: {problem}")
    return args


def finished(env: dict[str, str], steps: int) -> dict | None:
    """The progress file's document when it says the run finished at ``steps``, else None."""
    try:
        with open(env.get("PROGRESS_FILE", DEFAULT_PROGRESS)) as f:
            doc = json.load(f)
    except (OSError, ValueError):
        return None
    if not isinstance(doc, dict) or doc.get("state") != "done":
        return None
    try:
        return doc if int(doc.get("total_steps", -1)) == steps and int(doc.get("step", -1)) >= steps else None
    except (TypeError, ValueError):
        return None


def exit_status(returncode: int, progress_file: str | None, started_at: float) -> int:
    """0 only on a finished run; 75 after a preemption stop; the crash code otherwise."""
    result = outcome(returncode, progress_file, started_at)
    if result == "done":
        return DONE
    if result == "preempted":
        return PREEMPTED
    if returncode < 0:  # killed by a signal: the shell's convention, never 0 or 75
        return 128 + (-returncode)
    return returncode if returncode not in (DONE, PREEMPTED) else 1


def _write_stop_file(path: str, reason: str) -> None:
    try:
        write_atomic(path, reason + "\n")
    except OSError as err:
        print(f"launch: cannot write the stop file {path}: {err}", file=sys.stderr, flush=True)


def has_children(pid: int) -> bool | None:
    """Whether process ``pid`` has a child (torchrun's workers are its children); None where ``/proc``
    cannot tell (not Linux)."""
    try:
        entries = os.listdir("/proc")
    except OSError:
        return None
    for name in entries:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                stat = f.read()
        except OSError:  # gone meanwhile
            continue
        fields = stat[stat.rfind(b")") + 2:].split()  # after "(comm)", which may hold spaces
        if len(fields) > 1 and fields[1] == str(pid).encode():
            return True
    return False


class _SignalRelay:
    """The launcher's stop signals: the first writes the stop file and forwards the signal to
    torchrun ``grace`` seconds later (the trainer saves meanwhile); a second forwards at once."""

    def __init__(self, proc: subprocess.Popen, stop_file: str, grace: float) -> None:
        self.proc, self.stop_file, self.grace = proc, stop_file, grace
        self.signals = 0
        self.signum: int = signal.SIGTERM
        self.forward_at: float | None = None
        self.forwarded = False

    def on_signal(self, signum: int, frame: object) -> None:
        self.signals += 1
        if self.signals > 1:
            self.forward()
            return
        self.signum = signum
        name = signal.Signals(signum).name
        _write_stop_file(self.stop_file, f"launch: {name}")
        self.forward_at = time.monotonic() + self.grace
        print(f"launch: {name}: stop file written, waiting for the save", file=sys.stderr, flush=True)

    def due(self) -> bool:
        """A signal is waiting and its grace is over, or torchrun has no worker that could save."""
        return self.forward_at is not None and (time.monotonic() >= self.forward_at
                                                or has_children(self.proc.pid) is False)

    def forward(self) -> None:
        if self.forwarded or self.proc.poll() is not None:
            return
        self.forwarded = True
        print(f"launch: forwarding {signal.Signals(self.signum).name} to torchrun", file=sys.stderr, flush=True)
        try:
            self.proc.send_signal(self.signum)
        except ProcessLookupError:
            pass


def run(cmd: list[str], stop_file: str, grace: float) -> int:
    """Run torchrun; on SIGTERM/SIGINT/SIGHUP write the stop file, forward the signal after ``grace``
    seconds (at once on a second signal, or while torchrun has no worker) and keep waiting. Returns
    torchrun's exit code."""
    proc = subprocess.Popen(cmd)
    relay = _SignalRelay(proc, stop_file, grace)
    previous = {s: signal.signal(s, relay.on_signal) for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)}
    try:
        while True:
            try:
                return proc.wait(timeout=0.5)
            except subprocess.TimeoutExpired:
                if relay.due():
                    relay.forward()
    finally:
        for s, h in previous.items():
            signal.signal(s, h)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m training.launch")
    p.add_argument("--env-file", default="/etc/kit/train.env")
    p.add_argument("--print", action="store_true", help="print the command and exit")
    p.add_argument("--status", action="store_true",
                   help="print `finished`, `preempted` or `pending` (would train) and exit 0; 2 on bad flags")
    p.add_argument("--signal-grace", type=float, default=SIGNAL_GRACE_S,
                   help="seconds between a stop signal (stop file written) and forwarding it to torchrun")
    a = p.parse_args(argv)
    try:
        env = read_env_file(a.env_file)
        cmd = build_command(env)
    except (OSError, ValueError) as err:
        print(f"launch: {err}", file=sys.stderr)
        return USAGE
    if a.print:
        print(shlex.join(cmd))
        return 0
    try:
        steps = parse_train_args(env).steps
    except ValueError as err:
        print(f"launch: {err}", file=sys.stderr)
        return USAGE
    stop_file = env.get("STOP_FILE", DEFAULT_STOP_FILE)
    marker = env.get("PREEMPTED_MARKER", DEFAULT_MARKER)
    progress_file = env.get("PROGRESS_FILE", DEFAULT_PROGRESS)
    done = finished(env, steps)
    if a.status:
        print("finished" if done else "preempted" if os.path.exists(marker) else "pending")
        return 0
    try:
        os.unlink(stop_file)  # a stale stop request from the previous run (a notice also writes the marker)
    except OSError:
        pass
    if os.path.exists(marker):  # checked after the unlink: a notice racing with it leaves the marker
        print(f"launch: this node is being preempted ({marker} exists): not starting torchrun; "
              "the marker is cleared at boot", file=sys.stderr)
        return PREEMPTED
    if done:
        print(f"launch: training already finished (step {done.get('step')}/{steps} in {progress_file}); "
              "not starting. Raise --steps or remove the progress file to train again", file=sys.stderr)
        return DONE
    started = time.time()
    rc = run(cmd, stop_file, a.signal_grace)
    return exit_status(rc, progress_file, started)


if __name__ == "__main__":
    sys.exit(main())
