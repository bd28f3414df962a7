"""Process exit codes of ``python -m training.train`` (fixed interface: other parts compare them).

* ``DONE`` (0): the run reached ``--steps``; a final checkpoint is on disk.
* ``PREEMPTED`` (75, ``EX_TEMPFAIL``): stopped on SIGTERM/SIGINT or the stop file after a synchronous
  save; relaunch with the same flags to resume.
* ``USAGE`` (2): bad flags or unusable input (nothing was written).
* anything else: a crash; relaunching resumes from the newest complete periodic checkpoint.
"""

DONE = 0
PREEMPTED = 75
USAGE = 2
