"""The command line shared by the replay benchmarks (bench/policies.py, bench/zones.py)."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path

from kit.paths import SPOT_TRACES_DIR

GCP = "gcp-a3-h100-2025-10"
AWS = "aws-p3-v100-2023-02"  # held out: no constant of any policy was chosen on it
# The AWS cells of bench/policies.py: (R0, d) per zone, 1 node, C0 = 48 h
AWS_CELLS = tuple((deadline, d) for deadline in (53.3, 60.0, 72.0) for d in (0.2, 0.1))


def parse(doc: str | None, extra: Callable[[argparse.ArgumentParser], None] | None = None) -> argparse.Namespace:
    """The shared flags, and ``extra``'s (a benchmark's own) added to them."""
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--traces", type=Path, default=SPOT_TRACES_DIR / GCP)
    ap.add_argument("--out", type=Path, default=None, help="write every summary as JSON here")
    ap.add_argument("--skip-synthetic", action="store_true")
    if extra is not None:
        extra(ap)
    return ap.parse_args()
