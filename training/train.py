"""Resumable DDP trainer: ``torchrun ... -m training.train [flags]`` (see docs/training.md).

Every start resumes from the newest complete checkpoint found on any node (or starts at step 0);
the same command line is therefore correct for the first start and for every restart.
Exit codes: :mod:`training.exitcodes` (0 done, 75 stopped for a preemption after a save).
"""
from __future__ import annotations

import argparse
import hashlib
import os
import random
import sys
import time
from pathlib import Path

from . import exitcodes


def process_start_time() -> float:
    """Unix time this process was started (Linux /proc), so resume time includes imports."""
    try:
        ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
        btime = next(int(line.split()[1]) for line in Path("/proc/stat").read_text().splitlines()
                     if line.startswith("btime"))
        return btime + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, StopIteration):
        return time.time()


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m training.train",
                                description="Resumable DDP trainer for spot instances (kit).")
    p.add_argument("--model", default="vit_base_patch16_224", help="timm model name")
    p.add_argument("--image-size", type=int, default=224)
    p.add_argument("--num-classes", type=int, default=1000)
    p.add_argument("--batch-size", type=int, default=32, help="per rank")
    p.add_argument("--steps", type=int, default=1000, help="total optimizer steps")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--weight-decay", type=float, default=0.05)
    p.add_argument("--warmup-steps", type=int, default=100)
    p.add_argument("--ckpt-dir", default="/mnt/kit-disk/ckpt", help="this node's checkpoint directory")
    p.add_argument("--ckpt-every", type=int, default=100, help="periodic save every N steps (0 = off)")
    p.add_argument("--ckpt-every-seconds", type=float, default=None, help="also save every S seconds")
    p.add_argument("--keep", type=int, default=3, help="complete checkpoints kept (>= 2)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", choices=["cpu", "cuda"], default=None, help="default: cuda if available")
    p.add_argument("--deterministic", action="store_true", help="deterministic kernels (bit-exact resume)")
    p.add_argument("--compile", action="store_true", help="torch.compile the model")
    p.add_argument("--data", default="synthetic", help="'synthetic' or an ImageFolder directory")
    p.add_argument("--workers", type=int, default=4, help="DataLoader workers for ImageFolder data")
    p.add_argument("--log-every", type=int, default=10)
    p.add_argument("--stop-file", default=None, help="appearance of this file = stop request")
    p.add_argument("--progress-file", default=None,
                   help="node-local JSON progress file (local rank 0 of every node rewrites it)")
    p.add_argument("--peak-tflops", type=float, default=None, help="per-device peak for MFU (default: table)")
    p.add_argument("--dist-timeout-s", type=float, default=180.0,
                   help="collective timeout: how long surviving ranks wait for a vanished peer before exiting")
    p.add_argument("--throttle-s", type=float, default=0.0, help=argparse.SUPPRESS)  # tests: slow steps down
    # tests: stochastic depth, so a train step consumes RNG (an unrestored RNG changes the digest)
    p.add_argument("--drop-path", type=float, default=0.0, help=argparse.SUPPRESS)
    # tests: sleep twice inside every checkpoint write (a write is reliably in flight)
    p.add_argument("--ckpt-write-delay-s", type=float, default=0.0, help=argparse.SUPPRESS)
    return p


def validate(args, check_paths: bool = True) -> str | None:
    """What is wrong with the flags, or None. ``check_paths=False`` (training.launch's pre-check)
    judges the flags alone: a data directory that is not mounted yet is not a typo, and the
    launcher's exit 2 is final (RestartPreventExitStatus) while the trainer's is retried."""
    if args.keep < 2:
        return "--keep must be >= 2 (the newest checkpoint may be mid-write when a node dies)"
    for name in ("steps", "batch_size", "image_size", "num_classes", "log_every"):
        if getattr(args, name) < 1:
            return f"--{name.replace('_', '-')} must be >= 1"
    if args.ckpt_every < 0 or args.warmup_steps < 0:
        return "--ckpt-every and --warmup-steps must be >= 0"
    if args.ckpt_every_seconds is not None and args.ckpt_every_seconds <= 0:
        return "--ckpt-every-seconds must be > 0"
    if args.dist_timeout_s <= 0:
        return "--dist-timeout-s must be > 0"
    if not 0.0 <= args.drop_path < 1.0:
        return "--drop-path must be in [0, 1)"
    if check_paths and args.data != "synthetic" and not Path(args.data).is_dir():
        return f"--data {args.data}: not 'synthetic' and not a directory (ImageFolder layout: root/class/img)"
    return None


