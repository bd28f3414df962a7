"""Build kit/data/spot-traces/aws-p3-v100-2023-02/ from the SkyNomad artifact's AWS V100 data.

    python scripts/convert_aws_v100_traces.py SKYNOMAD_CHECKOUT

Inputs (github.com/andylizf/skynomad-artifact, Apache-2.0): ``data/real/availability/2023-02-15/
processed/<zone>_v100_1.csv`` (``date,availability``: 1 = a p3.2xlarge spot instance could be had,
one row every ~195 s, the same timestamps in all nine zones) and ``data/v100_spot_prices.json`` (the
spot $/h per row and zone, checked there against the public AWS spot price archive). On-demand:
$3.06/h, the p3.2xlarge list price the artifact uses. Output: one kit trace per zone (format in
kit/data/spot-traces/README.md), ``gap_seconds`` 195 (the collection cadence; the mean row spacing
is 195.3 s).
"""

from __future__ import annotations

import csv
import json
import sys
from pathlib import Path

OUT = Path(__file__).resolve().parent.parent / "kit" / "data" / "spot-traces" / "aws-p3-v100-2023-02"
ON_DEMAND = 3.06
SOURCE = ("skynomad-artifact (Apache-2.0) data/real/availability/2023-02-15/processed and "
          "data/v100_spot_prices.json, converted by scripts/convert_aws_v100_traces.py")


def main(root: Path) -> int:
    processed = root / "data" / "real" / "availability" / "2023-02-15" / "processed"
    prices = json.loads((root / "data" / "v100_spot_prices.json").read_text())
    OUT.mkdir(parents=True, exist_ok=True)
    for path in sorted(processed.glob("*_v100_1.csv")):
        key = path.stem
        zone = key.removesuffix("_v100_1")
        with path.open() as handle:
            rows = list(csv.DictReader(handle))
        series = prices[key]
        if len(series) != len(rows):
            raise SystemExit(f"{key}: {len(rows)} rows but {len(series)} prices")
        trace = {
            "metadata": {"gap_seconds": 195, "start_utc": rows[0]["date"].replace(" ", "T") + "Z", "cloud": "aws",
                         "zone": zone, "instance_type": "p3.2xlarge", "gpus_per_instance": 1, "nodes_requested": 1,
                         "on_demand_price_per_hour": ON_DEMAND,
                         "convention": "data[i] = 1 if a p3.2xlarge spot instance could be had in tick i",
                         "source": SOURCE},
            "data": [int(r["availability"]) for r in rows],
            "prices": [round(float(p), 4) for p in series],
        }
        (OUT / f"{zone}.json").write_text(json.dumps(trace, separators=(",", ":")) + "\n")
        print(zone, len(rows), f"{sum(trace['data']) / len(rows):.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(Path(sys.argv[1])))
