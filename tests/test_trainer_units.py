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
from training.metrics import mfu
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
    assert set(doc) == {"step", "total_steps", "step_time_s", "state", "time", "params_sha256"}
    assert doc["step"] == 3 and doc["state"] == "running" and doc["params_sha256"] is None
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


def _image_folder(root, n_per_class=5):
    from PIL import Image

    for c in ("a", "b", "c"):
        (root / c).mkdir(parents=True)
        for i in range(n_per_class):
            Image.new("RGB", (12, 12), (i * 40 % 255, len(c) * 60, 100)).save(root / c / f"{i}.png")


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
