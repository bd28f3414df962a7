"""Process exit codes of ``python -m training.train`` (fixed interface: other parts compare them).

* ``DONE`` (0): the run reached ``--steps``; a final checkpoint is on disk.
* ``PREEMPTED`` (75, ``EX_TEMPFAIL``): stopped on SIGTERM/SIGINT or the stop file after a synchronous
  save; relaunch with the same flags to resume.
* ``USAGE`` (2): bad flags or unusable input (nothing was written).
* ``CHECKPOINT_ERROR`` (3): checkpoints exist but none can be resumed from (one verifies but does not
  load, e.g. after a torch upgrade or out of memory; or every one is corrupt). Nothing was trained,
  moved or deleted; the trainer refuses to start over from step 0. A crash class for :func:`outcome`.
* anything else: a crash; relaunching resumes from the newest complete periodic checkpoint.
"""

DONE = 0
PREEMPTED = 75
USAGE = 2
CHECKPOINT_ERROR = 3


def outcome(returncode: int, progress_file: str | None = None, started_at: float | None = None) -> str:
    """Classify a finished run as ``"done"``, ``"preempted"`` or ``"crashed"``.

    Run directly (``python -m training.train``) the exit code is enough. Under torchrun the agent
    itself exits 1 whenever a worker exits non-zero (75 included; the worker codes are only in its
    error summary, and not even there when torchrun itself was signalled), so the node-local progress
    file decides: local rank 0 of every node writes it, and ``state == "preempted"`` written after
    ``started_at`` means the stop save completed (on every node: it is written after a barrier).
    """
    if returncode == DONE:
        return "done"
    if returncode == PREEMPTED:
        return "preempted"
    if progress_file:
        import json

        try:
            with open(progress_file) as f:
                doc = json.load(f)
        except (OSError, ValueError):
            doc = None
        if doc and (started_at is None or float(doc.get("time", 0)) >= started_at):
            if doc.get("state") == "preempted":
                return "preempted"
            if doc.get("state") == "done":
                return "done"
    return "crashed"
