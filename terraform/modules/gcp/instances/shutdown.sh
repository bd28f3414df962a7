#!/bin/bash
# kit shutdown-script: record whether this stop is a preemption (GCP sets instance/preempted=TRUE).
md=http://metadata.google.internal/computeMetadata/v1/instance
preempted=$(curl -sf -H "Metadata-Flavor: Google" "$md/preempted" || echo UNKNOWN)
name=$(curl -sf -H "Metadata-Flavor: Google" "$md/name" || hostname)
dir=/mnt/kit-disk/events
mkdir -p "$dir" 2>/dev/null || dir=/var/log
printf '{"kind": "shutdown", "instance": "%s", "preempted": "%s", "time": %s}\n' \
  "$name" "$preempted" "$(date +%s)" >> "$dir/shutdown.jsonl"
logger -t kit-shutdown "instance=$name preempted=$preempted"
# Ask the trainer to stop and checkpoint (it watches this file); GCP gives ~30 s.
touch /run/kit-stop 2>/dev/null || true
sleep 25
