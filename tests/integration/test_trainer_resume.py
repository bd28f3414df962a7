"""Interrupted + resumed runs end with the same params_sha256 as an uninterrupted one.

CPU, gloo, `vit_tiny_patch16_224 --image-size 32`, `--deterministic`, 1 and 2 ranks (2 ranks via torchrun).
Every run uses stochastic depth (hidden `--drop-path`), so a training step consumes the torch RNG and
an RNG state that is not restored exactly changes the digest. The hidden `--ckpt-write-delay-s` makes
every checkpoint write take a while, so "during a write" is a moment the tests can wait for.
One chain per world size keeps the number of process starts small (2 cores shared):

    reference: 12 steps uninterrupted                                   -> digest R
    run 1:     SIGKILL (whole process tree, no save) while step-9 is being written (state.pt written,
               no marker yet), step 6 complete                          (b) + trainer-level (d)
    run 2:     resumes from the newest periodic checkpoint, SIGTERM while the step-9 write is in flight
               -> waits for it, saves the stop step, exit 75            (a)
    run 3:     resumes from the stop checkpoint, finishes                 -> digest == R  (a)+(b)
    run 3c:    on a copy whose newest checkpoint was truncated: falls back, finishes -> digest == R  (c)
"""
from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import time

import pytest

from tests.support.trainer import TINY, Run, command, complete_steps, digest, resumed
from training import exitcodes
from training.checkpoint import marked_bytes, step_dir_name
from training.launch import exit_status

pytestmark = pytest.mark.slow

STEPS = 12
EVERY = 3


DROP_PATH = ["--drop-path", "0.1"]


def args_for(ckpt, progress=None, throttle=0.0, extra=(), write_delay=0.0):
    a = [*TINY, *DROP_PATH, "--steps", str(STEPS), "--ckpt-every", str(EVERY), "--keep", "2", "--ckpt-dir", str(ckpt)]
    if progress:
        a += ["--progress-file", str(progress)]
    if throttle:
        a += ["--throttle-s", str(throttle)]
    if write_delay:
        a += ["--ckpt-write-delay-s", str(write_delay)]
    return a + list(extra)


def writing(ckpt, step=None, state_written=False) -> bool:
    """A checkpoint write in progress (of ``step``; with state.pt already written, no marker yet)."""
    if not ckpt.is_dir():
        return False
    prefix = ".tmp-step-" if step is None else f".tmp-step-{step:08d}-"
    return any(p.name.startswith(prefix)
               and (not state_written or ((p / "state.pt").is_file() and not (p / "COMPLETE").exists()))
               for p in ckpt.iterdir())


def stop_line(output: str) -> dict:
    lines = [line for line in output.splitlines() if line.startswith("stop step=")]
    assert len(lines) == 1, output
    return dict(t.split("=", 1) for t in lines[0].split() if "=" in t)


_reference: dict[int, str] = {}


def reference_digest(world, tmp_path_factory) -> str:
    if world not in _reference:
        d = tmp_path_factory.mktemp(f"ref{world}")
        run = Run(command(world, args_for(d / "ckpt", d / "progress.json")))
        rc = run.finish()
        assert rc == 0, run.output
        _reference[world] = digest(run.output)
        prog = json.loads((d / "progress.json").read_text())
        assert prog["state"] == "done" and prog["step"] == STEPS and prog["params_sha256"] == _reference[world]
        assert prog["checkpoint_step"] == STEPS, "the final checkpoint is on this node's disk"
        assert prog["checkpoint_bytes"] == marked_bytes(d / "ckpt" / step_dir_name(STEPS)) > 0, "and its size"
    return _reference[world]


@pytest.fixture(scope="module")
def chains(tmp_path_factory):
    return {}


