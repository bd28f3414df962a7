"""Unit tests of training/: checkpoint format and fallback, sampler/synthetic data determinism,
schedule, progress file, stop flag, flag validation, state broadcast skeleton."""
from __future__ import annotations

import json
import os
import signal

import pytest
import torch

from training import exitcodes
from training.checkpoint import (
    Checkpointer,
    CorruptCheckpoint,
    list_complete,
    newest_loadable,
    read_verified,
)
from training.data import ResumableSampler, SyntheticData
from training.distributed import DistInfo, _fill, _skeleton, broadcast_state
from training.metrics import memory_line, mfu, peak_memory
from training.optim import warmup_cosine
from training.progress import ProgressWriter, read_progress
from training.stop import StopMonitor, agree


def _state(step):
    return {"step": step, "model": {"w": torch.full((1000,), float(step))}, "rng": {"rank_0": {"x": step}}}


def test_exit_codes_fixed():
    assert exitcodes.DONE == 0 and exitcodes.PREEMPTED == 75


def test_checkpoint_roundtrip_keep_and_layout(tmp_path):
    ck = Checkpointer(tmp_path, keep=2)
    for s in (1, 2, 3):
        ck.save(s, _state(s))  # async
    ck.close()
    assert [s for s, _ in list_complete(tmp_path)] == [3, 2]
    assert sorted(os.listdir(tmp_path / "step-00000003")) == ["COMPLETE", "state.pt"]
    marker = json.loads((tmp_path / "step-00000003" / "COMPLETE").read_text())
    assert marker["step"] == 3 and len(marker["files"]["state.pt"]["sha256"]) == 64
    step, _, st = newest_loadable(tmp_path)
    assert step == 3 and torch.equal(st["model"]["w"], torch.full((1000,), 3.0))
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".tmp-")]
    # its size, as the marker lists it: what a move to another zone copies (the progress file reports it)
    assert ck.bytes_of(3) == (tmp_path / "step-00000003" / "state.pt").stat().st_size > 4000
    assert ck.bytes_of(1) is None, "pruned"
    (tmp_path / "step-00000002" / "COMPLETE").write_text("{not json")
    assert ck.bytes_of(2) is None


def test_staging_copies_live_tensors(tmp_path):
    live = {"step": 1, "model": {"w": torch.zeros(10)}}
    ck = Checkpointer(tmp_path, keep=2)
    ck.save(1, live)
    live["model"]["w"].add_(5)  # training continues while the write is in flight
    ck.close()
    assert torch.equal(read_verified(tmp_path / "step-00000001")["model"]["w"], torch.zeros(10))


