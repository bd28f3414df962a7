"""Trainer benchmark: throughput/MFU vs a tutorial-style baseline in the same run,
periodic-checkpoint stall, emergency-save time, resume time.

GPU (the reported configuration; an H100 or H200 is the target machine)::

    python bench/trainer.py --device cuda --out bench-trainer.json

CPU smoke (checks the harness end to end; numbers say nothing about GPUs)::

    python bench/trainer.py --smoke --out bench-trainer-cpu.json

Phases, each in its own process so GPU memory and caches do not leak between them:

1. baseline: random images made on the CPU in a ``DataLoader`` (``--baseline-workers`` workers,
   pinned memory), ``torch.optim.Adam``, eager, bf16 autocast on CUDA (the mixed-precision tutorial
   loop) -> samples/s.
2. kit trainer (``python -m training.train``, synthetic on-device data, fused AdamW, bf16, optional
   ``--compile``) with periodic asynchronous checkpoints -> samples/s, MFU, stall per periodic save
   (split into waiting for the previous write and staging), background write time; then, once no
   write is in flight, the stop file -> emergency (synchronous) save time, best case; exit 75.
3. relaunch with the same flags -> resume time = process start -> first finished step (includes
   imports, CUDA init, reading + verifying the checkpoint); then the stop file right after the next
   periodic save started (``ckpt step=`` line) -> emergency save time with a background write in
   flight (the realistic worst case of a preemption: the stop save gives that write of an older
   step up and saves the newer state; ``--ckpt-io`` compares that with waiting for the write).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

TARGETS = {"speedup_vs_baseline": 1.6, "stall_s": 0.5, "emergency_save_s": 5.0, "resume_s": 30.0}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    p.add_argument("--model", default="vit_base_patch16_224")
    p.add_argument("--image-size", type=int, default=224)
    p.add_argument("--num-classes", type=int, default=1000)
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--steps", type=int, default=300, help="measured trainer steps before the stop")
    p.add_argument("--baseline-steps", type=int, default=60)
    p.add_argument("--skip-steps", type=int, default=20, help="warm-up steps excluded from throughput")
    # 100 steps at the target speed (~37 ms/step) is ~3.7 s between saves, longer than one ~1 GB write,
    # so a periodic stall is staging only; the wait for the previous write is reported separately.
    p.add_argument("--ckpt-every", type=int, default=100)
    p.add_argument("--log-every", type=int, default=10)
    p.add_argument("--baseline-workers", type=int, default=8)
    p.add_argument("--compile", action="store_true", help="also measure the trainer with --compile")
    p.add_argument("--ckpt-dir", default=None, help="default: a fresh temp dir on the local disk")
    p.add_argument("--smoke", action="store_true",
                   help="CPU smoke preset: vit_tiny_patch16_224 @32px, batch 8, few steps")
    p.add_argument("--out", default=None, help="write the JSON result here")
    p.add_argument("--ckpt-io", action="store_true",
                   help="only time checkpoint I/O of the model + AdamW state on this machine's disk (no GPU needed)")
    p.add_argument("--repeats", type=int, default=3, help="--ckpt-io repetitions")
    p.add_argument("--run-baseline", action="store_true", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.smoke:
        a.device, a.model, a.image_size, a.num_classes = "cpu", "vit_tiny_patch16_224", 32, 10
        a.batch_size, a.steps, a.baseline_steps, a.skip_steps = 8, 40, 30, 5
        a.ckpt_every, a.log_every, a.baseline_workers = 10, 5, 2
    return a


# ---------------------------------------------------------------------------------------------
# phase 1: the tutorial-style baseline (runs in a child process: --run-baseline)
def run_baseline(a) -> dict:
    import timm
    import torch
    import torch.nn.functional as F

    class RandomImages(torch.utils.data.Dataset):
        def __init__(self, n, size, classes):
            self.n, self.size, self.classes = n, size, classes

        def __len__(self):
            return self.n

        def __getitem__(self, i):
            return torch.randn(3, self.size, self.size), int(torch.randint(0, self.classes, ()).item())

    cuda = a.device == "cuda"
    dev = torch.device(a.device)
    total = a.baseline_steps + a.skip_steps
    loader = torch.utils.data.DataLoader(
        RandomImages(total * a.batch_size, a.image_size, a.num_classes), batch_size=a.batch_size, shuffle=True,
        num_workers=a.baseline_workers, pin_memory=cuda, drop_last=True,
        persistent_workers=a.baseline_workers > 0)
    model = timm.create_model(a.model, num_classes=a.num_classes, img_size=a.image_size).to(dev).train()
    opt = torch.optim.Adam(model.parameters(), lr=1e-4)
    t0 = None
    for i, (x, y) in enumerate(loader):
        if i == a.skip_steps:
            if cuda:
                torch.cuda.synchronize()
            t0 = time.perf_counter()
        x, y = x.to(dev, non_blocking=True), y.to(dev, non_blocking=True)
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=cuda):
            loss = F.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    if cuda:
        torch.cuda.synchronize()
    dt = time.perf_counter() - t0
    from training.metrics import peak_memory

    peak = peak_memory(a.device)
    return {"samples_per_s": a.baseline_steps * a.batch_size / dt, "steps": a.baseline_steps,
            "workers": a.baseline_workers, "final_loss": float(loss), "peak_host_gb": peak["host"],
            "peak_gpu_gb": peak["gpu"], "peak_gpu_reserved_gb": peak["gpu_reserved"],
            "workers_pss_gb": children_pss_gb()}


def children_pss_gb() -> float | None:
    """The proportional set sizes (``Pss``: each shared page divided among the processes that map it, so
    the pages a forked worker shares with its parent are not counted twice) of this process's live
    children, summed, in GB: the baseline's ``DataLoader`` workers, which its own peak does not include;
    None where ``/proc/PID/smaps_rollup`` (Linux 4.14+) is not there."""
    me, total, found = os.getpid(), 0, False
    try:
        pids = [p for p in os.listdir("/proc") if p.isdigit()]
    except OSError:
        return None
    for pid in pids:
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
            if int(stat.rsplit(")", 1)[1].split()[1]) != me:  # field 4, the parent's pid, after "(comm)"
                continue
            pss = next(x for x in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines() if x.startswith("Pss:"))
        except (OSError, StopIteration, ValueError, IndexError):
            continue  # gone meanwhile, or not readable
        total, found = total + int(pss.split()[1]) * 1024, True
    return total / 1e9 if found else None


# ---------------------------------------------------------------------------------------------
class Proc:
    def __init__(self, cmd, env):
        self.t_launch = time.time()
        self.proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     text=True)
        self.lines: list[str] = []
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self):
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))
            sys.stderr.write("  | " + line)

    def wait_line(self, pattern, timeout, after=0):
        rx = re.compile(pattern)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for i, line in enumerate(self.lines[after:], after):
                m = rx.search(line)
                if m:
                    return i, m
            if self.proc.poll() is not None:
                self.reader.join(2)
                for i, line in enumerate(self.lines[after:], after):
                    if rx.search(line):
                        return i, rx.search(line)
                raise RuntimeError(f"trainer exited rc={self.proc.returncode} before /{pattern}/")
            time.sleep(0.05)
        raise TimeoutError(f"no /{pattern}/ within {timeout}s")

    def finish(self, timeout=600):
        rc = self.proc.wait(timeout)
        self.reader.join(5)
        return rc


def kv(line: str) -> dict:
    return dict(t.split("=", 1) for t in line.split() if "=" in t)


def run_trainer(a, ckpt_dir: Path, compile_: bool, env) -> dict:
    stop = ckpt_dir.parent / f"stop-{'c' if compile_ else 'e'}"
    flags = ["--model", a.model, "--image-size", str(a.image_size), "--num-classes", str(a.num_classes),
             "--batch-size", str(a.batch_size), "--steps", "1000000", "--warmup-steps", "10",
             "--ckpt-dir", str(ckpt_dir), "--ckpt-every", str(a.ckpt_every), "--keep", "2",
             "--log-every", str(a.log_every), "--device", a.device, "--stop-file", str(stop)]
    if compile_:
        flags.append("--compile")
    cmd = [sys.executable, "-m", "training.train", *flags]
    res: dict = {"command": "python -m training.train " + " ".join(flags), "compile": compile_}

    # run 1: throughput + periodic stalls, then emergency save
    p = Proc(cmd, env)
    target = a.steps + a.skip_steps
    i, _ = p.wait_line(rf"^step={target} ", timeout=1800)
    p.wait_line(r"^ckpt_written ", timeout=600, after=max(0, i - 5))  # stop when no write is in flight
    stop.write_text("bench\n")
    rc = p.finish()
    res["rc_stop"] = rc
    logs = [kv(x) for x in p.lines if x.startswith("step=")]
    measured = [d for d in logs if a.skip_steps < int(d["step"]) <= target]
    sps = [float(d["samples_per_s"]) for d in measured]
    mfus = [float(d["mfu"]) for d in measured if d.get("mfu") not in (None, "n/a")]
    res["samples_per_s"] = statistics.median(sps) if sps else None
    res["mfu"] = statistics.median(mfus) if mfus else None
    saves = [kv(x) for x in p.lines if x.startswith("ckpt step=")]
    stalls = [float(d["stall_s"]) for d in saves]
    waits = [float(d.get("wait_s", 0.0)) for d in saves]
    staging = [st - w for st, w in zip(stalls, waits)]
    writes = [(float(kv(x)["write_s"]), int(kv(x)["bytes"])) for x in p.lines if x.startswith("ckpt_written ")]
    res["stall_s_max"] = max(stalls) if stalls else None
    res["stall_s_mean"] = statistics.mean(stalls) if stalls else None
    res["stall_wait_s_max"] = max(waits) if waits else None  # waiting for the previous background write
    res["stall_staging_s_max"] = max(staging) if staging else None  # snapshot into host buffers
    res["periodic_saves"] = len(stalls)
    res["write_s_mean"] = statistics.mean(w for w, _ in writes) if writes else None
    res["checkpoint_bytes"] = writes[-1][1] if writes else None
    stop_lines = [kv(x) for x in p.lines if x.startswith("stop step=")]
    # best case: no background write in flight when the stop arrives
    res["emergency_save_s"] = float(stop_lines[-1]["emergency_save_s"]) if stop_lines else None
    res["stopped_at_step"] = int(stop_lines[-1]["step"]) if stop_lines else None
    memory = next((kv(x) for x in reversed(p.lines) if x.startswith("memory ")), {})
    for key in ("peak_host_gb", "peak_gpu_gb", "peak_gpu_reserved_gb"):  # training + periodic saves + stop save
        res[key] = None if memory.get(key, "n/a") == "n/a" else float(memory[key])

    # run 2: resume time (process start -> first finished step); then a stop right after the next
    # periodic save started, so the stop save must first wait for that background write
    p = Proc(cmd, env)
    i, m = p.wait_line(r"^first_step_done .*since_process_start_s=([0-9.]+)", timeout=1800)
    res["resume_s"] = float(m.group(1))
    res["resumed_line"] = next((x for x in p.lines if x.startswith("resumed step=")), None)
    p.wait_line(r"^ckpt step=", timeout=1800, after=i)
    stop.write_text("bench\n")
    res["rc_resume_stop"] = p.finish()
    stop_lines = [kv(x) for x in p.lines if x.startswith("stop step=")]
    res["emergency_save_in_flight_s"] = float(stop_lines[-1]["emergency_save_s"]) if stop_lines else None
    res["emergency_save_in_flight_wait_s"] = float(stop_lines[-1].get("wait_s", "nan")) if stop_lines else None
    return res


def _stop_save_in_flight(ck, state: dict, step: int, cancel: bool, after_s: float) -> float:
    """A stop save that lands ``after_s`` into a periodic background write of an older step, as
    training.train's save_for_stop does it (``cancel``) or as it did before (wait for the write)."""
    ck.save(step, state)
    time.sleep(after_s)
    t0 = time.perf_counter()
    ck.cancel() if cancel else ck.wait()
    ck.save(step + 1, state, sync=True)
    return time.perf_counter() - t0


