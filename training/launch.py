"""Build (and run) the node's torchrun command from ``/etc/kit/train.env``-style values.

Used by ``kit-trainer.service`` (``ExecStart=<venv>/bin/python -m training.launch --env-file
/etc/kit/train.env``). Restart semantics for systemd (``Restart=on-failure``,
``RestartPreventExitStatus=0`` implied): exit 0 = training finished (no restart), exit 75
(``training.exitcodes.PREEMPTED``) or a crash = restart (resume from the newest checkpoint).
Under torchrun a worker's 75 surfaces as 1; :func:`main` maps it back to 75 via the progress file.
"""
from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys
import time

from training.exitcodes import DONE, PREEMPTED, outcome


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


def build_command(env: dict[str, str], python: str | None = None) -> list[str]:
    """torchrun command from NNODES, NODE_RANK, RDZV_ENDPOINT, NPROC_PER_NODE, RDZV_ID, CKPT_DIR,
    TRAIN_FLAGS (shell-quoted), STOP_FILE, PROGRESS_FILE."""
    missing = [k for k in ("NNODES", "NODE_RANK", "RDZV_ENDPOINT") if not env.get(k)]
    if missing:
        raise ValueError(f"train env lacks {', '.join(missing)}")
    python = python or env.get("KIT_PYTHON") or sys.executable
    nproc = env.get("NPROC_PER_NODE") or "1"
    cmd = [python, "-m", "torch.distributed.run", f"--nnodes={int(env['NNODES'])}",
           f"--nproc-per-node={nproc}", f"--node-rank={int(env['NODE_RANK'])}", "--rdzv-backend=c10d",
           f"--rdzv-endpoint={env['RDZV_ENDPOINT']}", f"--rdzv-id={env.get('RDZV_ID', 'kit')}",
           "--max-restarts=0", "-m", "training.train"]
    flags = shlex.split(env.get("TRAIN_FLAGS", ""))
    cmd += flags
    if env.get("CKPT_DIR") and "--ckpt-dir" not in flags:
        cmd += ["--ckpt-dir", env["CKPT_DIR"]]
    cmd += ["--stop-file", env.get("STOP_FILE", "/run/kit/stop"),
            "--progress-file", env.get("PROGRESS_FILE", "/mnt/kit-disk/progress.json")]
    return cmd


def exit_status(returncode: int, progress_file: str | None, started_at: float) -> int:
    """0 only on a finished run; 75 after a preemption stop; the crash code otherwise."""
    result = outcome(returncode, progress_file, started_at)
    if result == "done":
        return DONE
    if result == "preempted":
        return PREEMPTED
    return returncode if returncode not in (DONE, PREEMPTED) else 1


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m training.launch")
    p.add_argument("--env-file", default="/etc/kit/train.env")
    p.add_argument("--print", action="store_true", help="print the command and exit")
    a = p.parse_args(argv)
    try:
        env = read_env_file(a.env_file)
        cmd = build_command(env)
    except (OSError, ValueError) as err:
        print(f"launch: {err}", file=sys.stderr)
        return 2
    if a.print:
        print(shlex.join(cmd))
        return 0
    stop_file = env.get("STOP_FILE", "/run/kit/stop")
    try:
        os.unlink(stop_file)  # a stale stop request from the previous run
    except OSError:
        pass
    started = time.time()
    rc = subprocess.call(cmd)
    return exit_status(rc, env.get("PROGRESS_FILE", "/mnt/kit-disk/progress.json"), started)


if __name__ == "__main__":
    sys.exit(main())
