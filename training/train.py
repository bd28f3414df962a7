"""Resumable DDP trainer: ``torchrun ... -m training.train [flags]`` (see docs/training.md).

Every start resumes from the newest complete checkpoint found on any node (or starts at step 0);
the same command line is therefore correct for the first start and for every restart.
Exit codes: :mod:`training.exitcodes` (0 done, 75 stopped for a preemption after a save).
"""
from __future__ import annotations

import argparse
import os
import random
import re
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from . import exitcodes
from .config import FIELDS

if TYPE_CHECKING:
    from .data import ImageFolderData, SyntheticData
from .model import create_model, params_sha256

# The flags a checkpoint records (its ``args``) and what a relaunch with another value means.
CHANGE_WARNED = ("model", "batch_size", "seed", "image_size", "num_classes")  # not the run that was saved
CHANGE_APPLIED = ("steps", "lr", "weight_decay", "warmup_steps", "drop_path")  # the new value takes effect


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
    """The job's settings (training/config.py, shared with the spec's ``training:`` section) and
    the node-side flags only the launcher and the tests set."""
    p = argparse.ArgumentParser(prog="python -m training.train",
                                description="Resumable DDP trainer for spot instances (kit).")
    for s in FIELDS:
        if s.type is bool:
            p.add_argument(s.flag, action="store_true", help=s.help)
        else:
            p.add_argument(s.flag, type=s.type, default=s.default, choices=s.choices, help=s.help)
    p.add_argument("--weight-decay", type=float, default=0.05)
    p.add_argument("--workers", type=int, default=4, help="DataLoader workers for ImageFolder data")
    p.add_argument("--stop-file", default=None, help="appearance of this file = stop request")
    p.add_argument("--progress-file", default=None,
                   help="node-local JSON progress file (local rank 0 of every node rewrites it)")
    p.add_argument("--ckpt-bucket", default=None,
                   help="durable copy of the newest checkpoint, an fsspec URL (s3://bucket/prefix, gs://bucket/prefix, "
                        "file:///dir); kit sets it from the spec's checkpoint_bucket")
    p.add_argument("--peak-tflops", type=float, default=None, help="per-device peak for MFU (default: table)")
    p.add_argument("--dist-timeout-s", type=float, default=180.0,
                   help="collective timeout: how long surviving ranks wait for a vanished peer before exiting")
    p.add_argument("--throttle-s", type=float, default=0.0, help=argparse.SUPPRESS)  # tests: slow steps down
    # tests: stochastic depth, so a train step consumes RNG (an unrestored RNG changes the digest)
    p.add_argument("--drop-path", type=float, default=0.0, help=argparse.SUPPRESS)
    # tests: sleep twice inside every checkpoint write (a write is reliably in flight)
    p.add_argument("--ckpt-write-delay-s", type=float, default=0.0, help=argparse.SUPPRESS)
    return p


def _setting_problem(args) -> str | None:
    """The shared settings' bounds (training/config.py), as the spec checks them too."""
    import math

    for s in FIELDS:
        value = getattr(args, s.name)
        if value is None or s.type not in (int, float):
            continue
        if s.type is float and not math.isfinite(value):
            return f"{s.flag} must be a finite number"
        if s.minimum is not None and value < s.minimum:
            return f"{s.flag} must be >= {s.minimum:g}"
        if s.positive and value <= 0:
            return f"{s.flag} must be > 0"
    return None


def validate(args, check_paths: bool = True) -> str | None:
    """What is wrong with the flags, or None. ``check_paths=False`` (training.launch's pre-check)
    judges the flags alone: a data directory that is not mounted yet is not a typo, and the
    launcher's exit 2 is final (RestartPreventExitStatus) while the trainer's is retried."""
    problem = _setting_problem(args)
    if problem:
        return problem
    if args.dist_timeout_s <= 0:
        return "--dist-timeout-s must be > 0"
    if not 0.0 <= args.drop_path < 1.0:
        return "--drop-path must be in [0, 1)"
    if args.ckpt_bucket is not None and not re.fullmatch(r"[a-z][a-z0-9+.-]*://\S+", args.ckpt_bucket):
        return f"--ckpt-bucket {args.ckpt_bucket!r}: not a URL (s3://bucket/prefix, gs://bucket/prefix, file:///dir)"
    if check_paths and args.data != "synthetic" and not Path(args.data).is_dir():
        return f"--data {args.data}: not 'synthetic' and not a directory (ImageFolder layout: root/class/img)"
    return None