@pytest.mark.parametrize("damage", ["truncate", "bitflip", "marker", "missing"])
def test_corrupt_newest_falls_back_with_warning(tmp_path, damage):
    ck = Checkpointer(tmp_path, keep=3)
    for s in (1, 2):
        ck.save(s, _state(s), sync=True)
    f = tmp_path / "step-00000002" / "state.pt"
    if damage == "truncate":
        with open(f, "r+b") as fh:
            fh.truncate(f.stat().st_size - 10)
    elif damage == "bitflip":
        data = bytearray(f.read_bytes())
        data[len(data) // 2] ^= 0x01
        f.write_bytes(bytes(data))
    elif damage == "marker":
        (tmp_path / "step-00000002" / "COMPLETE").write_text("{not json")
    else:
        f.unlink()
    with pytest.raises(CorruptCheckpoint):
        read_verified(tmp_path / "step-00000002")
    warnings = []
    step, _, st = newest_loadable(tmp_path, log=warnings.append)
    assert step == 1 and st["step"] == 1
    assert warnings and "falling back" in warnings[0]
    assert any(p.name.startswith("corrupt-step-00000002") for p in tmp_path.iterdir())
    # the same step can be written again afterwards
    ck.save(2, _state(2), sync=True)
    assert newest_loadable(tmp_path)[0] == 2


BAD_MARKERS = {
    "bytes missing": lambda m: m["files"]["state.pt"].pop("bytes"),
    "step a string": lambda m: m.update(step=str(m["step"])),
    "files a list": lambda m: m.update(files=[m["files"]]),
    "files empty": lambda m: m.update(files={}),
    "state.pt not listed": lambda m: m.update(files={"other.pt": m["files"]["state.pt"]}),
    "step of another checkpoint": lambda m: m.update(step=1),
    "sha256 not hex": lambda m: m["files"]["state.pt"].update(sha256="x" * 64),
    "bytes negative": lambda m: m["files"]["state.pt"].update(bytes=-1),
    "path in a file name": lambda m: m.update(files={"../state.pt": m["files"]["state.pt"]}),
    "unknown format": lambda m: m.update(format=99),
    "not an object": lambda m: m.clear(),
}


@pytest.mark.parametrize("damage", sorted(BAD_MARKERS))
def test_a_marker_that_parses_but_is_wrong_is_an_incomplete_checkpoint(tmp_path, damage):
    """Valid JSON with a missing or wrong-typed key (or no files at all) fails the marker's schema:
    the checkpoint counts as incomplete, is moved aside, and the resume falls back to the previous
    one, on every restart alike (no KeyError/AttributeError on every rank)."""
    import json

    ck = Checkpointer(tmp_path, keep=3)
    for s in (1, 2):
        ck.save(s, _state(s), sync=True)
    marker_file = tmp_path / "step-00000002" / "COMPLETE"
    marker = json.loads(marker_file.read_text())
    BAD_MARKERS[damage](marker)
    marker_file.write_text(json.dumps(marker))
    with pytest.raises(CorruptCheckpoint, match="marker"):
        read_verified(tmp_path / "step-00000002")
    warnings = []
    step, _, st = newest_loadable(tmp_path, log=warnings.append)
    assert step == 1 and st["step"] == 1 and "falling back" in warnings[0]
    assert any(p.name.startswith("corrupt-step-00000002") for p in tmp_path.iterdir())


def test_the_writer_and_the_reader_share_the_marker_schema(tmp_path):
    from training.checkpoint import Marker

    Checkpointer(tmp_path, keep=2).save(3, _state(3), sync=True)
    marker = Marker.model_validate_json((tmp_path / "step-00000003" / "COMPLETE").read_bytes())
    assert marker.step == 3 and set(marker.files) == {"state.pt"} and marker.files["state.pt"].bytes > 0


def test_marker_less_and_tmp_dirs_are_ignored_and_cleaned(tmp_path):
    Checkpointer(tmp_path, keep=2).save(1, _state(1), sync=True)
    (tmp_path / "step-00000009").mkdir()  # no marker: never considered
    (tmp_path / ".tmp-step-00000010-1-2").mkdir()
    assert newest_loadable(tmp_path)[0] == 1
    Checkpointer(tmp_path, keep=2)  # a new writer removes stale temporaries
    assert not (tmp_path / ".tmp-step-00000010-1-2").exists()


def test_keep_must_be_at_least_two(tmp_path):
    with pytest.raises(ValueError):
        Checkpointer(tmp_path, keep=1)


def test_non_writer_writes_nothing(tmp_path):
    ck = Checkpointer(tmp_path / "x", keep=2, writer=False)
    ck.save(1, _state(1), sync=True)
    assert not (tmp_path / "x").exists()


def test_synthetic_data_deterministic_per_seed_step_rank():
    a = SyntheticData(2, 8, 10, seed=0, rank=0, device=torch.device("cpu"))
    b = SyntheticData(2, 8, 10, seed=0, rank=0, device=torch.device("cpu"))
    x1, y1 = a.batch(5)
    a.batch(6)
    x2, y2 = b.batch(5)
    assert torch.equal(x1, x2) and torch.equal(y1, y2)
    other_rank = SyntheticData(2, 8, 10, seed=0, rank=1, device=torch.device("cpu")).batch(5)[0]
    assert not torch.equal(x1, other_rank)
    assert not torch.equal(x1, a.batch(6)[0])


def test_resumable_sampler_continues_exactly():
    full = ResumableSampler(10, rank=1, world_size=2, seed=3)
    it = iter(full)
    seq = [next(it) for _ in range(13)]
    s2 = ResumableSampler(10, rank=1, world_size=2, seed=3)
    it2 = iter(s2)
    head = [next(it2) for _ in range(7)]
    state = s2.state_dict()
    s3 = ResumableSampler(10, rank=1, world_size=2, seed=3)
    s3.load_state_dict(state)
    it3 = iter(s3)
    assert head + [next(it3) for _ in range(6)] == seq
    r0 = ResumableSampler(10, rank=0, world_size=2, seed=3)
    assert sorted(list(r0._indices(0)) + list(full._indices(0))) == list(range(10))


def test_warmup_cosine_schedule():
    f = warmup_cosine(warmup_steps=4, total_steps=12)
    assert f(0) == pytest.approx(0.25) and f(3) == pytest.approx(1.0)
    assert f(4) == pytest.approx(1.0) and f(8) == pytest.approx(0.5) and f(12) == pytest.approx(0.0)


def test_progress_file_shape(tmp_path):
    p = tmp_path / "progress.json"
    w = ProgressWriter(str(p), total_steps=10)
    w.write(3, step_time_s=0.5, force=True)
    doc = read_progress(p)
    assert set(doc) == {"step", "total_steps", "step_time_s", "state", "time", "params_sha256", "checkpoint_step",
                        "checkpoint_bytes"}
    assert doc["step"] == 3 and doc["state"] == "running" and doc["params_sha256"] is None
    assert doc["checkpoint_step"] is None and doc["checkpoint_bytes"] is None, "no checkpoint on this node yet"
    w.checkpoint(3, 12345)
    w.write(4, force=True)
    assert (read_progress(p)["checkpoint_step"], read_progress(p)["checkpoint_bytes"]) == (3, 12345)
    w.write(10, state="done", params_sha256="a" * 64)
    assert read_progress(p)["state"] == "done"
    assert not [x for x in tmp_path.iterdir() if x.name.endswith(".tmp")]
    ProgressWriter(str(tmp_path / "off.json"), 10, enabled=False).write(1, force=True)
    assert not (tmp_path / "off.json").exists()


def test_stop_monitor_signal_and_stop_file(tmp_path):
    stop_file = tmp_path / "stop"
    mon = StopMonitor(str(stop_file))
    try:
        assert not mon.local_request()
        stop_file.write_text("x")
        assert mon.local_request() and "stop file" in mon.reason()
        mon.consume_stop_file()
        assert not mon.local_request()
        os.kill(os.getpid(), signal.SIGTERM)  # handler only sets the flag
        assert mon.local_request() and mon.reason() == "SIGTERM"
    finally:
        mon.restore()
    assert agree([True, False]) == [True, False]


def test_flag_validation_exits_2_before_any_work(tmp_path, capsys):
    from training.train import main

    assert main(["--keep", "1", "--ckpt-dir", str(tmp_path / "c")]) == exitcodes.USAGE
    assert main(["--data", str(tmp_path / "nope"), "--ckpt-dir", str(tmp_path / "c")]) == exitcodes.USAGE
    assert "--keep must be >= 2" in capsys.readouterr().err
    assert not (tmp_path / "c").exists()


def test_broadcast_skeleton_roundtrip_single_rank():
    st = {"a": torch.arange(3), "b": [1, (torch.ones(2), "x")], "c": {"d": 2.5}}
    tensors = []
    sk = _skeleton(st, tensors)
    back = _fill(sk, tensors)
    assert torch.equal(back["a"], st["a"]) and back["b"][1][1] == "x" and back["c"]["d"] == 2.5
    assert broadcast_state(st, 0, DistInfo()) is st


def test_mfu():
    assert mfu(9375.0, 105.5e9, 989e12, 1) == pytest.approx(1.0, rel=1e-3)
    assert mfu(100.0, 1e9, None, 1) is None


def _image_folder(root, n_per_class=5, classes="abc"):
    from PIL import Image

    for c in classes:
        (root / c).mkdir(parents=True)
        for i in range(n_per_class):
            Image.new("RGB", (12, 12), (i * 40 % 255, len(c) * 60, 100)).save(root / c / f"{i}.png")


def test_peak_memory_counts_what_this_process_touched():
    before = peak_memory("cpu")
    assert before["gpu"] is None and before["gpu_reserved"] is None  # no CUDA on CPU
    block = bytearray(300 * 2**20)  # zero-filled, so every page is touched: resident
    after = peak_memory("cpu")
    # ru_maxrss is the peak, so it rises by the block unless the process once held more than it holds now
    assert after["host"] >= before["host"] and after["host"] >= 300 * 2**20 / 1e9, (before, after)
    del block
    line = memory_line("cpu")
    fields = dict(t.split("=", 1) for t in line.split()[1:])
    assert line.startswith("memory ") and fields["peak_gpu_gb"] == fields["peak_gpu_reserved_gb"] == "n/a"
    assert float(fields["peak_host_gb"]) == pytest.approx(peak_memory("cpu")["host"], abs=0.01)


def test_the_trainer_logs_its_peak_memory_when_it_finishes(tmp_path, capsys, restore_signals):
    from training.train import main

    assert main([*TINY_ARGS, "--ckpt-dir", str(tmp_path / "c")]) == exitcodes.DONE
    out = capsys.readouterr().out
    line = next(x for x in out.splitlines() if x.startswith("memory "))  # bench/trainer.py reads it
    assert float(dict(t.split("=", 1) for t in line.split()[1:])["peak_host_gb"]) > 0.1, out


def test_imagefolder_resume_position_is_exact(tmp_path):
    from training.data import ImageFolderData

    _image_folder(tmp_path / "imgs")

    def make():
        return ImageFolderData(str(tmp_path / "imgs"), batch_size=2, image_size=8, seed=1, rank=0, world_size=2,
                               device=torch.device("cpu"), workers=0)

    full = make()
    straight = [full.batch(s) for s in range(7)]  # crosses an epoch boundary (8 samples per rank)
    resumed = make()
    resumed.load_state_dict(full.state_dict(4))
    for s in range(4, 7):
        x, y = resumed.batch(s)
        assert torch.equal(x, straight[s][0]) and torch.equal(y, straight[s][1])
    assert full.state_dict(5) == {"kind": "imagefolder", "step": 5, "epoch": 1, "index": 2}


def test_dataloader_workers_ignore_sigterm(tmp_path):
    import time

    from training.stop import ignore_stop_signals_in_worker

    ds = torch.utils.data.TensorDataset(torch.arange(64).float())
    loader = torch.utils.data.DataLoader(ds, batch_size=4, num_workers=1, worker_init_fn=ignore_stop_signals_in_worker,
                                         multiprocessing_context="fork")
    it = iter(loader)
    next(it)
    pid = it._workers[0].pid
    os.kill(pid, signal.SIGTERM)
    time.sleep(0.3)
    assert it._workers[0].is_alive()
    assert len([b for b in it]) == 15  # the rest of the epoch still arrives


def test_outcome_classification(tmp_path):
    from training.exitcodes import outcome

    assert outcome(0) == "done" and outcome(75) == "preempted" and outcome(1) == "crashed"
    prog = tmp_path / "p.json"
    ProgressWriter(str(prog), 10).write(4, state="preempted")
    assert outcome(1, str(prog)) == "preempted"  # torchrun: agent exits 1, workers exited 75
    assert outcome(1, str(prog), started_at=read_progress(prog)["time"] + 10) == "crashed"  # stale file
    assert outcome(-9, str(tmp_path / "missing.json")) == "crashed"


# ---- review findings -----------------------------------------------------------------------------
def test_verified_but_unloadable_checkpoint_raises_and_moves_nothing(tmp_path, monkeypatch):
    """A load failure with a matching sha256 (MemoryError, a weights_only rejection after a torch
    upgrade) is not corruption: no fallback, nothing moved aside or deleted."""
    from training.checkpoint import UnloadableCheckpoint

    ck = Checkpointer(tmp_path, keep=3)
    for s in (10, 20, 30):
        ck.save(s, _state(s), sync=True)
    before = sorted(os.listdir(tmp_path))

    def broken_load(*args, **kwargs):
        raise MemoryError("simulated")

    monkeypatch.setattr(torch, "load", broken_load)
    with pytest.raises(UnloadableCheckpoint, match="sha256 verified"):
        newest_loadable(tmp_path, log=lambda m: None)
    assert sorted(os.listdir(tmp_path)) == before == ["step-00000010", "step-00000020", "step-00000030"]


def test_quarantine_never_deletes_earlier_corrupt_checkpoints(tmp_path):
    from training.checkpoint import quarantined

    ck = Checkpointer(tmp_path, keep=4)
    for s in (1, 2, 3):
        ck.save(s, _state(s), sync=True)
    for s in (3, 2):  # the newest is damaged, later the next one too: both stay on disk for a human
        (tmp_path / f"step-{s:08d}" / "COMPLETE").write_text("{broken")
        assert newest_loadable(tmp_path, log=lambda m: None)[0] == s - 1
    assert [p.name.split("-")[2] for p in quarantined(tmp_path)] == ["00000002", "00000003"]


@pytest.fixture
def restore_signals():
    sigs = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT)
    saved = {s: signal.getsignal(s) for s in sigs}
    yield
    for s, h in saved.items():
        signal.signal(s, h)