def run_chain(world, tmp_path_factory):
    d = tmp_path_factory.mktemp(f"chain{world}")
    ckpt, progress = d / "ckpt", d / "progress.json"
    out = {"reference": reference_digest(world, tmp_path_factory), "world": world}

    # run 1: SIGKILL everything (no stop save possible) while step 9 is being written: its state.pt
    # is on disk, its marker not yet (each write sleeps 0.3 s before and after writing state.pt)
    r1 = Run(command(world, args_for(ckpt, progress, throttle=0.3, write_delay=0.3)))
    r1.wait_for(lambda: 6 in complete_steps(ckpt) and writing(ckpt, 9, state_written=True),
                what="checkpoint step 6 complete and step 9 half-written")
    r1.kill_tree()
    assert "params_sha256" not in r1.output and "stop step" not in r1.output
    out["after_kill"] = max(complete_steps(ckpt))
    out["killed_mid_write"] = writing(ckpt, 9, state_written=True)

    # run 2: resumes from the newest periodic checkpoint; SIGTERM (to torchrun for 2 ranks) while the
    # next periodic write (step 9, 2 s long here) is in flight: the stop save cancels it
    out["started2"] = time.time()
    r2 = Run(command(world, args_for(ckpt, progress, throttle=0.3, write_delay=1.0)))
    r2.wait_for(lambda: resumed(r2.output) is not None and writing(ckpt, out["after_kill"] + EVERY),
                what="a periodic write in flight after resume")
    r2.signal(signal.SIGTERM)
    rc2 = r2.finish()
    out["resume2"] = resumed(r2.output)
    out["rc2"] = rc2
    out["out2"] = r2.output
    out["progress2"] = json.loads(progress.read_text())
    out["outcome2"] = exitcodes.outcome(rc2, str(progress), out["started2"])
    out["exit_status2"] = exit_status(rc2, str(progress), out["started2"])
    out["stop2"] = stop_line(r2.output)
    out["stop_step"] = int(out["stop2"]["step"])
    out["after_stop"] = complete_steps(ckpt)
    assert max(out["after_stop"]) == out["stop_step"], (out["after_stop"], r2.output)

    copy = d / "ckpt-copy"
    shutil.copytree(ckpt, copy)

    # run 3: finish from the stop checkpoint
    r3 = Run(command(world, args_for(ckpt, progress)))
    assert r3.finish() == 0, r3.output
    out["resume3"] = resumed(r3.output)
    out["final3"] = digest(r3.output)

    # run 3c: newest checkpoint truncated -> warning, fall back to the previous one
    newest = copy / f"step-{out['stop_step']:08d}" / "state.pt"
    size = newest.stat().st_size
    with open(newest, "r+b") as f:
        f.truncate(size // 2)
    r3c = Run(command(world, args_for(copy, progress)))
    assert r3c.finish() == 0, r3c.output
    out["resume3c"] = resumed(r3c.output)
    out["out3c"] = r3c.output
    out["final3c"] = digest(r3c.output)
    out["copy_dir"] = copy
    out["ckpt_dir"] = ckpt
    return out


@pytest.fixture(scope="module", params=[1, 2], ids=["1rank", "2ranks"])
def chain(request, chains, tmp_path_factory):
    world = request.param
    if world not in chains:
        chains[world] = run_chain(world, tmp_path_factory)
    return chains[world]


def test_b_sigkill_then_resume_from_last_periodic_checkpoint(chain):
    assert chain["after_kill"] >= 6 and chain["after_kill"] % EVERY == 0
    step, path = chain["resume2"]
    assert step == chain["after_kill"] and path.endswith(f"step-{step:08d}")


def test_d_trainer_killed_mid_write_resumes_from_newest_complete(chain):
    assert chain["killed_mid_write"]  # the kill landed between state.pt and the marker of step 9
    assert chain["after_kill"] == 6 and chain["resume2"][0] == chain["after_kill"]
    assert not [p for p in chain["ckpt_dir"].iterdir() if p.name.startswith(".tmp-")]


def test_stop_during_an_in_flight_periodic_write_gives_it_up_at_once(chain):
    """The stop save supersedes an in-flight periodic write of an older step: it is cancelled, not
    waited for (its 1-s pauses are the test's slow disk), and leaves nothing half written; the complete
    checkpoint before it is kept. A write already past its state file completes instead."""
    in_flight = chain["after_kill"] + EVERY
    lines = chain["out2"].splitlines()
    cancelled = [line for line in lines if f"checkpoint step {in_flight} cancelled" in line]  # [rank 0] ...
    written = [line for line in lines if line.startswith(f"ckpt_written step={in_flight} ")]
    assert len(cancelled) + len(written) == 1, chain["out2"]
    assert float(chain["stop2"]["wait_s"]) < 0.8, chain["stop2"]  # waiting took >= 1 s (the second pause)
    assert chain["stop_step"] > in_flight
    kept = chain["after_kill"] if cancelled else in_flight  # --keep 2
    assert chain["after_stop"] == [kept, chain["stop_step"]], (chain["after_stop"], chain["out2"])
    assert not [p for p in chain["ckpt_dir"].iterdir() if p.name.startswith(".tmp-")]


def test_a_sigterm_stops_saves_exits_75_and_resume_is_exact(chain):
    assert chain["stop_step"] > chain["after_kill"]
    assert chain["progress2"]["state"] == "preempted" and chain["progress2"]["step"] == chain["stop_step"]
    assert chain["progress2"]["checkpoint_step"] == chain["stop_step"], "the stop save is on the disk"
    assert chain["progress2"]["checkpoint_bytes"] > 0
    # 1 rank (no torchrun): the trainer's own code. 2 ranks: torchrun, signalled itself, forwards the
    # SIGTERM, waits for the workers (which save and exit 75) and exits 1 (SignalException, no summary);
    # the progress file maps that back to 75 (training.launch.exit_status, what systemd sees).
    if chain["world"] == 1:
        assert chain["rc2"] == exitcodes.PREEMPTED, chain["out2"]
    else:
        # torchrun itself sometimes aborts while tearing down after that ("terminate called without an
        # active exception", SIGABRT: a C++ thread of its agent still joinable); the workers had saved
        # and exited 75 by then, and the progress file below is what the launcher maps, either way
        assert chain["rc2"] in (1, -6) and "SignalException" in chain["out2"], chain["out2"]
    assert chain["outcome2"] == "preempted" and chain["exit_status2"] == exitcodes.PREEMPTED
    assert chain["resume3"][0] == chain["stop_step"]
    assert chain["final3"] == chain["reference"]


def test_c_truncated_newest_falls_back_to_previous_and_is_exact(chain):
    assert "is corrupt, falling back" in chain["out3c"], chain["out3c"]
    step, _ = chain["resume3c"]
    assert step < chain["stop_step"]
    assert chain["final3c"] == chain["reference"]
    assert any(p.name.startswith("corrupt-step-") for p in chain["copy_dir"].iterdir())


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class TwoNodes:
    """2 'nodes' on loopback: 2 torchrun agents (c10d rendezvous, node 0 the host), 1 rank each, each with
    its own checkpoint dir, stop file and progress file."""

    def __init__(self, root):
        self.dirs = [root / "node0" / "ckpt", root / "node1" / "ckpt"]
        self.stop_files = [root / "node0" / "stop", root / "node1" / "stop"]
        self.progress = [root / "progress0.json", root / "progress1.json"]

    def launch(self, node, port, throttle):
        tr = ["--nnodes=2", "--nproc-per-node=1", "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{port}",
              f"--rdzv-id=kit-test-{port}", f"--node-rank={node}", f"--rdzv-conf=is_host={str(node == 0).lower()}"]
        extra = ["--stop-file", str(self.stop_files[node])]
        return Run(command(2, args_for(self.dirs[node], self.progress[node], throttle=throttle, extra=extra),
                           torchrun_args=tr))

    def start(self, throttle=0.0):
        port = _free_port()
        return [self.launch(0, port, throttle), self.launch(1, port, throttle)]

    def finish(self, runs):
        """(exit codes, both nodes' output)"""
        rcs = [r.finish() for r in runs]
        return rcs, runs[0].output + runs[1].output

    def state(self, node):
        return json.loads(self.progress[node].read_text())


def test_e_two_nodes_one_empty_checkpoint_dir(tmp_path, tmp_path_factory):
    """Stop via node 1's stop file only; every node's launcher sees 75 (its own progress file); wipe
    node 0's disk (the rendezvous host, rank 0); relaunch with node 1's stop file already there: the
    newest step comes from node 1 by broadcast and the immediate stop still gives node 0 its own
    copy; relaunch again: finishes with the digest of a 1-node 2-rank run."""
    ref = reference_digest(2, tmp_path_factory)
    nodes = TwoNodes(tmp_path)
    dirs, stop_files = nodes.dirs, nodes.stop_files
    started = time.time()
    runs = nodes.start(throttle=0.3)
    runs[0].wait_for(lambda: runs[0].max_step_logged() >= 4, what="step 4")
    stop_files[1].parent.mkdir(parents=True, exist_ok=True)
    stop_files[1].write_text("stop\n")
    rcs, out = nodes.finish(runs)
    stop_step = int(stop_line(runs[0].output)["step"])
    assert complete_steps(dirs[0])[-1] == complete_steps(dirs[1])[-1] == stop_step
    assert not stop_files[1].exists()  # consumed after the stop save
    for node in (0, 1):
        # each node's worker exited 75 (torchrun's failure summary) and torchrun itself 1; each node's
        # launcher maps that back to 75 from its own node-local progress file
        # (under load the non-host agent may find the host's c10d store already gone while it shuts
        # down, and print that instead of the summary: the progress file below is what counts)
        assert rcs[node] == 1 and (re.search(r"exitcode\s*:\s*75", runs[node].output) or (
            node == 1 and "RendezvousConnectionError" in runs[node].output)), runs[node].output
        assert nodes.state(node)["state"] == "preempted" and nodes.state(node)["step"] == stop_step, out
        assert exit_status(rcs[node], str(nodes.progress[node]), started) == exitcodes.PREEMPTED

    shutil.rmtree(dirs[0])  # node 0 replaced: empty disk
    stop_files[1].write_text("stop\n")  # ... and a stop request before the first step
    runs = nodes.start()
    rcs, out = nodes.finish(runs)
    step, path = resumed(out)
    assert step == stop_step and str(dirs[1]) in path, out
    assert int(stop_line(runs[0].output)["step"]) == stop_step
    # the stop save was not skipped: the replaced node holds its own copy of the stop step
    assert complete_steps(dirs[0]) == [stop_step] and complete_steps(dirs[1])[-1] == stop_step, out

    rcs, out = nodes.finish(nodes.start())
    assert rcs == [0, 0], out
    assert resumed(out)[0] == stop_step
    assert digest(out) == ref
    assert complete_steps(dirs[0])[-1] == complete_steps(dirs[1])[-1] == STEPS
    assert nodes.state(0)["state"] == nodes.state(1)["state"] == "done"
    assert nodes.state(0)["params_sha256"] == nodes.state(1)["params_sha256"] == ref


def _image_folder(root):
    from PIL import Image

    for c, colour in (("a", (200, 30, 30)), ("b", (30, 200, 30)), ("c", (30, 30, 200))):
        (root / c).mkdir(parents=True)
        for i in range(6):
            Image.new("RGB", (40, 40), tuple((v + 37 * i) % 256 for v in colour)).save(root / c / f"{i}.png")


def test_imagefolder_with_workers_survives_a_group_sighup_and_resumes_exactly(tmp_path):
    """ImageFolder data through forked DataLoader workers; SIGHUP to the whole process group (what
    torchrun forwards when it gets one): workers ignore it, the trainer saves and exits 75; the
    resumed run ends with the uninterrupted run's digest (the loader never draws from the RNG)."""
    _image_folder(tmp_path / "imgs")

    def args(ckpt, throttle=0.0):
        a = [*TINY, *DROP_PATH, "--data", str(tmp_path / "imgs"), "--workers", "1", "--steps", "6",
             "--ckpt-every", "2", "--keep", "2", "--ckpt-dir", str(ckpt)]
        return a + (["--throttle-s", str(throttle)] if throttle else [])

    ref = Run(command(1, args(tmp_path / "ref")))
    assert ref.finish() == 0, ref.output
    r1 = Run(command(1, args(tmp_path / "ckpt", throttle=0.3)))
    r1.wait_for(lambda: r1.max_step_logged() >= 3, what="step 3")
    os.killpg(r1.proc.pid, signal.SIGHUP)  # the trainer leads its own process group (start_new_session)
    assert r1.finish() == exitcodes.PREEMPTED, r1.output
    stop_step = int(stop_line(r1.output)["step"])
    assert stop_line(r1.output)["reason"] == "SIGHUP" and 3 <= stop_step < 6
    r2 = Run(command(1, args(tmp_path / "ckpt")))
    assert r2.finish() == 0, r2.output
    assert resumed(r2.output)[0] == stop_step
    assert digest(r2.output) == digest(ref.output)


def test_time_based_checkpoints_and_rerun_after_done_is_idempotent(tmp_path):
    ckpt = tmp_path / "ckpt"
    a = [*TINY, "--steps", "6", "--ckpt-every", "0", "--ckpt-every-seconds", "0.25", "--keep", "10",
         "--ckpt-dir", str(ckpt), "--throttle-s", "0.2"]
    r = Run(command(1, a))
    assert r.finish() == 0, r.output
    steps = complete_steps(ckpt)
    assert steps[-1] == 6 and len(steps) >= 3, (steps, r.output)  # saves came from the clock, not the step count
    again = Run(command(1, a))
    assert again.finish() == 0, again.output
    assert resumed(again.output)[0] == 6 and digest(again.output) == digest(r.output)
    assert "first_step_done" not in again.output


def test_f_disks_lost_and_shape_switched_resumes_exactly_from_the_bucket(tmp_path, tmp_path_factory):
    """The durable tier (training/bucket.py) and a shape switch at the trainer: 1 node x 2 ranks with
    ``--ckpt-bucket file://...`` is stopped (SIGTERM: the stop save is uploaded before exit 75); every
    disk is then lost, and the job resumes as 2 nodes x 1 rank (same world size) on empty disks: rank 0
    restores from the bucket, broadcasts, and the run ends with an undisturbed 2-rank run's digest."""
    ref = reference_digest(2, tmp_path_factory)
    bucket = f"file://{tmp_path / 'bucket' / 'job'}"
    one = tmp_path / "one-node" / "ckpt"
    r1 = Run(command(2, args_for(one, tmp_path / "p.json", throttle=0.3, extra=["--ckpt-bucket", bucket])))
    r1.wait_for(lambda: r1.max_step_logged() >= 5, what="step 5")
    r1.signal(signal.SIGTERM)
    r1.finish()
    stop_step = int(stop_line(r1.output)["step"])
    uploaded = complete_steps(tmp_path / "bucket" / "job")
    assert uploaded[-1] == stop_step and len(uploaded) <= 2, (uploaded, r1.output)
    shutil.rmtree(tmp_path / "one-node")  # the zone is left: its disk is not reachable any more

    dirs = [tmp_path / f"node{i}" / "ckpt" for i in (0, 1)]
    port = _free_port()
    runs = [Run(command(2, args_for(dirs[node], extra=["--ckpt-bucket", bucket]),
                        torchrun_args=["--nnodes=2", "--nproc-per-node=1", "--rdzv-backend=c10d",
                                       f"--rdzv-endpoint=127.0.0.1:{port}", f"--rdzv-id=kit-bucket-{port}",
                                       f"--node-rank={node}", f"--rdzv-conf=is_host={str(node == 0).lower()}"]))
            for node in (0, 1)]
    rcs = [r.finish() for r in runs]
    out = runs[0].output + runs[1].output
    assert rcs == [0, 0], out
    step, path = resumed(out)
    assert step == stop_step and str(dirs[0]) in path, out  # restored onto node 0's disk, then broadcast
    assert digest(out) == ref
    assert complete_steps(tmp_path / "bucket" / "job")[-1] == STEPS  # the finished model is durable too