def rng_state(cuda: bool) -> dict:
    import numpy as np
    import torch

    algo, keys, pos, has_gauss, cached = cast(tuple[str, Any, int, int, float], np.random.get_state(legacy=True))
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


def inductor_cache_dir(ckpt_dir: str) -> str:
    """torch.compile cache on the persistent disk (next to the checkpoint directory), so the first
    step after a resume reuses the compiled kernels instead of recompiling from scratch."""
    return str(Path(ckpt_dir).resolve().parent / "torchinductor-cache")


@dataclass
class Resume:
    """Where the run continues: the newest step saved anywhere, who holds it, and whether every
    node's writer holds it (a replaced node that got the state by broadcast does not)."""

    step: int = -1
    source_rank: int = -1
    path: str | None = None
    saved_everywhere: bool = False


class Trainer:
    """One start of the resumable DDP trainer, in named steps: :meth:`setup` (device, process
    group, model, optimizer, data, checkpointer), :meth:`resume` (agree on the newest checkpoint
    anywhere, load it), :meth:`run` (train until ``--steps`` or a stop request, saving
    periodically, on a stop, and at the end). ``main`` only wires them."""

    def __init__(self, args: argparse.Namespace, stop, started_at: float):
        self.args = args
        self.stop = stop
        self.started_at = started_at
        self.step = 0
        self.last_saved = -1
        self.last_save_time = time.monotonic()
        self.step_time: float | None = None
        self.window = (time.perf_counter(), 0)  # (start, steps) of the throughput window
        self.first_step_logged = False

    # ------------------------------------------------------------------ logging
    def log(self, msg: str) -> None:
        if self.info.is_main:
            print(msg, flush=True)

    def warn(self, msg: str) -> None:
        print(f"[rank {self.info.rank}] {msg}", file=sys.stderr, flush=True)

    # ------------------------------------------------------------------ setup
    def setup(self) -> int | None:
        """Everything before the first step; an exit code when the flags cannot work here."""
        import torch

        from . import distributed as D

        args = self.args
        self.device_kind = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
        if self.device_kind == "cuda" and not torch.cuda.is_available():
            print("error: --device cuda but no CUDA device is visible", file=sys.stderr)
            return exitcodes.USAGE
        self.cuda = self.device_kind == "cuda"
        self.info = D.init_distributed(self.device_kind, timeout_s=args.dist_timeout_s)
        self._set_kernels_and_seeds()
        for build in (self._build_model, self._build_data):
            failed = build()
            if failed is not None:
                return failed
        self._build_checkpointer()
        return None

    def _set_kernels_and_seeds(self) -> None:
        import numpy as np
        import torch

        if self.args.deterministic:
            torch.use_deterministic_algorithms(True)
            torch.backends.cudnn.deterministic = True
            torch.backends.cudnn.benchmark = False
        elif self.cuda:
            torch.backends.cuda.matmul.allow_tf32 = True
            torch.backends.cudnn.allow_tf32 = True
            torch.backends.cudnn.benchmark = True
        random.seed(self.args.seed + self.info.rank)
        np.random.seed((self.args.seed + self.info.rank) % (2**32))
        torch.manual_seed(self.args.seed)  # same initial weights on every rank

    def _build_model(self) -> int | None:
        import torch

        from .metrics import peak_flops, train_flops_per_sample
        from .optim import make_optimizer, make_scheduler

        args = self.args
        try:
            self.raw_model = create_model(args.model, args.num_classes, args.image_size, args.drop_path)
        except RuntimeError as e:
            print(f"error: --model {args.model}: {e}", file=sys.stderr)
            return exitcodes.USAGE
        self.raw_model.to(self.info.device).train()
        torch.manual_seed(args.seed * 7919 + self.info.rank)
        self.flops_per_sample = train_flops_per_sample(self.raw_model, args.model, args.image_size, self.device_kind)
        self.peak = peak_flops(self.device_kind, args.peak_tflops)
        self.optimizer = make_optimizer(self.raw_model, args.lr, args.weight_decay, self.device_kind)
        self.scheduler = make_scheduler(self.optimizer, args.warmup_steps, args.steps)
        self.loss_fn = torch.nn.CrossEntropyLoss()
        return None

    def _build_data(self) -> int | None:
        from .data import ImageFolderData, SyntheticData

        args, info = self.args, self.info
        self.data: SyntheticData | ImageFolderData
        if args.data == "synthetic":
            self.data = SyntheticData(args.batch_size, args.image_size, args.num_classes, args.seed, info.rank,
                                      info.device)
            return None
        self.data = ImageFolderData(args.data, args.batch_size, args.image_size, args.seed, info.rank,
                                    info.world_size, info.device, args.workers)
        if self.data.num_classes > args.num_classes:
            print(f"error: --data {args.data} has {self.data.num_classes} classes but --num-classes is "
                  f"{args.num_classes}", file=sys.stderr)
            return exitcodes.USAGE
        return None

    def _build_checkpointer(self) -> None:
        from .checkpoint import Checkpointer
        from .progress import ProgressWriter

        args = self.args
        # The durable tier (training/bucket.py): rank 0 alone copies checkpoints and restores from them.
        self.bucket, self.uploader = None, None
        if args.ckpt_bucket and self.info.is_main:
            from .bucket import Bucket, Uploader

            self.bucket = Bucket(args.ckpt_bucket, keep=2, log=self.warn)
            self.uploader = Uploader(self.bucket)
        # retention keeps what the uploader still reads (Checkpointer._prune says why that suffices)
        self.ckpt = Checkpointer(args.ckpt_dir, keep=args.keep, writer=self.info.is_node_writer, log=self.warn,
                                 write_delay_s=args.ckpt_write_delay_s,
                                 in_use=self.uploader.in_use if self.uploader is not None else None)
        # Every node's writer keeps its node-local progress file (launch.exit_status reads it to map
        # torchrun's 1 back to 75 on that node); all nodes write the same content.
        self.progress = ProgressWriter(args.progress_file, args.steps, enabled=self.info.is_node_writer)
        self.saved_args = {k: getattr(args, k) for k in CHANGE_WARNED + CHANGE_APPLIED}

    # ------------------------------------------------------------------ resume
    def _local_view(self) -> tuple[dict, tuple | None]:
        """What this rank knows: {step, path, writer, lost, error}, and the loaded state. ``lost``:
        the checkpoints a start from step 0 would pass over (fatal only when no rank resumes)."""
        from .checkpoint import (
            UnloadableCheckpoint,
            list_complete,
            marked_bytes,
            newest_loadable,
            quarantined,
            unmarked,
        )

        found, error, lost = None, None, []
        if self.info.is_node_writer:
            ckpt_dir = Path(self.args.ckpt_dir)
            lost_markers = unmarked(ckpt_dir)
            if list_complete(ckpt_dir) or quarantined(ckpt_dir) or lost_markers:
                lost.append(f"{ckpt_dir} holds checkpoints (or corrupt-* ones moved aside, or state files whose "
                            "marker is gone) but none verifies and loads")
            if lost_markers:
                self.warn(f"WARNING {ckpt_dir}: {', '.join(p.name for p in lost_markers)} hold state.pt but no "
                          "COMPLETE marker (lost or deleted): kept, not trusted, and no fresh start over them")
            try:
                found = newest_loadable(ckpt_dir, log=self.warn)
                if self.bucket is not None and self.bucket.restore_newer(ckpt_dir, found[0] if found else -1):
                    found = newest_loadable(ckpt_dir, log=self.warn)  # restore order: the disk, then the bucket
            except UnloadableCheckpoint as e:
                error = str(e)
            if found is None and self.bucket is not None and self.bucket.failed:
                lost.append(self._bucket_lost(self.bucket))
        if found is not None:
            self.progress.checkpoint(found[0], marked_bytes(found[1]))
        mine = {"step": found[0] if found else -1, "path": str(found[1]) if found else None,
                "writer": self.info.is_node_writer, "lost": lost, "error": error}
        return mine, found

    @staticmethod
    def _bucket_lost(bucket) -> str:
        """The bucket lists complete checkpoints and none restored: which, why, and what to do."""
        from .checkpoint import step_dir_name

        copies = "; ".join(f"{step_dir_name(s)}: {why}" for s, why in sorted(bucket.failed.items(), reverse=True))
        return (f"the bucket {bucket.url} lists complete checkpoints but none restored ({copies}). They are "
                "left in place. If the download failed, fix the bucket's access (credentials, network) and start "
                "again; if the copies are damaged, put a good checkpoint into the bucket (e.g. from another zone's "
                "disk), or point --ckpt-bucket at an empty prefix to start from step 0")

    def _resume_errors(self, everywhere: list[dict], newest: int) -> list[str]:
        errors = [f"rank {r}: {d['error']}" for r, d in enumerate(everywhere) if d["error"]]
        if not errors and newest < 0:
            errors = [f"rank {r}: {why}" for r, d in enumerate(everywhere) for why in d["lost"]]
        return errors

    def resume(self) -> int | None:
        """Every rank contributes what it holds; all decide from the same list; the holder of the
        newest step broadcasts it. CHECKPOINT_ERROR instead of a fresh start over checkpoints
        that exist but cannot be resumed from (never discard intact ones)."""
        from . import distributed as D

        mine, found = self._local_view()
        everywhere = D.all_gather_object(mine, self.info)
        newest = max(d["step"] for d in everywhere)
        errors = self._resume_errors(everywhere, newest)
        if errors:
            if self.info.is_main:
                for e in errors:
                    print(f"error: cannot resume: {e}", file=sys.stderr, flush=True)
                print("error: refusing to start from step 0 while checkpoints exist. Fix the environment (e.g. "
                      "the torch version) or move the checkpoint directory (and the --ckpt-bucket prefix's "
                      "checkpoints) aside to start fresh.", file=sys.stderr, flush=True)
            D.destroy()
            return exitcodes.CHECKPOINT_ERROR
        if newest >= 0:
            src = min(r for r, d in enumerate(everywhere) if d["step"] == newest)
            point = Resume(step=newest, source_rank=src, path=everywhere[src]["path"],
                           saved_everywhere=all(d["step"] == newest for d in everywhere if d["writer"]))
            held = found[2] if found is not None and self.info.rank == src else None  # src holds the newest
            self._load(D.broadcast_state(held, src, self.info), point)
        return None

    def _load(self, state: dict, point: Resume) -> None:
        self.raw_model.load_state_dict(state["model"])
        self._load_optimizer(state)
        self.step = int(state["step"])
        # this step is saved everywhere only if every node's writer holds it; otherwise the
        # stop/final/periodic save of this step is not skipped
        self.last_saved = self.step if point.saved_everywhere else -1
        self._load_rank_states(state)
        self._report_changed_flags(state.get("args", {}))
        self.log(f"resumed step={self.step} from {point.path}")

    def _load_optimizer(self, state: dict) -> None:
        """Moments, AdamW step counts and the schedule's position come from the checkpoint, the
        hyperparameters from this launch's flags. ``load_state_dict`` alone would bring back the saved
        peak lr (``initial_lr``, ``base_lrs``) and weight decay and so ignore a relaunch with another
        ``--lr``/``--weight-decay``. The schedule's shape (``--warmup-steps``, ``--steps``) is the
        LambdaLR's function, which its state does not hold (only a callable object's attributes are
        saved: https://pytorch.org/docs/stable/generated/torch.optim.lr_scheduler.LambdaLR.html)."""
        flags = [{k: g[k] for k in ("initial_lr", "weight_decay")} for g in self.optimizer.param_groups]
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        groups, sched = self.optimizer.param_groups, self.scheduler
        for group, own in zip(groups, flags):
            group.update(own)
        sched.base_lrs = [g["initial_lr"] for g in groups]
        # the lr the next step uses, as the last scheduler.step() computes it (LambdaLR.get_lr:
        # base_lr * lr_lambda(last_epoch)), so unchanged flags give the saved value bit for bit
        for group, base, factor in zip(groups, sched.base_lrs, sched.lr_lambdas):
            group["lr"] = base * factor(sched.last_epoch)

    def _load_rank_states(self, state: dict) -> None:
        """This rank's RNG and every saved rank's data position (the data derives this rank's own)."""
        info = self.info
        saved_world = int(state.get("world_size", info.world_size))
        if saved_world != info.world_size:
            self.warn(f"WARNING checkpoint world size {saved_world} != {info.world_size}: the data position "
                      "carries over (the epoch continues with its unread samples), per-rank RNG streams do not; "
                      "the run continues but is not bit-exact")
        key = f"rank_{info.rank}"
        if key in state.get("rng", {}):
            set_rng_state(state["rng"][key], self.cuda)
        datas = state.get("data", {})
        self.data.load_states(self.step, [datas.get(f"rank_{r}") for r in range(saved_world)])

    def _report_changed_flags(self, saved_args: dict) -> None:
        for k in CHANGE_WARNED + CHANGE_APPLIED:
            saved, now = saved_args.get(k), getattr(self.args, k)
            if saved is None or saved == now:
                continue
            flag = "--" + k.replace("_", "-")
            if k in CHANGE_WARNED:
                self.warn(f"WARNING checkpoint was made with {flag} {saved}, now {now}")
            else:
                self.log(f"flag_changed {flag} {saved} -> {now}: applied from step {self.step}")

    # ------------------------------------------------------------------ saving
    def full_state(self, at_step: int) -> dict:
        from . import distributed as D

        rngs = D.all_gather_object(rng_state(self.cuda), self.info)
        datas = D.all_gather_object(self.data.state_dict(at_step), self.info)
        return {"format": 1, "step": at_step, "world_size": self.info.world_size, "args": self.saved_args,
                "model": self.raw_model.state_dict(), "optimizer": self.optimizer.state_dict(),
                "scheduler": self.scheduler.state_dict(),
                "rng": {f"rank_{r}": s for r, s in enumerate(rngs)},
                "data": {f"rank_{r}": s for r, s in enumerate(datas)}}

    def note_finished(self, stats) -> None:
        """A background write that finished: logged, or (failed, cancelled) the step counts as unsaved."""
        if stats is None:
            return
        if stats.error or stats.cancelled:
            self.last_saved = -1
        elif stats.path and stats.write_s is not None:
            if stats.step >= (self.progress.checkpoint_step or -1):
                self.progress.checkpoint(stats.step, stats.bytes)  # its marker lists this one file
            self.log(f"ckpt_written step={stats.step} write_s={stats.write_s:.3f} bytes={stats.bytes}")
            self.upload(stats.step)

    def upload(self, step: int, wait_s: float | None = 0.0) -> None:
        """Hand the complete checkpoint of ``step`` to the background upload (rank 0 with a bucket);
        ``wait_s``: then wait that long for it (None: until done)."""
        from .checkpoint import step_dir_name

        if self.uploader is None or not self.ckpt.has(step):
            return
        self.uploader.submit(Path(self.args.ckpt_dir) / step_dir_name(step))
        if wait_s != 0.0 and not self.uploader.flush(wait_s):
            self.warn(f"WARNING the upload of step {step} did not finish within {wait_s:g} s; the disk holds it")

    def save_periodic(self, time_due: bool) -> None:
        args, step = self.args, self.step
        periodic = args.ckpt_every > 0 and step > 0 and step % args.ckpt_every == 0
        if step != self.last_saved and (periodic or (time_due and step > 0)):
            stats = self.ckpt.save(step, self.full_state(step), sync=False, if_missing=True)
            self.note_finished(stats.previous)
            self.last_saved, self.last_save_time = step, time.monotonic()
            self.log(f"ckpt step={step} stall_s={stats.stall_s:.4f} wait_s={stats.wait_s:.4f}")

    def saved_here(self) -> None:
        """After a synchronous save and its barrier: this node's disk holds the step (progress says so)."""
        if self.ckpt.has(self.step):
            self.progress.checkpoint(self.step, self.ckpt.bytes_of(self.step))

    def save_for_stop(self) -> int:
        """A stop request all ranks agreed on: save this step synchronously (unless every node holds
        it) and report the run as preempted. An in-flight periodic write of an older step is given up
        (this save supersedes it, and waiting for it doubled the stop save on an H100's disk: 5.6 s
        against 2.8 s, docs/benchmarks.md); one of this very step is waited for."""
        from . import bucket
        from . import distributed as D

        t0 = time.perf_counter()
        reason = self.stop.reason()
        in_flight = self.ckpt.wait() if self.last_saved == self.step else self.ckpt.cancel()
        self.note_finished(in_flight)
        wait_s = time.perf_counter() - t0
        if self.last_saved != self.step:
            self.ckpt.save(self.step, self.full_state(self.step), sync=True, if_missing=True)
            self.last_saved = self.step
        D.barrier(self.info)
        self.saved_here()
        save_s = time.perf_counter() - t0
        # The stop save is complete on every node (the barrier): say so now, so that the agent reports
        # its step within the notice (GCP gives 30 s), before the upload takes up to STOP_FLUSH_S of it
        self.progress.write(self.step, state="preempted", step_time_s=self.step_time, force=True)
        self.upload(self.step, wait_s=bucket.STOP_FLUSH_S)
        if self.info.is_node_writer:
            self.stop.consume_stop_file()
        self.log(f"stop step={self.step} reason={reason.replace(' ', '_')} emergency_save_s={save_s:.3f} "
                 f"wait_s={wait_s:.3f}")
        self.log(self.memory_line())
        return exitcodes.PREEMPTED

    def finish(self) -> None:
        """``--steps`` reached: the final checkpoint on every node, then ``done`` and the digest."""
        from . import distributed as D

        self.note_finished(self.ckpt.wait())
        if self.last_saved != self.step:
            self.ckpt.save(self.step, self.full_state(self.step), sync=True, if_missing=True)
        D.barrier(self.info)  # every node's final copy is on disk before any node reports "done"
        self.saved_here()
        self.upload(self.step, wait_s=None)  # the finished model is durable before "done"
        digest = params_sha256(self.raw_model) if (self.info.is_main or self.info.is_node_writer) else None
        self.progress.write(self.step, state="done", step_time_s=self.step_time, params_sha256=digest, force=True)
        self.log(f"params_sha256={digest}")
        self.log(self.memory_line())

    def memory_line(self) -> str:
        from .metrics import memory_line

        return memory_line(self.device_kind)

    # ------------------------------------------------------------------ training
    def wrap_model(self) -> None:
        import torch

        self.model = self.raw_model
        if self.info.is_distributed:
            # DDP (https://pytorch.org/docs/stable/notes/ddp.html) regroups its gradient buckets once,
            # after the first iteration, in the order the gradients became ready (_ddp_init_helper in
            # https://github.com/pytorch/pytorch/blob/main/torch/nn/parallel/distributed.py), so every
            # start's first step would reduce with another bucket layout than the steps after it. With
            # >= 3 ranks a ring all-reduce sums an element in an order that depends on its offset in the
            # bucket: a resumed run's digest would differ from an uninterrupted one. The reducer never
            # regroups with find_unused_parameters=True (Reducer::should_rebuild_buckets in
            # https://github.com/pytorch/pytorch/blob/main/torch/csrc/distributed/c10d/reducer.hpp); its
            # cost, a walk of the autograd graph per step and a small all-reduce of the used-parameter
            # map, is measured in docs/training.md, and only runs that ask for bit-exactness pay it.
            self.model = torch.nn.parallel.DistributedDataParallel(
                self.raw_model, device_ids=[self.info.local_rank] if self.cuda else None,
                find_unused_parameters=self.args.deterministic)
        if self.args.compile:
            self.model = torch.compile(self.model)

    def train_step(self):
        import torch

        x, y = self.data.batch(self.step)
        with torch.autocast(self.device_kind, dtype=torch.bfloat16, enabled=self.cuda):
            loss = self.loss_fn(self.model(x), y)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        self.optimizer.step()
        self.scheduler.step()
        self.step += 1
        self.window = (self.window[0], self.window[1] + 1)
        if self.args.throttle_s:
            time.sleep(self.args.throttle_s)
        return loss

    def _first_step_done(self) -> None:
        import torch

        if self.cuda:
            torch.cuda.synchronize()
        self.first_step_logged = True
        self.log(f"first_step_done step={self.step} since_process_start_s={time.time() - self.started_at:.3f}")
        if self.cuda:  # pinned staging buffers now, not inside the first periodic save's stall
            self.note_finished(self.ckpt.prepare({"model": self.raw_model.state_dict(),
                                                  "optimizer": self.optimizer.state_dict()}))
        self.window = (time.perf_counter(), 0)

    def log_step(self, loss) -> None:
        from .metrics import mfu

        args, info = self.args, self.info
        loss_v = loss.item()  # synchronises
        now = time.perf_counter()
        start, steps = self.window
        if steps:
            self.step_time = (now - start) / steps
            sps = args.batch_size * info.world_size / self.step_time
            m = mfu(sps, self.flops_per_sample, self.peak, info.world_size)
            self.log(f"step={self.step} loss={loss_v:.4f} samples_per_s={sps:.1f} "
                     f"mfu={'n/a' if m is None else f'{m:.3f}'} lr={self.scheduler.get_last_lr()[0]:.3e}")
        self.window = (now, 0)
        self.note_finished(self.ckpt.poll())

    def run(self) -> int:
        """Train until ``--steps`` (DONE) or an agreed stop request (PREEMPTED)."""
        from .stop import agree

        args = self.args
        self.wrap_model()
        self.last_save_time = time.monotonic()
        self.window = (time.perf_counter(), 0)
        self.progress.write(self.step, force=True)
        while True:
            time_due = (args.ckpt_every_seconds is not None
                        and time.monotonic() - self.last_save_time >= args.ckpt_every_seconds)
            stop_now, time_due = agree([self.stop.local_request(), time_due], self.info.control_group,
                                       self.info.world_size)
            if self.step >= args.steps:
                self.finish()
                return exitcodes.DONE
            if stop_now:
                return self.save_for_stop()
            self.save_periodic(time_due)
            loss = self.train_step()
            if not self.first_step_logged:
                self._first_step_done()
            if self.step % args.log_every == 0 or self.step == args.steps:
                self.log_step(loss)
            self.progress.write(self.step, step_time_s=self.step_time)

    def close(self) -> None:
        from . import bucket
        from . import distributed as D

        self.ckpt.close()
        if self.uploader is not None:
            self.uploader.close(bucket.STOP_FLUSH_S)
        self.data.close()
        D.barrier(self.info)
        D.destroy()


def main(argv: list[str] | None = None) -> int:
    started_at = process_start_time()
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
    trainer = Trainer(args, stop, started_at)
    code = trainer.setup() or trainer.resume()
    if code is not None:
        return code
    code = trainer.run()
    trainer.close()
    return code


if __name__ == "__main__":
    sys.exit(main())