TINY_ARGS = ["--model", "vit_tiny_patch16_224", "--image-size", "32", "--num-classes", "10", "--batch-size", "2",
             "--device", "cpu", "--steps", "1", "--ckpt-every", "0", "--log-every", "1"]


@pytest.mark.parametrize("how", ["unloadable", "all_corrupt", "markers_deleted"])
def test_trainer_refuses_to_start_fresh_over_existing_checkpoints(tmp_path, monkeypatch, capsys, how,
                                                                  restore_signals):
    from training import checkpoint
    from training.train import main

    ckpt_dir = tmp_path / "ckpt"
    ck = Checkpointer(ckpt_dir, keep=3)
    for s in (3, 6):
        ck.save(s, _state(s), sync=True)
    if how == "unloadable":
        def broken_load(*args, **kwargs):
            raise RuntimeError("Weights only load failed (simulated torch upgrade)")

        monkeypatch.setattr(checkpoint.torch, "load", broken_load)
    elif how == "markers_deleted":  # intact state files without their markers: never a silent step 0
        for s in (3, 6):
            (ckpt_dir / f"step-{s:08d}" / "COMPLETE").unlink()
    else:
        for s in (3, 6):
            with open(ckpt_dir / f"step-{s:08d}" / "state.pt", "r+b") as f:
                f.truncate(10)
    before = sorted(os.listdir(ckpt_dir))
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    compile_flag = ["--compile"] if how == "unloadable" else []  # never reaches torch.compile here
    assert main([*TINY_ARGS, *compile_flag, "--ckpt-dir", str(ckpt_dir)]) == exitcodes.CHECKPOINT_ERROR
    if compile_flag:  # the compile cache goes next to the checkpoints, on the persistent disk
        assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(tmp_path / "torchinductor-cache")
    err = capsys.readouterr().err
    assert "refusing to start from step 0" in err
    after = sorted(os.listdir(ckpt_dir))
    if how in ("unloadable", "markers_deleted"):
        assert after == before  # nothing moved, nothing deleted
        if how == "markers_deleted":
            assert "hold state.pt but no COMPLETE marker" in err and "step-00000006" in err
    else:  # both moved aside (kept), nothing trained or written
        assert len(after) == 2 and all(n.startswith("corrupt-step-") for n in after)
        assert main([*TINY_ARGS, "--ckpt-dir", str(ckpt_dir)]) == exitcodes.CHECKPOINT_ERROR  # still refuses


