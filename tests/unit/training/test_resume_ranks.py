"""Exact resume with 3 ranks (torchrun, gloo, CPU): the first step after a restart must reduce the
gradients exactly like the uninterrupted run's step (DDP's bucket layout, training/train.py wrap_model)."""
from __future__ import annotations

import shutil

import pytest

from tests.support.trainer import TINY, Run, command, digest, resumed

# 2 ranks do not show it: a 2-rank ring adds the two values in either order, a + b == b + a bit for bit
WORLD = 3


@pytest.mark.slow
def test_three_ranks_resume_ends_with_the_uninterrupted_digest(tmp_path):
    args = [*TINY, "--steps", "4", "--ckpt-every", "2", "--drop-path", "0.1"]
    straight = Run(command(WORLD, [*args, "--ckpt-dir", str(tmp_path / "a")]))
    assert straight.finish() == 0, straight.output
    # the run interrupted after step 2: its disk holds what the uninterrupted run's held then
    shutil.copytree(tmp_path / "a", tmp_path / "b")
    shutil.rmtree(tmp_path / "b" / "step-00000004")
    again = Run(command(WORLD, [*args, "--ckpt-dir", str(tmp_path / "b")]))
    assert again.finish() == 0, again.output
    point = resumed(again.output)
    assert point is not None and point[0] == 2, again.output
    assert digest(again.output) == digest(straight.output)