def run_ckpt_io(a) -> dict:
    """Synchronous save (stop-save path) and verified load of the real model + AdamW state, host side;
    then a stop save that lands a quarter into a periodic write (by the fastest save's time), waiting
    for it (the baseline) and cancelling it (the trainer's way), alternating in the same run."""
    import torch

    sys.path.insert(0, str(REPO))
    from training.checkpoint import Checkpointer, newest_loadable
    from training.model import create_model
    from training.optim import make_optimizer, make_scheduler
    from training.train import rng_state

    model = create_model(a.model, a.num_classes, a.image_size)
    opt = make_optimizer(model, 1e-3)
    for prm in model.parameters():
        prm.grad = torch.zeros_like(prm)
    opt.step()  # materialise the AdamW moments
    sched = make_scheduler(opt, 10, 100)
    root = Path(a.ckpt_dir) if a.ckpt_dir else Path(tempfile.mkdtemp(prefix="kit-ckpt-io-"))
    res = {"model": a.model, "save_s": [], "stall_s": [], "load_s": [], "bytes": None, "dir": str(root),
           "stop_in_flight_wait_s": [], "stop_in_flight_cancel_s": []}
    try:
        ck = Checkpointer(root / "ckpt", keep=2)
        for i in range(a.repeats):
            state = {"format": 1, "step": i + 1, "world_size": 1, "model": model.state_dict(),
                     "optimizer": opt.state_dict(), "scheduler": sched.state_dict(),
                     "rng": {"rank_0": rng_state(False)}, "data": {"rank_0": {"step": i + 1}}}
            t0 = time.perf_counter()
            st = ck.save(i + 1, state, sync=True)
            res["save_s"].append(time.perf_counter() - t0)
            res["stall_s"].append(st.stall_s)
            res["bytes"] = st.bytes
            t0 = time.perf_counter()
            step, _, _ = newest_loadable(root / "ckpt")
            res["load_s"].append(time.perf_counter() - t0)
            assert step == i + 1
        for i in range(a.repeats):
            for cancel, key in ((False, "stop_in_flight_wait_s"), (True, "stop_in_flight_cancel_s")):
                res[key].append(_stop_save_in_flight(ck, state, 100 + 10 * i + 2 * cancel, cancel,
                                                     min(res["save_s"]) / 4))
    finally:
        if not a.ckpt_dir:
            shutil.rmtree(root, ignore_errors=True)
    return res