def test_rng_state_roundtrips_through_a_weights_only_checkpoint(tmp_path):
    import random

    import numpy as np

    from training.train import rng_state, set_rng_state

    random.seed(1)
    np.random.seed(2)
    torch.manual_seed(3)
    np.random.randn()  # a cached gaussian is part of numpy's state
    saved = rng_state(cuda=False)
    torch.save({"rng": saved}, tmp_path / "rng.pt")
    expected = (random.random(), np.random.randn(3).tolist(), torch.rand(3).tolist())
    random.seed(9)
    np.random.seed(9)
    torch.manual_seed(9)
    set_rng_state(torch.load(tmp_path / "rng.pt", weights_only=True)["rng"], cuda=False)
    assert (random.random(), np.random.randn(3).tolist(), torch.rand(3).tolist()) == expected


def test_prepare_waits_for_an_in_flight_write(tmp_path):
    """prepare() stages into the buffers the background write is serialising."""
    ck = Checkpointer(tmp_path, keep=2, write_delay_s=0.3)
    live = {"step": 1, "model": {"w": torch.zeros(10)}}
    ck.save(1, live)  # async; the thread sleeps before torch.save reads the staged buffers
    finished = ck.prepare({"step": 1, "model": {"w": torch.full((10,), 7.0)}})
    ck.close()
    assert finished is not None and finished.step == 1 and finished.error is None
    assert torch.equal(read_verified(tmp_path / "step-00000001")["model"]["w"], torch.zeros(10))


