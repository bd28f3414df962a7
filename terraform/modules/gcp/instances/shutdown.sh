#!/bin/bash
# kit shutdown-script: record whether this stop is a preemption (GCP sets instance/preempted=TRUE),
# then ask the trainer to checkpoint and stop before the VM goes (GCP gives about 30 s).
md=http://metadata.google.internal/computeMetadata/v1/instance
preempted=$(curl -sf -H "Metadata-Flavor: Google" "$md/preempted" || echo UNKNOWN)
name=$(curl -sf -H "Metadata-Flavor: Google" "$md/name" || hostname)
dir=/mnt/kit-disk/events
mkdir -p "$dir" 2>/dev/null || dir=/var/log
printf '{"kind": "shutdown", "instance": "%s", "preempted": "%s", "time": %s}\n' \
  "$name" "$preempted" "$(date +%s)" >> "$dir/shutdown.jsonl"
logger -t kit-shutdown "instance=$name preempted=$preempted"
# `kit bootstrap` (ansible role preemption_agent) installs the hook: it writes the trainer's stop
# file and waits for kit-trainer to finish its emergency save. Before bootstrap there is no trainer.
hook=/opt/kit/bin/kit-gcp-shutdown-hook
if [ -x "$hook" ]; then
  "$hook" "$preempted"
else
  mkdir -p /run/kit && touch /run/kit/stop 2>/dev/null || true
fi
