"""Node agent: watches the cloud's preemption notice, stops the trainer, reports.

``python -m training.agent --cloud aws|gcp|local --instance ID --node-rank N --stop-file P
--progress-file P --event-dir DIR [--watcher-url U --watcher-token-file F --cluster NAME]
[--metadata-url URL] [--interval 2]``

* AWS: IMDSv2 — ``PUT /latest/api/token`` (header ``X-aws-ec2-metadata-token-ttl-seconds``), then
  ``GET /latest/meta-data/spot/instance-action`` (404 = nothing; 200 JSON ``{"action", "time"}``
  = notice) and ``/latest/meta-data/events/recommendations/rebalance`` (404 = nothing; 200 JSON
  ``{"noticeTime": ...}`` = rebalance recommendation). A 401 renews the token.
* GCP: ``GET /computeMetadata/v1/instance/preempted`` with ``Metadata-Flavor: Google`` -> ``TRUE``/``FALSE``.
* local: ``--metadata-url`` is a file path (``<node_dir>/metadata/preempted``); content ``TRUE`` = notice.

On a notice: write the preemption marker (``--marker-file``: ``training.launch`` will not start torchrun
again on this node; it lives in ``/run``, emptied at boot) and the stop file (the trainer saves and exits
75), append the event to ``<event-dir>/events.jsonl``, POST it to the watcher (with retries). While the
notice stays active every poll re-creates a removed marker. SIGTERM/SIGINT without a notice (after one
last poll) is a normal shutdown (event kind ``shutdown``). Progress from ``--progress-file`` is
heartbeated to the watcher.

POSTs run on a background thread: an unreachable watcher never delays the next poll (every <= 2 s).
Heartbeats are coalesced (only the newest pending one is sent); on exit pending events get up to
``--flush-timeout`` seconds.
"""
from __future__ import annotations

import argparse
import http.client
import json
import logging
import os
import queue
import signal
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

from training.contract import EVENTS_FILE, PREEMPTION_NOTICE, PROGRESS_DETAIL, read_json, write_atomic

log = logging.getLogger("kit.agent")

DEFAULT_METADATA = {"aws": "http://169.254.169.254", "gcp": "http://metadata.google.internal"}
HTTP_TIMEOUT = 2.0
# what a bad answer raises besides OSError: a truncated body (IncompleteRead), a status line that is not
# HTTP (BadStatusLine); neither is an OSError (https://docs.python.org/3/library/http.client.html)
NETWORK_ERRORS = (OSError, http.client.HTTPException)
MILESTONE_RETRIES = 3  # a progress report whose state or checkpoint step changed (a heartbeat gets 1)


class MetadataError(Exception):
    pass