def test_save_if_missing_skips_a_step_this_node_holds_and_writes_it_otherwise(tmp_path):
    a, b = Checkpointer(tmp_path / "a", keep=2), Checkpointer(tmp_path / "b", keep=2)
    a.save(4, _state(4), sync=True)
    marker = (tmp_path / "a" / "step-00000004" / "COMPLETE").read_text()
    assert a.save(4, _state(4), sync=True, if_missing=True).skipped
    assert (tmp_path / "a" / "step-00000004" / "COMPLETE").read_text() == marker  # untouched
    stats = b.save(4, _state(4), sync=True, if_missing=True)  # the replaced node: written
    assert not stats.skipped and newest_loadable(tmp_path / "b")[0] == 4


def test_periodic_save_reports_the_wait_for_the_previous_write(tmp_path):
    ck = Checkpointer(tmp_path, keep=3, write_delay_s=0.2)
    ck.save(1, _state(1))
    second = ck.save(2, _state(2))
    ck.close()
    assert second.previous is not None and second.previous.step == 1 and second.previous.path
    assert second.wait_s >= 0.2 and second.stall_s >= second.wait_s


def test_stop_monitor_catches_every_signal_torchrun_forwards(restore_signals):
    mon = StopMonitor(None)
    for sig in (signal.SIGHUP, signal.SIGQUIT):
        assert signal.getsignal(sig) == mon._handler  # checked first: never deliver a fatal signal
    os.kill(os.getpid(), signal.SIGHUP)
    assert mon.local_request() and mon.reason() == "SIGHUP"