def environment(a) -> dict:
    import torch

    env = {"python": platform.python_version(), "torch": torch.__version__, "host": platform.node(),
           "cpus": os.cpu_count(), "device": a.device}
    if a.device == "cuda" and torch.cuda.is_available():
        env["gpu"] = torch.cuda.get_device_name()
    else:
        env["cpu"] = platform.processor() or platform.machine()
    return env


def verdicts(result: dict) -> dict:
    out = {}
    for name, r in result["trainer"].items():
        base = result["baseline"]["samples_per_s"]
        speed = (r["samples_per_s"] / base) if (r.get("samples_per_s") and base) else None
        r["speedup_vs_baseline"] = speed
        out[name] = {
            "speedup_vs_baseline": (speed, speed is not None and speed >= TARGETS["speedup_vs_baseline"]),
            "stall_s": (r["stall_s_max"], r["stall_s_max"] is not None and r["stall_s_max"] <= TARGETS["stall_s"]),
            "emergency_save_s": (r["emergency_save_s"], r["emergency_save_s"] is not None
                                 and r["emergency_save_s"] <= TARGETS["emergency_save_s"]),
            # the same target with a periodic write in flight at the stop (worst case)
            "emergency_save_in_flight_s": (r["emergency_save_in_flight_s"],
                                           r["emergency_save_in_flight_s"] is not None
                                           and r["emergency_save_in_flight_s"] <= TARGETS["emergency_save_s"]),
            "resume_s": (r["resume_s"], r["resume_s"] is not None and r["resume_s"] <= TARGETS["resume_s"]),
        }
    return out


