"""The checkpoint bucket (training/bucket.py): upload and restore rates, against a plain copy in the same run.

For each store (``file://`` on this machine's disk, S3 through s3fs against moto in server mode on
loopback) it writes one real checkpoint of ``--mb`` megabytes with the trainer's Checkpointer, then:

* baseline: a plain copy of state.pt to the store (shutil / boto3 ``upload_file``, no checks);
* upload: ``Bucket.upload`` (stream + sha256, read back and hashed, marker last);
* restore: ``Bucket.restore_newer`` (download, verify, rename into place).

and prints MB/s for each, plus what moving that checkpoint between regions costs at the clouds' list
egress prices (kit.policy.offers). moto keeps objects in memory and has no network in between, so
its figures bound kit's own overhead, not S3's throughput (S3 and GCS sustain about 10 Gbit/s for
one multi-part transfer: kit.policy.offers.DEFAULT_TRANSFER_GBPS).

    .venv/bin/python bench/bucket.py [--mb 256] [--repeats 3]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def checkpoint(directory: Path, mb: int) -> Path:
    import torch

    from training.checkpoint import Checkpointer, step_dir_name

    ck = Checkpointer(directory, keep=5, log=lambda m: None)
    ck.save(100, {"step": 100, "w": torch.randn(mb * (1 << 20) // 4)}, sync=True)
    return directory / step_dir_name(100)


def timed(fn, repeats: int) -> float:
    runs = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        runs.append(time.perf_counter() - t0)
    return statistics.median(runs)


def moto_s3() -> tuple[str, object]:
    import logging

    from moto.server import ThreadedMotoServer

    from kit.backends.local import free_port

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # one access-log line per request otherwise
    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    endpoint = f"http://127.0.0.1:{port}"
    os.environ.update(AWS_ACCESS_KEY_ID="testing", AWS_SECRET_ACCESS_KEY="testing", AWS_DEFAULT_REGION="us-east-1",
                      AWS_ENDPOINT_URL=endpoint)
    return endpoint, server


def measure(url: str, src: Path, scratch: Path, repeats: int, plain) -> dict:
    from training.bucket import Bucket

    bucket = Bucket(url, keep=2, log=lambda m: None)

    def upload():
        bucket.fs.rm(bucket.root, recursive=True) if bucket.fs.exists(bucket.root) else None
        bucket.upload(src)

    def restore():
        shutil.rmtree(scratch, ignore_errors=True)
        scratch.mkdir(parents=True)
        assert bucket.restore_newer(scratch, -1) == 100

    return {"plain copy": timed(plain, repeats), "upload (verified)": timed(upload, repeats),
            "restore (verified)": timed(restore, repeats)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mb", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    from kit.policy.offers import EGRESS_OTHER_PER_GB, EGRESS_PER_GB

    work = Path(tempfile.mkdtemp(prefix="kit-bench-bucket-"))
    try:
        src = checkpoint(work / "disk", args.mb)
        size_mb = (src / "state.pt").stat().st_size / (1 << 20)
        results = {"file://": measure(f"file://{work / 'bucket'}/job", src, work / "restore", args.repeats,
                                      lambda: shutil.copyfile(src / "state.pt", work / "plain.pt"))}
        import boto3

        endpoint, server = moto_s3()
        s3 = boto3.client("s3", region_name="us-east-1", endpoint_url=endpoint)
        s3.create_bucket(Bucket="ckpts")
        results["s3 (moto)"] = measure("s3://ckpts/kit/job", src, work / "restore", args.repeats,
                                       lambda: s3.upload_file(str(src / "state.pt"), "ckpts", "plain/state.pt"))
        server.stop()  # type: ignore[attr-defined]
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"checkpoint: {size_mb:.0f} MB, median of {args.repeats}, this machine ({os.cpu_count()} cores)\n")
    print("| store | plain copy (baseline) | upload: stream + sha256 + read back + marker | restore: download + verify |")
    print("|---|---:|---:|---:|")
    for store, r in results.items():
        rate = {k: size_mb / v for k, v in r.items()}
        print(f"| {store} | {rate['plain copy']:.0f} MB/s | {rate['upload (verified)']:.0f} MB/s "
              f"({r['upload (verified)'] / r['plain copy']:.1f}x the copy's time) | {rate['restore (verified)']:.0f} MB/s |")
    print("\nmoving a checkpoint between regions, $ per GB (list prices, kit.policy.offers):")
    for pair, price in sorted(EGRESS_PER_GB.items()):
        print(f"  {pair[0]} <-> {pair[1]}: ${price:.2f}/GB (a 50 GB checkpoint: ${50 * price:.2f})")
    print(f"  other continents: ${EGRESS_OTHER_PER_GB:.2f}/GB (50 GB: ${50 * EGRESS_OTHER_PER_GB:.2f}); within a region: free")


if __name__ == "__main__":
    main()