def rng_state(cuda: bool) -> dict:
    import numpy as np
    import torch

    algo, keys, pos, has_gauss, cached = np.random.get_state()
    st = {"python": random.getstate(),
          "numpy": {"algo": algo, "keys": torch.from_numpy(keys.astype("int64")), "pos": int(pos),
                    "has_gauss": int(has_gauss), "cached": float(cached)},
          "torch": torch.get_rng_state()}
    if cuda:
        st["cuda"] = torch.cuda.get_rng_state()
    return st


def set_rng_state(st: dict, cuda: bool) -> None:
    import numpy as np
    import torch

    py = st["python"]
    random.setstate((py[0], tuple(py[1]), py[2]))
    n = st["numpy"]
    np.random.set_state((n["algo"], n["keys"].numpy().astype("uint32"), n["pos"], n["has_gauss"], n["cached"]))
    torch.set_rng_state(st["torch"])
    if cuda and "cuda" in st:
        torch.cuda.set_rng_state(st["cuda"])


def params_sha256(model) -> str:
    import torch

    names = {n for n, _ in model.named_parameters()}
    h = hashlib.sha256()
    with torch.no_grad():
        for k, v in model.state_dict().items():
            if k in names:
                h.update(v.detach().to("cpu").contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def create_model(name: str, num_classes: int, image_size: int, drop_path_rate: float = 0.0):
    import timm

    extra = {"drop_path_rate": drop_path_rate} if drop_path_rate else {}
    try:
        return timm.create_model(name, pretrained=False, num_classes=num_classes, img_size=image_size, **extra)
    except TypeError:  # models without an img_size argument (CNNs)
        return timm.create_model(name, pretrained=False, num_classes=num_classes, **extra)


def inductor_cache_dir(ckpt_dir: str) -> str:
    """torch.compile cache on the persistent disk (next to the checkpoint directory), so the first
    step after a resume reuses the compiled kernels instead of recompiling from scratch."""
    return str(Path(ckpt_dir).resolve().parent / "torchinductor-cache")


def main(argv: list[str] | None = None) -> int:
    t_start = process_start_time()
    args = build_parser().parse_args(argv)
    err = validate(args)
    if err:
        print(f"error: {err}", file=sys.stderr)
        return exitcodes.USAGE
    if args.deterministic:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    if args.compile and not os.environ.get("TORCHINDUCTOR_CACHE_DIR"):
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = inductor_cache_dir(args.ckpt_dir)

    from .stop import StopMonitor

    stop = StopMonitor(args.stop_file)  # before the heavy imports: a SIGTERM now is remembered, not fatal

    import torch

    from . import distributed as D
    from .checkpoint import (
        Checkpointer,
        UnloadableCheckpoint,
        list_complete,
        newest_loadable,
        quarantined,
        unmarked,
    )
    from .data import ImageFolderData, SyntheticData
    from .metrics import mfu, peak_flops, train_flops_per_sample
    from .optim import make_optimizer, make_scheduler
    from .progress import ProgressWriter
    from .stop import agree

    device_kind = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device_kind == "cuda" and not torch.cuda.is_available():
        print("error: --device cuda but no CUDA device is visible", file=sys.stderr)
        return exitcodes.USAGE
    cuda = device_kind == "cuda"
    info = D.init_distributed(device_kind, timeout_s=args.dist_timeout_s)

    def log(msg: str) -> None:
        if info.is_main:
            print(msg, flush=True)

    def warn(msg: str) -> None:
        print(f"[rank {info.rank}] {msg}", file=sys.stderr, flush=True)

    if args.deterministic:
        torch.use_deterministic_algorithms(True)
        torch.backends.cudnn.deterministic = True
        torch.backends.cudnn.benchmark = False
    elif cuda:
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
        torch.backends.cudnn.benchmark = True

    random.seed(args.seed + info.rank)
    import numpy as np

    np.random.seed((args.seed + info.rank) % (2**32))
    torch.manual_seed(args.seed)  # same initial weights on every rank
    try:
        raw_model = create_model(args.model, args.num_classes, args.image_size, args.drop_path)
    except RuntimeError as e:
        print(f"error: --model {args.model}: {e}", file=sys.stderr)
        return exitcodes.USAGE
    raw_model.to(info.device).train()
    torch.manual_seed(args.seed * 7919 + info.rank)
    flops_per_sample = train_flops_per_sample(raw_model, args.model, args.image_size, device_kind)
    peak = peak_flops(device_kind, args.peak_tflops)
    optimizer = make_optimizer(raw_model, args.lr, args.weight_decay, device_kind)
    scheduler = make_scheduler(optimizer, args.warmup_steps, args.steps)
    if args.data == "synthetic":
        data = SyntheticData(args.batch_size, args.image_size, args.num_classes, args.seed, info.rank, info.device)
    else:
        data = ImageFolderData(args.data, args.batch_size, args.image_size, args.seed, info.rank,
                               info.world_size, info.device, args.workers)
        if data.num_classes > args.num_classes:
            print(f"error: --data {args.data} has {data.num_classes} classes but --num-classes is "
                  f"{args.num_classes}", file=sys.stderr)
            return exitcodes.USAGE

    ckpt = Checkpointer(args.ckpt_dir, keep=args.keep, writer=info.is_node_writer, log=warn,
                        write_delay_s=args.ckpt_write_delay_s)

    # ---- resume: agree on the newest complete step anywhere; a holder broadcasts it ------------
    # Every rank contributes {step, path, writer, history, error}; all ranks decide from the same list.
    found, error, history = None, None, False
    if info.is_node_writer:
        ckpt_dir = Path(args.ckpt_dir)
        lost_markers = unmarked(ckpt_dir)
        history = bool(list_complete(ckpt_dir) or quarantined(ckpt_dir) or lost_markers)
        if lost_markers:
            warn(f"WARNING {ckpt_dir}: {', '.join(p.name for p in lost_markers)} hold state.pt but no COMPLETE "
                 "marker (lost or deleted): kept, not trusted, and no fresh start over them")
        try:
            found = newest_loadable(ckpt_dir, log=warn)
        except UnloadableCheckpoint as e:
            error = str(e)
    mine = {"step": found[0] if found else -1, "path": str(found[1]) if found else None,
            "writer": info.is_node_writer, "history": history, "error": error}
    everywhere = D.all_gather_object(mine, info)
    newest = max(d["step"] for d in everywhere)
    errors = [f"rank {r}: {d['error']}" for r, d in enumerate(everywhere) if d["error"]]
    if not errors and newest < 0 and any(d["history"] for d in everywhere):
        errors = [f"rank {r}: {args.ckpt_dir} holds checkpoints (or corrupt-* ones moved aside, or state files "
                  "whose marker is gone) but none verifies and loads" for r, d in enumerate(everywhere)
                  if d["history"]]
    if errors:
        # Never start from step 0 over existing checkpoints, never discard intact ones: stop loudly.
        if info.is_main:
            for e in errors:
                print(f"error: cannot resume: {e}", file=sys.stderr, flush=True)
            print("error: refusing to start from step 0 while checkpoints exist. Fix the environment (e.g. "
                  "the torch version) or move the checkpoint directory aside to start fresh.",
                  file=sys.stderr, flush=True)
        D.destroy()
        return exitcodes.CHECKPOINT_ERROR
    # This step is saved everywhere only if every node's writer holds it; otherwise (a replaced node
    # that received the state by broadcast) the stop/final/periodic save of this step is not skipped.
    resume_saved_everywhere = newest >= 0 and all(d["step"] == newest for d in everywhere if d["writer"])
    step = 0
    if newest >= 0:
        src = min(r for r, d in enumerate(everywhere) if d["step"] == newest)
        src_path = everywhere[src]["path"]
        state = D.broadcast_state(found[2] if info.rank == src else None, src, info)
        raw_model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        scheduler.load_state_dict(state["scheduler"])
        step = int(state["step"])
        key = f"rank_{info.rank}"
        same_world = int(state.get("world_size", info.world_size)) == info.world_size
        if not same_world:
            warn(f"WARNING checkpoint world size {state.get('world_size')} != {info.world_size}: "
                 "per-rank RNG/data positions do not carry over; the run continues but is not bit-exact")
        if key in state.get("rng", {}):
            set_rng_state(state["rng"][key], cuda)
        if same_world and key in state.get("data", {}):
            data.load_state_dict(state["data"][key])
        else:
            data.load_state_dict({"kind": "step", "step": step})
        for k in ("model", "batch_size", "seed", "image_size", "num_classes"):
            saved = state.get("args", {}).get(k)
            if saved is not None and saved != getattr(args, k):
                warn(f"WARNING checkpoint was made with --{k.replace('_', '-')} {saved}, now {getattr(args, k)}")
        del state
        log(f"resumed step={step} from {src_path}")
    found = None

    model = raw_model
    if info.is_distributed:
        model = torch.nn.parallel.DistributedDataParallel(
            raw_model, device_ids=[info.local_rank] if cuda else None)
    if args.compile:
        model = torch.compile(model)

    # Every node's writer keeps its node-local progress file (launch.exit_status reads it to map
    # torchrun's 1 back to 75 on that node); all nodes write the same content.
    progress = ProgressWriter(args.progress_file, args.steps, enabled=info.is_node_writer)
    saved_args = {"model": args.model, "batch_size": args.batch_size, "seed": args.seed,
                  "image_size": args.image_size, "num_classes": args.num_classes, "steps": args.steps}

    def full_state(at_step: int) -> dict:
        rngs = D.all_gather_object(rng_state(cuda), info)
        datas = D.all_gather_object(data.state_dict(at_step), info)
        return {"format": 1, "step": at_step, "world_size": info.world_size, "args": saved_args,
                "model": raw_model.state_dict(), "optimizer": optimizer.state_dict(),
                "scheduler": scheduler.state_dict(),
                "rng": {f"rank_{r}": s for r, s in enumerate(rngs)},
                "data": {f"rank_{r}": s for r, s in enumerate(datas)}}

    def note_finished(stats) -> None:
        nonlocal last_saved
        if stats is None:
            return
        if stats.error:
            last_saved = -1
        elif stats.path and stats.write_s is not None:
            log(f"ckpt_written step={stats.step} write_s={stats.write_s:.3f} bytes={stats.bytes}")

    loss_fn = torch.nn.CrossEntropyLoss()
    last_saved = step if resume_saved_everywhere else -1
    last_save_time = time.monotonic()
    window_t, window_steps = time.perf_counter(), 0
    step_time = None
    first_step_logged = False
    progress.write(step, force=True)

    code = exitcodes.DONE
    while True:
        time_due = (args.ckpt_every_seconds is not None
                    and time.monotonic() - last_save_time >= args.ckpt_every_seconds)
        stop_now, time_due = agree([stop.local_request(), time_due], info.control_group, info.world_size)
        if step >= args.steps:
            break
        if stop_now:
            t0 = time.perf_counter()
            reason = stop.reason()
            note_finished(ckpt.wait())  # an in-flight periodic write finishes first
            wait_s = time.perf_counter() - t0
            if last_saved != step:
                ckpt.save(step, full_state(step), sync=True, if_missing=True)
                last_saved = step
            D.barrier(info)
            save_s = time.perf_counter() - t0
            if info.is_node_writer:
                stop.consume_stop_file()
            log(f"stop step={step} reason={reason.replace(' ', '_')} emergency_save_s={save_s:.3f} "
                f"wait_s={wait_s:.3f}")
            progress.write(step, state="preempted", step_time_s=step_time, force=True)
            code = exitcodes.PREEMPTED
            break
        periodic = args.ckpt_every > 0 and step > 0 and step % args.ckpt_every == 0
        if step != last_saved and (periodic or (time_due and step > 0)):
            stats = ckpt.save(step, full_state(step), sync=False, if_missing=True)
            note_finished(stats.previous)
            last_saved, last_save_time = step, time.monotonic()
            log(f"ckpt step={step} stall_s={stats.stall_s:.4f} wait_s={stats.wait_s:.4f}")

        x, y = data.batch(step)
        with torch.autocast(device_kind, dtype=torch.bfloat16, enabled=cuda):
            loss = loss_fn(model(x), y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        scheduler.step()
        step += 1
        window_steps += 1
        if args.throttle_s:
            time.sleep(args.throttle_s)
        if not first_step_logged:
            if cuda:
                torch.cuda.synchronize()
            first_step_logged = True
            log(f"first_step_done step={step} since_process_start_s={time.time() - t_start:.3f}")
            if cuda:  # pinned staging buffers now, not inside the first periodic save's stall
                note_finished(ckpt.prepare({"model": raw_model.state_dict(), "optimizer": optimizer.state_dict()}))
            window_t, window_steps = time.perf_counter(), 0
        if step % args.log_every == 0 or step == args.steps:
            loss_v = loss.item()  # synchronises
            now = time.perf_counter()
            if window_steps:
                step_time = (now - window_t) / window_steps
                sps = args.batch_size * info.world_size / step_time
                m = mfu(sps, flops_per_sample, peak, info.world_size)
                log(f"step={step} loss={loss_v:.4f} samples_per_s={sps:.1f} "
                    f"mfu={'n/a' if m is None else f'{m:.3f}'} lr={scheduler.get_last_lr()[0]:.3e}")
            window_t, window_steps = now, 0
            note_finished(ckpt.poll())
        progress.write(step, step_time_s=step_time)

    if code == exitcodes.DONE:
        note_finished(ckpt.wait())
        if last_saved != step:
            ckpt.save(step, full_state(step), sync=True, if_missing=True)
        D.barrier(info)  # every node's final copy is on disk before any node reports "done"
        digest = params_sha256(raw_model) if (info.is_main or info.is_node_writer) else None
        progress.write(step, state="done", step_time_s=step_time, params_sha256=digest, force=True)
        log(f"params_sha256={digest}")
    ckpt.close()
    data.close()
    D.barrier(info)
    D.destroy()
    return code


if __name__ == "__main__":
    sys.exit(main())