def markdown(result: dict) -> str:
    header = ("| variant | samples/s | vs baseline | MFU | stall/save max (mean) | of which staging max "
              "| bg write | emergency save: idle / write in flight (wait) | resume | peak GPU (reserved) | peak host |")
    lines = [header, "|---|---|---|---|---|---|---|---|---|---|---|"]
    b = result["baseline"]
    workers = b.get("workers_pss_gb")
    in_workers = "" if workers is None else f" + {gb(workers)} (PSS) in {b['workers']} workers"
    lines.append(f"| baseline (CPU DataLoader, Adam, eager) | {b['samples_per_s']:.1f} | 1.00x | | | | | | "
                 f"| {gpu_memory(b)} | {gb(b.get('peak_host_gb'))}{in_workers} |")

    def sec(v, fmt=".2f"):
        return "n/a" if v is None else f"{v:{fmt}} s"

    for name, r in result["trainer"].items():
        mfu = "n/a" if r["mfu"] is None else f"{100 * r['mfu']:.1f}%"
        lines.append(
            f"| kit trainer {name} | {r['samples_per_s']:.1f} | {r['speedup_vs_baseline']:.2f}x | {mfu} "
            f"| {sec(r['stall_s_max'], '.3f')} ({sec(r['stall_s_mean'], '.3f')}) "
            f"| {sec(r['stall_staging_s_max'], '.3f')} | {sec(r['write_s_mean'])} "
            f"({(r['checkpoint_bytes'] or 0) / 1e9:.3f} GB) | {sec(r['emergency_save_s'])} / "
            f"{sec(r['emergency_save_in_flight_s'])} ({sec(r['emergency_save_in_flight_wait_s'])}) "
            f"| {sec(r['resume_s'], '.1f')} | {gpu_memory(r)} | {gb(r.get('peak_host_gb'))} |")
    return "\n".join(lines)


