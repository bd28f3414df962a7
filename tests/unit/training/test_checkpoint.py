"""Issue 3 (d): SIGKILL during checkpoint writes (>= 20 random moments) never leaves a newest complete
checkpoint that fails to load. A non-atomic writer (negative control) is caught by the same check."""
from __future__ import annotations

import json
import os
import subprocess
import sys

from tests.support import REPO

HARNESS = REPO / "tests" / "support" / "ckpt_harness.py"


def run_harness(tmp_path, reps, mode):
    env = dict(os.environ, OMP_NUM_THREADS="1")
    out = subprocess.run([sys.executable, str(HARNESS), str(tmp_path / mode), str(reps), "7", mode],
                         capture_output=True, text=True, env=env, timeout=300, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])["results"]


def test_d_sigkill_during_checkpoint_write_newest_complete_always_loads(tmp_path):
    results = run_harness(tmp_path, 24, "atomic")
    assert len(results) == 24
    bad = [r for r in results if not r["ok"]]
    assert not bad, bad
    assert sum(r["mid_write"] for r in results) >= 5, results  # the kills really hit writes in progress
    newest = [r["newest"] for r in results if r["newest"] is not None]
    assert newest == sorted(newest) and newest[-1] > newest[0]  # progress despite the kills


def test_d_negative_control_non_atomic_writer_is_detected(tmp_path):
    results = run_harness(tmp_path, 12, "naive")
    assert any(not r["ok"] for r in results), results
