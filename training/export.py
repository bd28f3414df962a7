"""Export a finished job's final checkpoint: a verified copy, the model weights, a manifest.

``kit train`` runs this on the machine it runs on, against the checkpoint directory of a node (the
local backend's disk directory, or a copy fetched over SSH from a cloud node), and deletes the
cloud data disks only after it succeeded. It never modifies the source directory.

Output (``OUT/step-<N>/``, written to a temporary directory first and renamed when complete)::

    checkpoint/     the training checkpoint as the trainer wrote it (resumable, fine-tunable)
    model.pt        the model's state_dict alone (``torch.load(..., weights_only=True)``)
    export.json     step, model, params_sha256 (same digest the trainer logs), file checksums

The parameters' digest is recomputed from the checkpoint and compared with the trainer's final
``params_sha256`` when one is given, so an export of the wrong step or a corrupted copy fails.

    python -m training.export CKPT_DIR OUT [--step N] [--params-sha256 HEX]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from pathlib import Path

import torch

from training import checkpoint as ckpt
from training.contract import fsync_dir
from training.model import parameter_names, params_sha256_of


class ExportError(Exception):
    pass


def newest_verified(ckpt_dir: Path, log=print) -> tuple[int, Path, dict]:
    """Newest checkpoint whose files match their marker, without touching the directory."""
    found = ckpt.list_complete(Path(ckpt_dir))
    if not found:
        raise ExportError(f"no complete checkpoint in {ckpt_dir}")
    for step, path in found:
        try:
            return step, path, ckpt.read_verified(path)
        except ckpt.CorruptCheckpoint as error:
            log(f"warning: skipping {path.name}: {error}")
        except ckpt.UnloadableCheckpoint as error:  # intact bytes that do not load: not a reason to skip
            raise ExportError(str(error)) from error
    raise ExportError(f"no checkpoint in {ckpt_dir} passes verification ({len(found)} tried)")


def export(ckpt_dir: str | Path, out: str | Path, *, step: int | None = None,
           params_sha256: str | None = None, log=print) -> dict:
    """Export the newest verified checkpoint of ``ckpt_dir`` into ``out/step-<N>``; returns the manifest
    (with ``path``). Raises ExportError when it is not the expected step or digest."""
    found_step, source, state = newest_verified(Path(ckpt_dir), log=log)
    if step is not None and found_step != step:
        raise ExportError(f"newest verified checkpoint in {ckpt_dir} is step {found_step}, the job finished at {step}")
    digest = params_sha256_of(state["model"], parameter_names(state["args"]))
    if params_sha256 and digest != params_sha256:
        raise ExportError(f"{source}: parameters hash to {digest[:16]}…, the trainer reported {params_sha256[:16]}…")
    out = Path(out)
    final = out / ckpt.step_dir_name(found_step)
    if final.exists():
        try:
            manifest = json.loads((final / "export.json").read_text())
        except (OSError, ValueError):
            manifest = None
        if manifest is not None and manifest.get("params_sha256") != digest:
            raise ExportError(f"{final} exists with a different model")
        problem = damage(final, source) if manifest is not None else "export.json missing or unreadable"
        if problem is None:
            return {**manifest, "path": str(final)}
        aside = final.with_name(f"{final.name}.damaged-{int(time.time() * 1000)}")
        log(f"warning: existing export {final} is damaged ({problem}); moved to {aside.name}, exporting again")
        final.rename(aside)  # kept, never deleted
    tmp = out / f".tmp-{final.name}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    shutil.copytree(source, tmp / "checkpoint")
    torch.save(state["model"], tmp / "model.pt")
    model_sha, model_bytes = ckpt.sha256_file(tmp / "model.pt")
    manifest = {"step": found_step, "model": state["args"]["model"], "args": state["args"],
                "params_sha256": digest, "source": str(source), "exported_at": time.time(),
                "files": {"model.pt": {"bytes": model_bytes, "sha256": model_sha}}}
    (tmp / "export.json").write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    ckpt.verify(tmp / "checkpoint")  # the copy, not just the source
    os.sync()
    tmp.rename(final)
    fsync_dir(out)  # the rename itself is durable before anyone deletes the source disks
    return {**manifest, "path": str(final)}


def damage(final: Path, source: Path) -> str | None:
    """Why an existing export ``final`` of ``source`` cannot be trusted, or None when it checks out:
    model.pt against the manifest's size and sha256, the checkpoint copy against its marker, and that
    marker against the source's (same files, same checksums)."""
    try:
        manifest = json.loads((final / "export.json").read_text())
        for name, meta in manifest["files"].items():
            sha, size = ckpt.sha256_file(final / name)
            if size != meta["bytes"] or sha != meta["sha256"]:
                return f"{name} does not match export.json"
        copied = ckpt.verify(final / "checkpoint")
        original = json.loads((Path(source) / ckpt.MARKER).read_text())
    except ckpt.CorruptCheckpoint as error:
        return f"checkpoint copy: {error}"
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as error:
        return f"{type(error).__name__}: {error}"
    if copied.get("files") != original.get("files") or copied.get("step") != original.get("step"):
        return "checkpoint copy is not the source checkpoint"
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m training.export", description=__doc__.splitlines()[0])
    parser.add_argument("ckpt_dir", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("--step", type=int, help="fail unless the newest verified checkpoint is this step")
    parser.add_argument("--params-sha256", help="fail unless the parameters hash to this (the trainer's final digest)")
    args = parser.parse_args(argv)
    try:
        manifest = export(args.ckpt_dir, args.out, step=args.step, params_sha256=args.params_sha256,
                          log=lambda m: print(m, file=sys.stderr))
    except ExportError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    print(f"exported step {manifest['step']} to {manifest['path']} params_sha256={manifest['params_sha256']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