def _request(url: str, method: str = "GET", headers: dict | None = None, timeout: float = HTTP_TIMEOUT):
    req = urllib.request.Request(url, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, resp.read().decode("utf-8", "replace")
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode("utf-8", "replace")


def _json_object(body: str) -> dict:
    """A metadata answer's JSON object; anything else (not JSON, a list, a number) as its raw text."""
    try:
        detail = json.loads(body)
    except ValueError:
        return {"raw": body}
    return detail if isinstance(detail, dict) else {"raw": body}


class AwsProbe:
    def __init__(self, base: str):
        self.base = base.rstrip("/")
        self.token: str | None = None
        self.rebalance_seen = False

    def _token(self) -> str:
        status, body = _request(f"{self.base}/latest/api/token", "PUT",
                                {"X-aws-ec2-metadata-token-ttl-seconds": "21600"})
        if status != 200:
            raise MetadataError(f"IMDSv2 token PUT returned {status}")
        return body.strip()

    def _get(self, path: str) -> tuple[int, str]:
        for _ in range(2):
            if self.token is None:
                self.token = self._token()
            status, body = _request(f"{self.base}{path}", headers={"X-aws-ec2-metadata-token": self.token})
            if status == 401:
                self.token = None
                continue
            return status, body
        raise MetadataError(f"IMDSv2 {path}: 401 after renewing the token")

    def poll(self) -> list[tuple[str, dict]]:
        events = []
        status, body = self._get("/latest/meta-data/spot/instance-action")
        if status == 200:
            detail = _json_object(body)
            if detail.get("action") in ("terminate", "stop", "hibernate"):
                events.append((PREEMPTION_NOTICE, detail))
        elif status != 404:
            raise MetadataError(f"spot/instance-action returned {status}")
        if not self.rebalance_seen:
            status, body = self._get("/latest/meta-data/events/recommendations/rebalance")
            if status == 200:
                self.rebalance_seen = True
                events.append(("rebalance-recommendation", _json_object(body)))
        return events


class GcpProbe:
    def __init__(self, base: str):
        self.base = base.rstrip("/")

    def poll(self) -> list[tuple[str, dict]]:
        status, body = _request(f"{self.base}/computeMetadata/v1/instance/preempted",
                                headers={"Metadata-Flavor": "Google"})
        if status != 200:
            raise MetadataError(f"instance/preempted returned {status}")
        if body.strip().upper() == "TRUE":
            return [(PREEMPTION_NOTICE, {"preempted": "TRUE"})]
        return []


class LocalProbe:
    def __init__(self, path: str):
        self.path = Path(path)

    def poll(self) -> list[tuple[str, dict]]:
        try:
            text = self.path.read_text()
        except OSError:
            return []
        if text.strip().upper() == "TRUE":
            return [(PREEMPTION_NOTICE, {"preempted": "TRUE", "file": str(self.path)})]
        return []


PROBES = {"aws": AwsProbe, "gcp": GcpProbe, "local": LocalProbe}  # one notice reader per cloud


def make_probe(cloud: str, metadata_url: str | None):
    if cloud not in PROBES:
        raise ValueError(f"unknown cloud {cloud!r}")
    url = metadata_url or DEFAULT_METADATA.get(cloud)
    if not url:
        raise ValueError(f"--cloud {cloud} needs --metadata-url (the local node's metadata/preempted file)")
    return PROBES[cloud](url)


class Sender:
    """Delivers events to the watcher from a background thread, in order. Progress heartbeats are
    coalesced: a newer one replaces one that is still waiting."""

    def __init__(self, post):
        self._post = post
        self._q: queue.Queue = queue.Queue()
        self._lock = threading.Lock()
        self._progress: tuple[dict, int | None] | None = None
        self._thread = threading.Thread(target=self._run, name="kit-agent-post", daemon=True)
        self._thread.start()

    def submit(self, ev: dict, retries: int | None = None) -> None:
        if ev.get("kind") == "progress":
            with self._lock:
                queued = self._progress is not None
                self._progress = (ev, retries)
            if queued:
                return
            self._q.put("progress")
        else:
            self._q.put((ev, retries))

    def _run(self) -> None:
        while True:
            item = self._q.get()
            try:
                if item is None:
                    return
                if item == "progress":
                    with self._lock:
                        item, self._progress = self._progress, None
                    if item is None:
                        continue
                self._post(*item)
            except Exception:  # never let one bad event kill the sender
                log.exception("watcher post crashed")
            finally:
                self._q.task_done()

    def flush(self, timeout: float) -> bool:
        """Wait until everything submitted has been handled (True) or ``timeout`` passed (False)."""
        deadline = time.monotonic() + timeout
        with self._q.all_tasks_done:
            while self._q.unfinished_tasks:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._q.all_tasks_done.wait(left)
        return True


class Agent:
    def __init__(self, *, cloud: str, instance: str, node_rank: int, stop_file: str, progress_file: str | None,
                 event_dir: str, watcher_url: str | None = None, watcher_token: str | None = None,
                 cluster: str | None = None, metadata_url: str | None = None, interval: float = 2.0,
                 heartbeat_every: float = 10.0, post_retries: int = 5, retry_delay: float = 0.5,
                 marker_file: str | None = None, flush_timeout: float = 5.0):
        self.cloud, self.instance, self.node_rank = cloud, instance, node_rank
        self.stop_file = Path(stop_file)
        self.marker_file = Path(marker_file) if marker_file else None
        self.progress_file = progress_file
        self.event_dir = Path(event_dir)
        self.watcher_url = watcher_url.rstrip("/") if watcher_url else None
        self.watcher_token, self.cluster = watcher_token, cluster
        self.probe = make_probe(cloud, metadata_url)
        self.interval = min(float(interval), 2.0)
        self.heartbeat_every = heartbeat_every
        self.post_retries, self.retry_delay = post_retries, retry_delay
        self.flush_timeout = flush_timeout
        self.stopping = threading.Event()
        self._abort_posts = threading.Event()  # set when the flush time at exit is over: no more backoff
        self.noticed = False
        self._last_heartbeat = 0.0
        self._milestone: tuple | None = None  # the progress file's (state, checkpoint_step) last reported
        self._report("shutdown", {}, {})  # the agent's own settings are valid (a ValueError for main)
        self.sender = Sender(self.post)

    def _report(self, kind: str, detail: dict, numbers: dict) -> dict:
        from training.messages import AgentReport

        return AgentReport(kind=kind, instance=self.instance, node_rank=self.node_rank, time=time.time(),
                           cloud=self.cloud, detail=detail, **numbers).model_dump()

    def event(self, kind: str, detail: dict | None = None) -> dict:
        """A report as the watcher's endpoint validates it (training.messages.AgentReport). Never
        raises over what the progress file or the metadata server said: progress numbers the report
        cannot carry are dropped, then a detail it cannot carry, each with a warning, so that a notice
        is always recorded and sent."""
        from pydantic import ValidationError

        numbers, detail = self._progress_numbers(), detail or {}
        while True:
            try:
                return self._report(kind, detail, numbers)
            except ValidationError as err:
                first = err.errors()[0]
                problem = f"{'.'.join(str(p) for p in first.get('loc', ())) or 'report'}: {first.get('msg')}"
                if not (numbers or detail):
                    raise  # the agent's own settings, checked in __init__: not reached
                if numbers:
                    log.warning("progress file %s: %s; the %s report goes without its numbers",
                                self.progress_file, problem, kind)
                    numbers = {}
                else:
                    log.warning("%s detail not reportable (%s): replaced by a note", kind, problem)
                    detail = {"dropped": f"the detail failed validation: {problem}"[:1000]}

    def _progress_numbers(self) -> dict:
        """The progress file's numbers for a report; a step past ``total_steps`` is clamped to it."""
        prog = read_json(self.progress_file) or {}
        numbers = {k: prog.get(k) for k in ("step", "total_steps", "step_time_s")}
        numbers["progress_time"] = prog.get("time")
        if not all(isinstance(v, (int, float)) or v is None for v in numbers.values()):
            return {}  # a progress file from another version: report without progress
        step, total = numbers["step"], numbers["total_steps"]
        if isinstance(step, int) and isinstance(total, int) and step > total > 0:
            # a relaunch with --steps lowered below the step reached: the trainer stops there at once
            # ("done"), so the run is at its end; the report's schema has no step past it
            log.warning("progress file %s: step %d is past total_steps %d; reported as step %d",
                        self.progress_file, step, total, total)
            numbers["step"] = total
        return numbers

    def record(self, ev: dict) -> None:
        self.event_dir.mkdir(parents=True, exist_ok=True)
        with open(self.event_dir / EVENTS_FILE, "a") as f:
            f.write(json.dumps(ev) + "\n")
            f.flush()
            os.fsync(f.fileno())

    def post(self, ev: dict, retries: int | None = None) -> bool:
        """POST one event (blocking, with backoff; no retry on 4xx). The agent itself uses :meth:`submit`."""
        if not (self.watcher_url and self.watcher_token and self.cluster):
            return False
        url = f"{self.watcher_url}/v1/clusters/{self.cluster}/events"
        data = json.dumps(ev).encode()
        attempts = self.post_retries if retries is None else retries
        for attempt in range(attempts):
            req = urllib.request.Request(url, data=data, method="POST", headers={
                "Authorization": f"Bearer {self.watcher_token}", "Content-Type": "application/json"})
            try:
                with urllib.request.urlopen(req, timeout=HTTP_TIMEOUT) as resp:
                    if resp.status in (200, 202):
                        return True
            except urllib.error.HTTPError as err:
                if 400 <= err.code < 500:
                    log.warning("watcher refused %s: %s", ev["kind"], err.code)
                    return False
            except NETWORK_ERRORS as err:  # URLError is an OSError
                log.info("watcher post failed (%s: %s), attempt %d", type(err).__name__, err, attempt + 1)
            if attempt + 1 < attempts and self._abort_posts.wait(self.retry_delay * (2 ** attempt)):
                break
        return False

    def submit(self, ev: dict, retries: int | None = None) -> None:
        """Queue an event for the watcher (no-op without one); never blocks the poll loop."""
        if self.watcher_url and self.watcher_token and self.cluster:
            self.sender.submit(ev, retries)

    def flush(self, timeout: float | None = None) -> bool:
        return self.sender.flush(self.flush_timeout if timeout is None else timeout)

    def write_stop_file(self, reason: str) -> None:
        write_atomic(self.stop_file, reason + "\n")

    def write_marker(self, reason: str) -> None:
        if self.marker_file is not None:
            write_atomic(self.marker_file, json.dumps({"reason": reason, "time": time.time()}) + "\n")

    def handle(self, kind: str, detail: dict) -> None:
        if kind == PREEMPTION_NOTICE:
            if self.noticed:
                # still active: the marker must stay (someone removed it? the trainer must not restart)
                if self.marker_file is not None and not self.marker_file.exists():
                    self.write_marker(PREEMPTION_NOTICE)
                return
            self.noticed = True
            # marker first: training.launch checks it after removing a stale stop file
            self.write_marker(PREEMPTION_NOTICE)
            self.write_stop_file(PREEMPTION_NOTICE)
            log.warning("preemption notice: stop file written (%s)", self.stop_file)
        ev = self.event(kind, detail)
        self.record(ev)
        self.submit(ev)

    def poll(self) -> None:
        try:
            for kind, detail in self.probe.poll():
                self.handle(kind, detail)
        except (MetadataError, *NETWORK_ERRORS) as err:
            log.info("metadata poll failed: %s: %s", type(err).__name__, err)

    def tick(self) -> None:
        self.poll()
        self.report_progress()

    def report_progress(self, final: bool = False) -> None:
        """Send the progress file to the watcher every ``heartbeat_every`` seconds, and at the next
        poll (<= 2 s) when its state or checkpoint step changed: the stop save's step must reach the
        watcher within the notice (GCP gives 30 s), not at the next heartbeat. ``final``: now, whatever
        changed (the agent is stopping). State "done" and the digest let the watcher stop and verify."""
        if not self.watcher_url:
            return
        prog = read_json(self.progress_file) or {}
        now = time.monotonic()
        milestone = (prog.get("state"), prog.get("checkpoint_step"))
        changed = milestone != self._milestone
        if not prog or not (final or changed or now - self._last_heartbeat >= self.heartbeat_every):
            return
        self._last_heartbeat, self._milestone = now, milestone
        detail = {k: prog[k] for k in PROGRESS_DETAIL if prog.get(k) is not None}
        self.submit(self.event("progress", detail), retries=MILESTONE_RETRIES if changed or final else 1)

    def shutdown(self) -> None:
        """A stop of the agent itself: one last poll (a notice may have come since the previous one),
        a last progress report, then a normal shutdown unless a notice came first; pending POSTs get
        ``flush_timeout``."""
        if not self.noticed:
            self.poll()
        self.report_progress(final=True)
        if not self.noticed:
            ev = self.event("shutdown", {"reason": "agent stopped without a preemption notice"})
            self.record(ev)
            self.submit(ev, retries=2)
        if not self.flush():
            log.warning("watcher unreachable: events not delivered within %.0f s", self.flush_timeout)
        self._abort_posts.set()

    def run(self) -> int:
        while not self.stopping.is_set():
            started = time.monotonic()
            try:
                self.tick()
            except Exception:  # a bug in one tick must not end the watch for the notice
                log.exception("agent tick failed; polling on")
            self.stopping.wait(max(0.0, self.interval - (time.monotonic() - started)))
        self.shutdown()
        return 0


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m training.agent", description=__doc__.splitlines()[0])
    p.add_argument("--cloud", choices=("aws", "gcp", "local"), required=True)
    p.add_argument("--instance", required=True)
    p.add_argument("--node-rank", type=int, required=True)
    p.add_argument("--stop-file", required=True)
    p.add_argument("--progress-file")
    p.add_argument("--event-dir", required=True)
    p.add_argument("--watcher-url")
    p.add_argument("--watcher-token-file")
    p.add_argument("--cluster")
    p.add_argument("--metadata-url")
    p.add_argument("--interval", type=float, default=2.0)
    p.add_argument("--heartbeat-every", type=float, default=10.0)
    p.add_argument("--marker-file", help="written on a notice; training.launch will not start torchrun while "
                                         "it exists (put it under /run: emptied at boot)")
    p.add_argument("--flush-timeout", type=float, default=5.0,
                   help="seconds to deliver pending events to the watcher on exit")
    return p.parse_args(argv)


def main(argv=None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s agent %(levelname)s %(message)s")
    a = parse_args(argv)
    token = None
    if a.watcher_token_file:
        try:
            token = Path(a.watcher_token_file).read_text().strip() or None
        except OSError as err:
            print(f"agent: cannot read --watcher-token-file: {err}", file=sys.stderr)
            return 2
    try:
        agent = Agent(cloud=a.cloud, instance=a.instance, node_rank=a.node_rank, stop_file=a.stop_file,
                      progress_file=a.progress_file, event_dir=a.event_dir, watcher_url=a.watcher_url,
                      watcher_token=token, cluster=a.cluster, metadata_url=a.metadata_url,
                      interval=a.interval, heartbeat_every=a.heartbeat_every, marker_file=a.marker_file,
                      flush_timeout=a.flush_timeout)
    except ValueError as err:
        print(f"agent: {err}", file=sys.stderr)
        return 2

    def _stop(signum, frame):
        agent.stopping.set()

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    return agent.run()


if __name__ == "__main__":
    sys.exit(main())
