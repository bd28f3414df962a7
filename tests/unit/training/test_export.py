"""training.export: a real tiny run's final checkpoint exported, digest equal to the trainer's."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from tests.support.trainer import REPO, TINY, digest, env
from training.export import ExportError, export, main


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    ckpt_dir = tmp_path_factory.mktemp("run") / "ckpt"
    proc = subprocess.run([sys.executable, "-m", "training.train", *TINY, "--steps", "6", "--ckpt-every", "3",
                           "--keep", "3", "--ckpt-dir", str(ckpt_dir)], cwd=REPO, env=env(), capture_output=True,
                          text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return ckpt_dir, digest(proc.stdout + proc.stderr)


def test_export_matches_the_trainers_digest(finished_run, tmp_path):
    ckpt_dir, sha = finished_run
    manifest = export(ckpt_dir, tmp_path / "out", step=6, params_sha256=sha)
    out = tmp_path / "out" / "step-00000006"
    assert manifest["path"] == str(out) and manifest["params_sha256"] == sha and manifest["step"] == 6
    assert json.loads((out / "export.json").read_text())["params_sha256"] == sha
    weights = torch.load(out / "model.pt", weights_only=True)
    assert "head.weight" in weights and (out / "checkpoint" / "COMPLETE").is_file()
    assert export(ckpt_dir, tmp_path / "out", step=6, params_sha256=sha)["path"] == str(out), "idempotent"
    assert not [p for p in (tmp_path / "out").iterdir() if p.name.startswith(".tmp")]


def test_export_refuses_wrong_step_digest_and_skips_corrupt(finished_run, tmp_path):
    ckpt_dir, _ = finished_run
    with pytest.raises(ExportError, match="step 6, the job finished at 9"):
        export(ckpt_dir, tmp_path / "a", step=9)
    with pytest.raises(ExportError, match="trainer reported"):
        export(ckpt_dir, tmp_path / "b", params_sha256="0" * 64)
    # a truncated newest checkpoint (in a copy: the exporter never touches its source) is skipped
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(ckpt_dir, copy)
    state = copy / "step-00000006" / "state.pt"
    state.write_bytes(state.read_bytes()[:100])
    warnings = []
    with pytest.raises(ExportError, match="step 3, the job finished at 6"):
        export(copy, tmp_path / "c", step=6, log=warnings.append)
    assert warnings and "step-00000006" in warnings[0]
    assert (copy / "step-00000006").is_dir(), "source left as it was"
    assert main([str(copy), str(tmp_path / "d")]) == 0, "without an expected step the newest good one is exported"
    assert (tmp_path / "d" / "step-00000003" / "model.pt").is_file()
    assert main([str(tmp_path / "empty"), str(tmp_path / "e")]) == 1


@pytest.mark.parametrize("damage", ["model", "checkpoint_copy"])
def test_damaged_existing_export_is_not_accepted(finished_run, tmp_path, damage):
    """An existing export is only reused when its files still match: a damaged one is moved aside
    (kept) and exported again, because kit train deletes the disks once the export succeeded."""
    ckpt_dir, sha = finished_run
    first = export(ckpt_dir, tmp_path / "out", step=6, params_sha256=sha)
    final = tmp_path / "out" / "step-00000006"
    victim = final / "model.pt" if damage == "model" else final / "checkpoint" / "state.pt"
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 0x01
    victim.write_bytes(bytes(data))
    warnings = []
    again = export(ckpt_dir, tmp_path / "out", step=6, params_sha256=sha, log=warnings.append)
    assert again["path"] == str(final) and again["exported_at"] != first["exported_at"], "exported again"
    assert warnings and "damaged" in warnings[0]
    aside = [p for p in (tmp_path / "out").iterdir() if p.name.startswith("step-00000006.damaged-")]
    assert len(aside) == 1 and (aside[0] / "export.json").is_file(), "the damaged copy is kept, not deleted"
    from training import checkpoint
    from training.export import damage as damage_of

    assert damage_of(final, ckpt_dir / "step-00000006") is None
    checkpoint.verify(final / "checkpoint")