def test_dist_timeout_flag_reaches_both_process_groups(monkeypatch):
    from datetime import timedelta

    import torch.distributed as dist

    from training import distributed
    from training.train import build_parser

    assert build_parser().parse_args([]).dist_timeout_s == 180.0
    calls = {}
    monkeypatch.setattr(dist, "init_process_group", lambda **kw: calls.setdefault("init", kw))
    monkeypatch.setattr(dist, "new_group", lambda **kw: calls.setdefault("group", kw))
    monkeypatch.setattr(torch.cuda, "set_device", lambda *a: None)
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "0")
    distributed.init_distributed("cuda", timeout_s=42.0)
    assert calls["init"]["timeout"] == timedelta(seconds=42)
    assert calls["group"]["backend"] == "gloo" and calls["group"]["timeout"] == timedelta(seconds=42)


def test_flops_counted_on_cpu_include_attention():
    import timm

    from training.metrics import train_flops_per_sample

    model = timm.create_model("vit_tiny_patch16_224", num_classes=10, img_size=32)
    fused = train_flops_per_sample(model, "vit_tiny_patch16_224", 32, "cpu")
    for m in model.modules():  # explicit q @ k^T and attn @ v matmuls: always counted
        if hasattr(m, "fused_attn"):
            m.fused_attn = False
    assert fused == pytest.approx(train_flops_per_sample(model, "vit_tiny_patch16_224", 32, "cpu"), rel=1e-3)


def test_imagefolder_resume_with_another_batch_size_continues_at_the_saved_position(tmp_path):
    from training.data import ImageFolderData

    _image_folder(tmp_path / "imgs")

    def make(bs):
        return ImageFolderData(str(tmp_path / "imgs"), batch_size=bs, image_size=8, seed=1, rank=0, world_size=1,
                               device=torch.device("cpu"), workers=0)

    ref = make(1)
    samples = torch.cat([ref.batch(s)[0] for s in range(15)])  # one epoch, one sample per step
    old = make(2)
    state = old.state_dict(3)  # 3 steps of 2 = 6 samples consumed
    assert (state["epoch"], state["index"]) == (0, 6)
    new = make(3)
    new.load_state_dict(state)
    assert torch.equal(new.batch(3)[0], samples[6:9]) and torch.equal(new.batch(4)[0], samples[9:12])
    assert new.state_dict(5)["index"] == 12
    other_world = make(3)
    other_world.load_state_dict({"kind": "step", "step": 2})  # no usable position: derived from the step
    assert torch.equal(other_world.batch(2)[0], samples[6:9])