def gb(v: float | None) -> str:
    return "n/a" if v is None else f"{v:.2f} GB"


def gpu_memory(r: dict) -> str:
    return "n/a" if r.get("peak_gpu_gb") is None else f"{gb(r['peak_gpu_gb'])} ({gb(r.get('peak_gpu_reserved_gb'))})"


def main(argv=None) -> int:
    a = parse_args(argv)
    if a.run_baseline:
        print(json.dumps(run_baseline(a)))
        return 0
    if a.ckpt_io:
        res = {"environment": environment(a), "ckpt_io": run_ckpt_io(a)}
        print(json.dumps(res, indent=1))
        if a.out:
            Path(a.out).write_text(json.dumps(res, indent=1) + "\n")
        return 0
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    if a.device == "cpu":
        env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 2) // 2)))
    argv_now = sys.argv[1:] if argv is None else argv
    result = {"argv": argv_now, "environment": environment(a), "targets": TARGETS, "trainer": {}}

    print("== baseline", file=sys.stderr)
    out = subprocess.run([sys.executable, __file__, *argv_now, "--run-baseline"], cwd=REPO, env=env,
                         capture_output=True, text=True, check=False)
    if out.returncode != 0:
        print(out.stdout, out.stderr, file=sys.stderr)
        return 1
    result["baseline"] = json.loads(out.stdout.strip().splitlines()[-1])

    root = Path(a.ckpt_dir) if a.ckpt_dir else Path(tempfile.mkdtemp(prefix="kit-bench-"))
    try:
        for compile_ in ([False, True] if a.compile else [False]):
            name = "compile" if compile_ else "eager"
            print(f"== trainer {name}", file=sys.stderr)
            d = root / name / "ckpt"
            shutil.rmtree(d, ignore_errors=True)
            d.parent.mkdir(parents=True, exist_ok=True)
            result["trainer"][name] = run_trainer(a, d, compile_, env)
    finally:
        if not a.ckpt_dir:
            shutil.rmtree(root, ignore_errors=True)
    result["verdicts"] = verdicts(result)
    result["markdown"] = markdown(result)
    print(result["markdown"])
    print(json.dumps(result["verdicts"], indent=1))
    if a.out:
        Path(a.out).write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
