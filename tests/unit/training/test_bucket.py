"""The durable tier (training/bucket.py): only complete, verified copies are ever restored.

``file://`` runs the protocol on a local directory; the last tests run the same code against moto's
S3 in server mode through s3fs (moto stores objects in memory and does not model S3's checksums or
consistency; the marker-last ordering is what this tests), and against a loopback server shaped like
the GCS JSON API (gcp-storage-emulator, through gcsfs with STORAGE_EMULATOR_HOST; it has no Storage
Control API, so gcsfs's bucket-layout lookup is switched off with GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT).
"""
from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
import torch

from kit.backends.local import free_port
from training.bucket import Bucket, Uploader
from training.checkpoint import (
    MARKER,
    STATE_FILE,
    Checkpointer,
    CorruptCheckpoint,
    newest_loadable,
    step_dir_name,
)


def save(ckpt_dir: Path, step: int) -> Path:
    ck = Checkpointer(ckpt_dir, keep=5, log=lambda m: None)
    ck.save(step, {"step": step, "w": torch.full((256,), float(step))}, sync=True)
    return ckpt_dir / step_dir_name(step)


@pytest.fixture
def bucket(tmp_path):
    logs: list[str] = []
    b = Bucket(f"file://{tmp_path / 'bucket' / 'job'}", keep=2, log=logs.append)
    b.logs = logs  # type: ignore[attr-defined]
    return b


def remote(b: Bucket, step: int, name: str) -> Path:
    return Path(b.root) / step_dir_name(step) / name


def test_upload_then_restore_into_an_empty_disk_gives_the_same_verified_checkpoint(bucket, tmp_path):
    src = save(tmp_path / "disk-a", 100)
    assert bucket.upload(src) is True
    assert bucket.upload(src) is False  # already there: nothing copied twice
    assert bucket.complete_steps() == [100]
    disk = tmp_path / "disk-b"
    disk.mkdir()
    assert bucket.restore_newer(disk, -1) == 100
    step, path, state = newest_loadable(disk)
    assert step == 100 and path == disk / step_dir_name(100) and torch.equal(state["w"], torch.full((256,), 100.0))
    assert [p.name for p in disk.iterdir()] == [step_dir_name(100)]  # no temporary left behind


def test_nothing_newer_in_the_bucket_downloads_nothing(bucket, tmp_path):
    bucket.upload(save(tmp_path / "disk", 100))
    assert bucket.restore_newer(tmp_path / "disk", 100) is None
    assert bucket.restore_newer(tmp_path / "disk", 150) is None


def test_a_cut_short_upload_has_no_marker_and_is_never_restored(bucket, tmp_path, monkeypatch):
    bucket.upload(save(tmp_path / "disk", 100))
    newer = save(tmp_path / "disk", 200)
    calls = []

    def cut(path, value, **kw):  # the node dies before the marker is written
        calls.append(path)
        raise OSError("connection reset")

    monkeypatch.setattr(bucket.fs, "pipe_file", cut)  # fsspec shares filesystem instances: undo after
    with pytest.raises(OSError):
        bucket.upload(newer)
    assert calls and remote(bucket, 200, STATE_FILE).exists() and not remote(bucket, 200, MARKER).exists()
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    assert bucket.restore_newer(fresh, -1) == 100  # the older complete copy, not the partial one