@pytest.mark.parametrize("worlds", [(2, 4), (2, 3, 1), (3, 2, 4)])
def test_imagefolder_world_size_changes_read_each_sample_of_an_epoch_once(tmp_path, worlds):
    """Relaunches with other world sizes (3 steps of batch 2 each, epochs crossed): across all of them
    every position of an epoch's permutation is read once (padding, positions >= n, aside), and the
    epoch in progress is a prefix. Rank r of w reads position index * w + r (the sampler's layout)."""
    from training.data import ImageFolderData, consumed, per_rank

    _image_folder(tmp_path / "imgs", n_per_class=8, classes="ab")
    n, step, states, seen = 16, 0, None, []
    for w in worlds:
        ranks = [ImageFolderData(str(tmp_path / "imgs"), batch_size=2, image_size=8, seed=1, rank=r, world_size=w,
                                 device=torch.device("cpu"), workers=0) for r in range(w)]
        k = per_rank(n, w)
        for d in ranks:
            if states is not None:
                d.load_states(step, states)
            first, last = (consumed(d.state_dict(s), k) for s in (step, step + 3))
            seen += [(c // k, c % k * w + d.rank) for c in range(first, last)]
        step, states = step + 3, [d.state_dict(step + 3) for d in ranks]
    epochs = sorted({e for e, _ in seen})
    for e in epochs:
        read = sorted(p for ep, p in seen if ep == e and p < n)
        assert read == list(range(n if e < epochs[-1] else len(read))), (worlds, e, read)


def test_a_resume_with_another_world_size_continues_the_epoch_where_it_stopped(tmp_path, monkeypatch, capsys,
                                                                              restore_signals):
    """A 2-rank checkpoint at step 2 (batch 2: the epoch's positions 0-7 read) resumed by 1 rank: the
    trainer reads positions 8-15 of the same permutation, so the epoch's 16 images are read once each."""
    import shutil

    from torchvision import datasets

    from training.data import ImageFolderData
    from training.train import main

    imgs, ckpt = tmp_path / "imgs", tmp_path / "ckpt"
    _image_folder(imgs, n_per_class=8, classes="ab")
    args = [*TINY_ARGS, "--data", str(imgs), "--workers", "0", "--ckpt-dir", str(ckpt)]
    assert main([*args, "--steps", "2"]) == exitcodes.DONE
    # the same step as 2 ranks save it: their world size, positions and RNG states
    found = newest_loadable(ckpt)
    assert found is not None
    _, path, state = found
    old = [ImageFolderData(str(imgs), 2, 32, 0, r, 2, torch.device("cpu"), workers=0) for r in (0, 1)]
    state.update(world_size=2, data={f"rank_{d.rank}": d.state_dict(2) for d in old},
                 rng={f"rank_{r}": state["rng"]["rank_0"] for r in (0, 1)})
    shutil.rmtree(path)
    Checkpointer(ckpt, keep=2).save(2, state, sync=True)
    read, real = [], datasets.ImageFolder.__getitem__

    def spy(self, i):
        read.append(i)
        return real(self, i)

    monkeypatch.setattr(datasets.ImageFolder, "__getitem__", spy)
    assert main([*args, "--steps", "6"]) == exitcodes.DONE
    assert "checkpoint world size 2 != 1" in capsys.readouterr().err
    before = [i for d in old for i in d.sampler._indices(0)[:4]]
    assert sorted(before + read) == list(range(16)), (before, read)


def test_a_relaunch_applies_a_new_lr_weight_decay_and_warmup(tmp_path, monkeypatch, capsys, restore_signals):
    """--lr, --weight-decay and --warmup-steps changed between two launches: every resumed step uses the
    new values (the schedule goes on at its step with the new peak), and the launch says so."""
    from training.train import Trainer, main

    ckpt = ["--ckpt-dir", str(tmp_path / "ckpt")]
    first = ["--steps", "2", "--lr", "1e-3", "--weight-decay", "0.05", "--warmup-steps", "2"]
    assert main([*TINY_ARGS, *first, *ckpt]) == exitcodes.DONE
    used, real = {}, Trainer.train_step

    def spy(self):
        used[self.step] = [(g["lr"], g["weight_decay"]) for g in self.optimizer.param_groups]
        return real(self)

    monkeypatch.setattr(Trainer, "train_step", spy)
    again = ["--steps", "5", "--lr", "2e-3", "--weight-decay", "0.1", "--warmup-steps", "4"]
    assert main([*TINY_ARGS, *again, *ckpt]) == exitcodes.DONE
    factor = warmup_cosine(warmup_steps=4, total_steps=5)
    assert used == {s: [(2e-3 * factor(s), 0.1), (2e-3 * factor(s), 0.0)] for s in (2, 3, 4)}  # no decay group
    out = capsys.readouterr().out
    for change in ("--lr 0.001 -> 0.002", "--weight-decay 0.05 -> 0.1", "--warmup-steps 2 -> 4", "--steps 2 -> 5"):
        assert f"flag_changed {change}: applied from step 2" in out, out
    found = newest_loadable(tmp_path / "ckpt")
    assert found is not None
    saved = found[2]
    assert saved["scheduler"]["base_lrs"] == [2e-3, 2e-3] and saved["args"]["lr"] == 2e-3


def test_imagefolder_loader_leaves_the_global_rng_alone_and_forks_workers(tmp_path):
    import multiprocessing

    from training.data import ImageFolderData

    _image_folder(tmp_path / "imgs")
    data = ImageFolderData(str(tmp_path / "imgs"), batch_size=2, image_size=8, seed=1, rank=0, world_size=1,
                           device=torch.device("cpu"), workers=1)
    before = torch.get_rng_state()
    start_method = multiprocessing.get_start_method()
    multiprocessing.set_start_method("spawn", force=True)  # as on Python >= 3.14 / macOS
    try:
        data.batch(0)
    finally:
        multiprocessing.set_start_method(start_method, force=True)
    try:
        assert torch.equal(torch.get_rng_state(), before)  # a resume must not shift the training RNG
        worker = data._iter._workers[0]
        assert type(worker).__name__ == "ForkProcess"
        for sig in (signal.SIGTERM, signal.SIGHUP):
            os.kill(worker.pid, sig)
        import time

        time.sleep(0.3)
        assert worker.is_alive()
        data.batch(1)
    finally:
        data.close()


# -- the trainer with a bucket (training/bucket.py) -------------------------------------------------------

def _bucket_with(tmp_path, steps, damage: bool):
    """A bucket holding complete copies of ``steps`` (uploaded from a disk that is then gone), each
    state file with one byte flipped when ``damage``."""
    from training.bucket import Bucket

    url = f"file://{tmp_path / 'bucket'}"
    b = Bucket(url, keep=5, log=lambda m: None)
    for s in steps:
        Checkpointer(tmp_path / "gone", keep=5, log=lambda m: None).save(s, _state(s), sync=True)
        assert b.upload(tmp_path / "gone" / f"step-{s:08d}")
        if damage:
            state = tmp_path / "bucket" / f"step-{s:08d}" / "state.pt"
            data = bytearray(state.read_bytes())
            data[len(data) // 2] ^= 1
            state.write_bytes(bytes(data))
    return url


def test_a_fresh_disk_refuses_step_0_when_every_bucket_copy_fails_to_restore(tmp_path, capsys, restore_signals):
    from training.train import main

    url = _bucket_with(tmp_path, (2, 4), damage=True)
    disk = tmp_path / "fresh"
    assert main([*TINY_ARGS, "--ckpt-dir", str(disk), "--ckpt-bucket", url]) == exitcodes.CHECKPOINT_ERROR
    err = capsys.readouterr().err
    assert "refusing to start from step 0" in err and url in err
    assert "step-00000004" in err and "step-00000002" in err and "sha256 mismatch" in err
    assert list_complete(disk) == []  # nothing trained, nothing saved
    assert sorted(p.name for p in (tmp_path / "bucket").iterdir()) == ["step-00000002", "step-00000004"]  # kept


def test_retention_keeps_the_checkpoint_being_uploaded_until_its_copy_is_in_the_bucket(tmp_path, monkeypatch,
                                                                                       restore_signals):
    """An upload slower than ``--keep`` save intervals: the trainer must not prune the directory the
    uploader is copying (its upload would fail and the bucket would get nothing while training runs)."""
    import threading

    from training import bucket as bucket_mod
    from training.train import main

    gate, uploaders, started = threading.Event(), [], []
    real_upload, real_flush = bucket_mod.Bucket.upload, bucket_mod.Uploader.flush

    def slow_first(self, path):
        started.append(int(path.name.split("-")[1]))
        if len(started) == 1:
            gate.wait(60)  # the link is slow: the later steps are saved meanwhile
        return real_upload(self, path)

    def flush(self, timeout=None):  # the trainer's first wait for the uploader: the end of the run
        uploaders.append(self)
        gate.set()
        return real_flush(self, timeout)

    monkeypatch.setattr(bucket_mod.Bucket, "upload", slow_first)
    monkeypatch.setattr(bucket_mod.Uploader, "flush", flush)
    args = [*TINY_ARGS, "--steps", "5", "--ckpt-every", "1", "--keep", "2", "--ckpt-dir", str(tmp_path / "ckpt"),
            "--ckpt-bucket", f"file://{tmp_path / 'bucket'}"]
    assert main(args) == exitcodes.DONE
    first = started[0]  # step 1, unless the uploader thread woke only after step 2 was queued
    assert first < 3 and uploaders and uploaders[0].uploaded[0] == first  # the slow upload completed
    assert uploaders[0].uploaded[-1] == 5
    # kept past --keep 2 while its upload ran (the next save's retention removes it); the ones only
    # queued and superseded before their turn were removed as usual
    assert [s for s, _ in list_complete(tmp_path / "ckpt")] == [5, 4, first]


def test_the_stop_save_is_in_the_progress_file_before_the_upload_is_waited_for(tmp_path, monkeypatch,
                                                                               restore_signals):
    """A preemption notice leaves ~30 s (GCP): the watcher must learn the stop save's step from the
    progress file at once, not after up to STOP_FLUSH_S of upload."""
    from training import bucket as bucket_mod
    from training.train import main

    progress, seen = tmp_path / "progress.json", []
    real_flush = bucket_mod.Uploader.flush

    def flush(self, timeout=None):
        seen.append(read_progress(str(progress)))
        return real_flush(self, timeout)

    monkeypatch.setattr(bucket_mod.Uploader, "flush", flush)
    (tmp_path / "stop").write_text("preemption-notice\n")
    args = [*TINY_ARGS, "--steps", "5", "--ckpt-dir", str(tmp_path / "ckpt"), "--stop-file", str(tmp_path / "stop"),
            "--progress-file", str(progress), "--ckpt-bucket", f"file://{tmp_path / 'bucket'}"]
    assert main(args) == exitcodes.PREEMPTED
    assert seen, "the stop save's upload was not waited for"
    assert seen[0]["checkpoint_step"] == 0 and seen[0]["state"] == "preempted"