def test_a_corrupted_copy_is_skipped_for_the_older_one_and_left_in_place(bucket, tmp_path):
    for step in (100, 200):
        bucket.upload(save(tmp_path / "disk", step))
    data = bytearray(remote(bucket, 200, STATE_FILE).read_bytes())
    data[len(data) // 2] ^= 0xFF
    remote(bucket, 200, STATE_FILE).write_bytes(bytes(data))
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    assert bucket.restore_newer(fresh, -1) == 100
    assert any("sha256 mismatch" in line for line in bucket.logs)
    assert remote(bucket, 200, STATE_FILE).exists()  # never deleted by surprise
    assert sorted(p.name for p in fresh.iterdir()) == [step_dir_name(100)]


def test_a_truncated_copy_and_a_marker_of_another_step_are_skipped(bucket, tmp_path):
    for step in (100, 200, 300):
        Bucket(bucket.url, keep=5).upload(save(tmp_path / "disk", step))
    remote(bucket, 300, STATE_FILE).write_bytes(remote(bucket, 300, STATE_FILE).read_bytes()[:100])
    remote(bucket, 200, MARKER).write_bytes(remote(bucket, 100, MARKER).read_bytes())
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    assert bucket.restore_newer(fresh, -1) == 100
    assert any("truncated" in line for line in bucket.logs)
    assert any("says step 100" in line for line in bucket.logs)


def test_a_local_checkpoint_that_fails_its_marker_is_not_uploaded(bucket, tmp_path):
    src = save(tmp_path / "disk", 100)
    (src / STATE_FILE).write_bytes((src / STATE_FILE).read_bytes()[:-1] + b"X")
    with pytest.raises(CorruptCheckpoint):
        bucket.upload(src)
    assert bucket.complete_steps() == []


def test_a_copy_that_reads_back_different_gets_no_marker(bucket, tmp_path, monkeypatch):
    real_open = bucket.fs.open

    def lossy(path, mode="rb", **kw):  # storage that drops the last byte it is given
        f = real_open(path, mode, **kw)
        if "w" in mode and path.endswith(STATE_FILE):
            write = f.write
            f.write = lambda b: write(bytes(b)[:-1]) + 1
        return f

    monkeypatch.setattr(bucket.fs, "open", lossy)
    with pytest.raises(OSError, match="read back"):
        bucket.upload(save(tmp_path / "disk", 100))
    assert bucket.complete_steps() == []


def test_prune_keeps_the_newest_two_and_removes_leftovers(bucket, tmp_path):
    disk = tmp_path / "disk"
    partial = save(disk, 50)
    bucket.fs.makedirs(str(remote(bucket, 50, "")), exist_ok=True)
    remote(bucket, 50, STATE_FILE).write_bytes((partial / STATE_FILE).read_bytes())  # an old cut-short copy
    for step in (100, 200, 300):
        bucket.upload(save(disk, step))
    assert bucket.complete_steps() == [300, 200]
    assert sorted(p.name for p in Path(bucket.root).iterdir()) == [step_dir_name(200), step_dir_name(300)]


def test_the_uploader_copies_the_newest_and_logs_failures_without_raising(bucket, tmp_path):
    disk = tmp_path / "disk"
    paths = [save(disk, s) for s in (100, 200, 300)]
    gate = threading.Event()
    real = bucket.upload

    def slow(path):
        gate.wait(10)
        return real(path)

    bucket.upload = slow
    up = Uploader(bucket)
    for p in paths:
        up.submit(p)
    gate.set()
    assert up.flush(30)
    assert 300 in up.uploaded and 200 not in up.uploaded  # a pending older one is skipped
    up.submit(tmp_path / "missing" / step_dir_name(400))
    assert up.close(30)
    assert any("upload of" in line and "failed" in line for line in bucket.logs)


# -- the same protocol on S3 (moto server mode, s3fs) ---------------------------------------------

@pytest.fixture
def s3_url(monkeypatch):
    from tests.support.moto import s3_bucket

    with s3_bucket(monkeypatch) as url:
        yield f"{url}/kit/job"


@pytest.fixture
def gs_url(monkeypatch):
    pytest.importorskip("gcsfs")
    emulator = pytest.importorskip("gcp_storage_emulator.server")
    monkeypatch.setenv("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")  # read when gcsfs is first imported
    port = free_port()
    server = emulator.create_server("127.0.0.1", port, in_memory=True, default_bucket="ckpts")
    server.start()
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", f"http://127.0.0.1:{port}")
    yield "gs://ckpts/kit/job"
    server.stop()


def _put(url: str, key: str, body: bytes) -> None:
    import fsspec

    fs, root = fsspec.core.url_to_fs(url)
    fs.pipe_file(f"{root.split('/')[0]}/{key}", body)


def _get(url: str, key: str) -> bytes:
    import fsspec

    fs, root = fsspec.core.url_to_fs(url)
    return fs.cat_file(f"{root.split('/')[0]}/{key}")


@pytest.mark.parametrize("store", ["s3_url", "gs_url"])
def test_object_stores_upload_restore_and_skip_partial_and_corrupt_copies(store, request, tmp_path):
    url = request.getfixturevalue(store)
    logs: list[str] = []
    b = Bucket(url, keep=2, log=logs.append)
    for step in (100, 200):
        assert b.upload(save(tmp_path / "disk", step))
    _put(url, f"kit/job/{step_dir_name(300)}/{STATE_FILE}", b"half")  # a copy cut short: no marker
    key = f"kit/job/{step_dir_name(200)}/{STATE_FILE}"
    body = bytearray(_get(url, key))
    body[-10] ^= 0x01
    _put(url, key, bytes(body))
    assert b.complete_steps() == [200, 100]
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    t0 = time.monotonic()
    assert b.restore_newer(fresh, -1) == 100
    assert time.monotonic() - t0 < 60
    assert newest_loadable(fresh)[0] == 100
    assert any("sha256 mismatch" in line for line in logs)


# -- regressions: local retention, a damaged copy of a step held locally, a durable downloaded marker ------

def test_an_upload_completes_when_local_retention_removes_the_directory_mid_copy(bucket, tmp_path, monkeypatch):
    src = save(tmp_path / "disk", 100)
    real_open = bucket.fs.open

    def pruned_meanwhile(path, mode="rb", **kw):  # Checkpointer._prune renames the directory away, then deletes it
        if "w" in mode and src.exists():
            gone = src.with_name(f".tmp-pruned-{src.name}")
            src.rename(gone)
            for f in gone.iterdir():
                f.unlink()
            gone.rmdir()
        return real_open(path, mode, **kw)

    monkeypatch.setattr(bucket.fs, "open", pruned_meanwhile)
    assert bucket.upload(src) is True
    monkeypatch.undo()
    assert not src.exists() and bucket.complete_steps() == [100]
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    assert bucket.restore_newer(fresh, -1) == 100


def test_the_uploader_records_the_step_of_a_directory_pruned_after_its_upload(bucket, tmp_path):
    src = save(tmp_path / "disk", 100)
    real = bucket.upload

    def then_pruned(path):
        done = real(path)
        for f in src.iterdir():
            f.unlink()
        src.rmdir()
        return done

    bucket.upload = then_pruned
    up = Uploader(bucket)
    up.submit(src)
    assert up.close(30)
    assert up.uploaded == [100], bucket.logs
    assert not any("failed" in line for line in bucket.logs)


def test_a_bucket_copy_that_failed_verification_is_replaced_by_the_good_local_one(bucket, tmp_path):
    disk = tmp_path / "disk"
    for step in (100, 200):
        bucket.upload(save(disk, step))
    data = bytearray(remote(bucket, 200, STATE_FILE).read_bytes())
    data[len(data) // 2] ^= 0xFF
    remote(bucket, 200, STATE_FILE).write_bytes(bytes(data))
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    assert bucket.restore_newer(fresh, -1) == 100  # 200 fails verification, is skipped and remembered
    assert bucket.upload(disk / step_dir_name(200)) is True  # the good local copy replaces the damaged one
    again = tmp_path / "again"
    again.mkdir()
    assert bucket.restore_newer(again, -1) == 200
    assert bucket.upload(disk / step_dir_name(200)) is False  # now verified: not copied twice


def test_a_bucket_copy_with_other_checksums_than_the_local_marker_is_replaced(bucket, tmp_path):
    a, b = save(tmp_path / "a", 100), tmp_path / "b"
    Checkpointer(b, keep=5, log=lambda m: None).save(100, {"step": 100, "w": torch.zeros(256)}, sync=True)
    assert bucket.upload(b / step_dir_name(100)) is True
    assert bucket.upload(a) is True  # same step, other bytes: the bucket copy must match the disk that uploads
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    assert bucket.restore_newer(fresh, -1) == 100
    assert torch.equal(newest_loadable(fresh)[2]["w"], torch.full((256,), 100.0))


def test_the_downloaded_marker_is_fsynced_before_the_rename(bucket, tmp_path, monkeypatch):
    import os

    bucket.upload(save(tmp_path / "disk", 100))
    synced: list[str] = []
    real_fsync = os.fsync

    def record(fd):
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        return real_fsync(fd)

    monkeypatch.setattr(os, "fsync", record)
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    assert bucket.restore_newer(fresh, -1) == 100
    assert any(p.endswith(f"/{MARKER}") and ".tmp-bucket-" in p for p in synced), synced
