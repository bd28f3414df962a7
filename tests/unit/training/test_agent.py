"""Node agent against loopback fake metadata servers (AWS IMDSv2, GCP) and the real watcher server."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from tests.support import REPO
from training import agent as agent_mod
from training import launch


class QuietHandler(BaseHTTPRequestHandler):
    def log_message(self, *a):
        pass


class LoopbackServer:
    """A fake's HTTP server on a loopback port, serving ``handler`` on a thread until ``close``."""

    def serve(self, handler) -> None:
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


class FakeMetadata(LoopbackServer):
    """Implements the documented shapes: IMDSv2 token PUT, 401 without token, 404 when no action;
    GCP instance/preempted TRUE/FALSE, 403 without the Metadata-Flavor header."""

    def __init__(self):
        self.action = None  # AWS instance-action JSON
        self.rebalance = None
        self.preempted = False
        self.requests: list[tuple[str, str, dict]] = []
        fake = self

        class H(QuietHandler):
            def _send(self, code, body=""):
                data = body.encode()
                self.send_response(code)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_PUT(self):
                fake.requests.append(("PUT", self.path, dict(self.headers)))
                if self.path == "/latest/api/token" and self.headers.get("X-aws-ec2-metadata-token-ttl-seconds"):
                    return self._send(200, "tok-123")
                return self._send(400)

            def do_GET(self):
                fake.requests.append(("GET", self.path, dict(self.headers)))
                if self.path.startswith("/latest/"):
                    if self.headers.get("X-aws-ec2-metadata-token") != "tok-123":
                        return self._send(401)
                    if self.path == "/latest/meta-data/spot/instance-action":
                        return self._send(200, json.dumps(fake.action)) if fake.action else self._send(404)
                    if self.path == "/latest/meta-data/events/recommendations/rebalance":
                        return self._send(200, json.dumps(fake.rebalance)) if fake.rebalance else self._send(404)
                    return self._send(404)
                if self.path.startswith("/computeMetadata/v1/instance/preempted"):
                    if self.headers.get("Metadata-Flavor") != "Google":
                        return self._send(403, "Missing Metadata-Flavor:Google header.")
                    return self._send(200, "TRUE" if fake.preempted else "FALSE")
                return self._send(404)

        self.serve(H)


class FakeWatcher(LoopbackServer):
    def __init__(self, token="secret", fail_first=0):
        self.events: list[dict] = []
        self.fail_left = fail_first
        fake = self

        class H(QuietHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                if fake.fail_left > 0:
                    fake.fail_left -= 1
                    code = 503
                elif self.headers.get("Authorization") != f"Bearer {token}":
                    code = 401
                elif not self.path.startswith("/v1/clusters/c1/events"):
                    code = 404
                else:
                    fake.events.append(json.loads(body))
                    code = 202
                self.send_response(code)
                self.send_header("Content-Length", "0")
                self.end_headers()

        self.serve(H)


@pytest.fixture
def meta():
    m = FakeMetadata()
    yield m
    m.close()


def make_agent(tmp_path, cloud, url, watcher=None, token="secret", **kw):
    (tmp_path / "progress.json").write_text(json.dumps(
        {"step": 7, "total_steps": 100, "step_time_s": 0.5, "state": "running", "time": time.time(),
         "params_sha256": None}))
    return agent_mod.Agent(cloud=cloud, instance="i-1", node_rank=1, stop_file=str(tmp_path / "stop"),
                           progress_file=str(tmp_path / "progress.json"), event_dir=str(tmp_path / "disk"),
                           watcher_url=watcher.url if watcher else None, watcher_token=token,
                           cluster="c1", metadata_url=url, interval=0.1, retry_delay=0.01, **kw)


def events(tmp_path):
    path = tmp_path / "disk" / "events.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_aws_no_notice_then_terminate(tmp_path, meta):
    watcher = FakeWatcher()
    try:
        ag = make_agent(tmp_path, "aws", meta.url, watcher)
        ag.tick()
        assert ag.flush(5)
        assert not (tmp_path / "stop").exists()
        assert events(tmp_path) == []
        assert [e["kind"] for e in watcher.events] == ["progress"]
        assert watcher.events[0]["step"] == 7 and watcher.events[0]["total_steps"] == 100
        written = json.loads((tmp_path / "progress.json").read_text())["time"]
        assert watcher.events[0]["progress_time"] == written, "the trainer's write time travels with the step"
        # token PUT happened before GETs, and GETs carry it
        assert meta.requests[0][0] == "PUT"
        meta.action = {"action": "terminate", "time": "2026-11-23T00:00:00Z"}
        ag.tick()
        assert (tmp_path / "stop").exists()
        evs = events(tmp_path)
        assert [e["kind"] for e in evs] == ["preemption-notice"]
        assert evs[0]["detail"]["action"] == "terminate" and evs[0]["cloud"] == "aws"
        assert evs[0]["instance"] == "i-1" and evs[0]["node_rank"] == 1
        assert ag.flush(5)
        assert watcher.events[-1]["kind"] == "preemption-notice"
        ag.tick()  # the notice is handled once
        assert len(events(tmp_path)) == 1
        ag.shutdown()  # after a notice, stopping is not a normal shutdown
        assert len(events(tmp_path)) == 1
    finally:
        watcher.close()


def test_aws_token_renewed_on_401_and_rebalance(tmp_path, meta):
    ag = make_agent(tmp_path, "aws", meta.url)
    ag.probe.token = "stale"
    meta.rebalance = {"noticeTime": "2026-11-23T00:00:00Z"}
    ag.tick()
    assert [e["kind"] for e in events(tmp_path)] == ["rebalance-recommendation"]
    assert not (tmp_path / "stop").exists()  # a recommendation does not stop training
    assert ag.probe.token == "tok-123"
    ag.tick()
    assert len(events(tmp_path)) == 1


def test_aws_without_token_is_refused(meta):
    status, _ = agent_mod._request(f"{meta.url}/latest/meta-data/spot/instance-action")
    assert status == 401


def test_gcp_header_and_notice(tmp_path, meta):
    status, _ = agent_mod._request(f"{meta.url}/computeMetadata/v1/instance/preempted")
    assert status == 403
    ag = make_agent(tmp_path, "gcp", meta.url)
    ag.tick()
    assert not (tmp_path / "stop").exists()
    meta.preempted = True
    ag.tick()
    assert (tmp_path / "stop").exists()
    assert [e["kind"] for e in events(tmp_path)] == ["preemption-notice"]
    assert all(r[2].get("Metadata-Flavor") == "Google" for r in meta.requests[1:])


def test_local_file_probe_and_shutdown(tmp_path):
    notice = tmp_path / "metadata" / "preempted"
    ag = make_agent(tmp_path, "local", str(notice))
    ag.tick()
    notice.parent.mkdir()
    notice.write_text("FALSE")
    ag.tick()
    assert events(tmp_path) == []
    ag.shutdown()
    assert [e["kind"] for e in events(tmp_path)] == ["shutdown"]
    notice.write_text("TRUE")
    ag.tick()
    assert (tmp_path / "stop").exists()


def test_post_retries_and_bad_token(tmp_path, meta):
    watcher = FakeWatcher(fail_first=2)
    try:
        ag = make_agent(tmp_path, "gcp", meta.url, watcher)
        assert ag.post(ag.event("preemption-notice"))
        assert len(watcher.events) == 1
        bad = make_agent(tmp_path, "gcp", meta.url, watcher, token="wrong")
        assert not bad.post(bad.event("preemption-notice"))
        assert len(watcher.events) == 1
    finally:
        watcher.close()


def test_agent_process_with_real_watcher(tmp_path, meta):
    from kit.watch.server import WatcherServer, node_token

    got = []
    with WatcherServer({"c1": "secret"}, lambda cluster, ev: got.append((cluster, ev))) as server:
        (tmp_path / "tok").write_text(node_token("secret", "vm-0") + "\n")  # the node's own, as bootstrap writes it
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        proc = subprocess.Popen([sys.executable, "-m", "training.agent", "--cloud", "gcp", "--instance", "vm-0",
                                 "--node-rank", "0", "--stop-file", str(tmp_path / "stop"),
                                 "--progress-file", str(tmp_path / "progress.json"), "--event-dir",
                                 str(tmp_path / "disk"), "--watcher-url", server.url, "--watcher-token-file",
                                 str(tmp_path / "tok"), "--cluster", "c1", "--metadata-url", meta.url,
                                 "--interval", "0.2"], env=env, cwd=REPO)
        try:
            time.sleep(1.0)
            meta.preempted = True
            deadline = time.time() + 10
            while not (tmp_path / "stop").exists() and time.time() < deadline:
                time.sleep(0.1)
            assert (tmp_path / "stop").exists()
            deadline = time.time() + 5
            while not got and time.time() < deadline:
                time.sleep(0.1)
            assert got and got[-1][0] == "c1"
        finally:
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(10) == 0
    assert [e["kind"] for e in events(tmp_path)] == ["preemption-notice"]


def test_sigterm_without_notice_is_shutdown(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen([sys.executable, "-m", "training.agent", "--cloud", "local", "--instance", "n0",
                             "--node-rank", "0", "--stop-file", str(tmp_path / "stop"), "--event-dir",
                             str(tmp_path / "disk"), "--metadata-url", str(tmp_path / "preempted"),
                             "--interval", "0.2"], env=env, cwd=REPO)
    time.sleep(1.0)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(10) == 0
    assert [e["kind"] for e in events(tmp_path)] == ["shutdown"]
    assert not (tmp_path / "stop").exists()


def test_launch_command_and_exit_mapping(tmp_path):
    envf = tmp_path / "train.env"
    envf.write_text('NNODES=2\nNODE_RANK=1\nRDZV_ENDPOINT=10.0.0.5:29500\nRDZV_ID=c1\nNPROC_PER_NODE=1\n'
                    'CKPT_DIR=/mnt/kit-disk/ckpt\nTRAIN_FLAGS="--steps 10 --model vit_tiny_patch16_224"\n'
                    'STOP_FILE=/run/kit/stop\nPROGRESS_FILE=/mnt/kit-disk/progress.json\n')
    cmd = launch.build_command(launch.read_env_file(str(envf)), python="/opt/kit/venv/bin/python")
    assert cmd[:3] == ["/opt/kit/venv/bin/python", "-m", "torch.distributed.run"]
    assert "--nnodes=2" in cmd and "--node-rank=1" in cmd and "--rdzv-endpoint=10.0.0.5:29500" in cmd
    i = cmd.index("training.train")
    assert cmd[i + 1:i + 5] == ["--steps", "10", "--model", "vit_tiny_patch16_224"]
    assert cmd[cmd.index("--ckpt-dir") + 1] == "/mnt/kit-disk/ckpt"
    assert cmd.count("--steps") == 1
    with pytest.raises(ValueError, match="RDZV_ENDPOINT"):
        launch.build_command({"NNODES": "1", "NODE_RANK": "0"})
    prog = tmp_path / "p.json"
    assert launch.exit_status(0, None, 0) == 0
    assert launch.exit_status(75, None, 0) == 75
    assert launch.exit_status(1, str(prog), 0) == 1
    prog.write_text(json.dumps({"state": "preempted", "time": time.time()}))
    assert launch.exit_status(1, str(prog), 0) == 75
    assert launch.main(["--env-file", str(tmp_path / "missing")]) == 2


def test_notice_writes_marker_and_keeps_it_while_active(tmp_path, meta):
    """The preemption marker stops training.launch from restarting the trainer on a doomed node."""
    marker = tmp_path / "run" / "preempted"
    ag = make_agent(tmp_path, "gcp", meta.url, marker_file=str(marker))
    ag.tick()
    assert not marker.exists()
    meta.preempted = True
    ag.tick()
    assert marker.exists() and (tmp_path / "stop").exists()
    assert json.loads(marker.read_text())["reason"] == "preemption-notice"
    (tmp_path / "stop").unlink()  # the trainer consumed it after its save
    marker.unlink()  # someone removed the marker while the notice is still active
    ag.tick()
    assert marker.exists(), "the marker must come back while instance/preempted stays TRUE"
    assert [e["kind"] for e in events(tmp_path)] == ["preemption-notice"]  # still recorded once


def test_shutdown_polls_once_more_before_calling_it_a_shutdown(tmp_path, meta):
    ag = make_agent(tmp_path, "aws", meta.url)
    ag.tick()
    meta.action = {"action": "terminate", "time": "2026-11-23T00:00:00Z"}
    ag.shutdown()  # SIGTERM came before the next poll would have seen the notice
    assert [e["kind"] for e in events(tmp_path)] == ["preemption-notice"]
    assert (tmp_path / "stop").exists()


class SlowWatcher:
    """Accepts connections and never answers: every POST runs into the agent's HTTP timeout."""

    def __init__(self):
        import socket

        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.conns = []
        self.done = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        self.sock.settimeout(0.2)
        while not self.done.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            self.conns.append(conn)

    def close(self):
        self.done.set()
        for c in self.conns:
            c.close()
        self.sock.close()


def test_unreachable_watcher_never_delays_polling(tmp_path, meta):
    watcher = SlowWatcher()
    try:
        ag = make_agent(tmp_path, "aws", meta.url, watcher, heartbeat_every=0.0)
        posted = []
        real_post = ag.post
        ag.sender._post = lambda ev, retries=None: (posted.append(ev["kind"]), real_post(ev, retries))
        t0 = time.monotonic()
        for _ in range(5):
            ag.tick()  # each queues a heartbeat; the first POST hangs for HTTP_TIMEOUT
        meta.action = {"action": "terminate", "time": "2026-11-23T00:00:00Z"}
        ag.tick()
        elapsed = time.monotonic() - t0
        assert elapsed < 0.75 * agent_mod.HTTP_TIMEOUT, f"6 polls took {elapsed:.1f} s with a hanging watcher"
        assert (tmp_path / "stop").exists()
        assert not ag.flush(0.1)  # still stuck in the first POST
        # heartbeats are coalesced: at most the one in flight and the newest are ever sent
        ag._abort_posts.set()
        assert ag.flush(3 * agent_mod.HTTP_TIMEOUT + 1)
        assert posted.count("progress") <= 2 and "preemption-notice" in posted
    finally:
        watcher.close()


def test_agent_process_exits_promptly_with_unreachable_watcher(tmp_path, meta):
    watcher = SlowWatcher()
    try:
        (tmp_path / "tok").write_text("secret\n")
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        proc = subprocess.Popen([sys.executable, "-m", "training.agent", "--cloud", "gcp", "--instance", "vm-0",
                                 "--node-rank", "0", "--stop-file", str(tmp_path / "stop"), "--event-dir",
                                 str(tmp_path / "disk"), "--watcher-url", watcher.url, "--watcher-token-file",
                                 str(tmp_path / "tok"), "--cluster", "c1", "--metadata-url", meta.url,
                                 "--interval", "0.2", "--flush-timeout", "1", "--marker-file",
                                 str(tmp_path / "run" / "preempted")], env=env, cwd=REPO)
        try:
            time.sleep(0.5)
            meta.preempted = True
            deadline = time.time() + 3
            while not (tmp_path / "stop").exists() and time.time() < deadline:
                time.sleep(0.05)
            assert (tmp_path / "stop").exists(), "the notice must not wait for the watcher"
            assert (tmp_path / "run" / "preempted").exists()
            t0 = time.monotonic()
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(10) == 0
            assert time.monotonic() - t0 < 1 + agent_mod.HTTP_TIMEOUT + 1.5
        finally:
            if proc.poll() is None:
                proc.kill()
    finally:
        watcher.close()
    assert [e["kind"] for e in events(tmp_path)] == ["preemption-notice"]


# -- regressions: the agent survives bad inputs; the stop save's progress reaches the watcher in time ------

def _progress(tmp_path, **fields):
    doc = {"step": 7, "total_steps": 100, "step_time_s": 0.5, "state": "running", "time": time.time(),
           "params_sha256": None, "checkpoint_step": None, "checkpoint_bytes": None}
    (tmp_path / "progress.json").write_text(json.dumps({**doc, **fields}))


def test_a_progress_file_past_its_total_never_stops_the_notice(tmp_path, caplog):
    """A relaunch with --steps lowered below the reached step: the trainer writes step > total_steps."""
    notice = tmp_path / "preempted"
    notice.write_text("TRUE")
    watcher = FakeWatcher()
    try:
        ag = make_agent(tmp_path, "local", str(notice), watcher)
        _progress(tmp_path, step=1000, total_steps=500, state="done")
        with caplog.at_level("WARNING", logger="kit.agent"):
            ag.tick()
            assert ag.flush(5)
    finally:
        watcher.close()
    assert (tmp_path / "stop").exists()
    [ev] = events(tmp_path)
    assert ev["kind"] == "preemption-notice" and ev["step"] == 500 and ev["total_steps"] == 500
    assert {e["kind"] for e in watcher.events} == {"preemption-notice", "progress"}
    assert any("past total_steps" in r.getMessage() for r in caplog.records)


def test_a_progress_file_with_unusable_numbers_is_reported_without_them(tmp_path, caplog):
    ag = make_agent(tmp_path, "local", str(tmp_path / "preempted"))
    _progress(tmp_path, step=-3, step_time_s=1e300)
    with caplog.at_level("WARNING", logger="kit.agent"):
        ev = ag.event("shutdown")
    assert ev["kind"] == "shutdown" and ev["step"] is None and ev["total_steps"] is None
    assert any("progress" in r.getMessage() for r in caplog.records)


class TruncatingMetadata(LoopbackServer):
    """A GCP metadata server that cuts its first ``bad`` answers short (Content-Length promises more
    than is sent: http.client.IncompleteRead), then answers TRUE."""

    def __init__(self, bad=2):
        self.bad = bad
        fake = self

        class H(QuietHandler):
            def do_GET(self):
                self.send_response(200)
                if fake.bad > 0:
                    fake.bad -= 1
                    self.send_header("Content-Length", "100")
                    self.end_headers()
                    self.wfile.write(b"TR")
                    self.wfile.flush()
                    self.close_connection = True
                    return
                self.send_header("Content-Length", "4")
                self.end_headers()
                self.wfile.write(b"TRUE")

        self.serve(H)


def test_a_truncated_metadata_answer_is_a_failed_poll_not_a_dead_agent(tmp_path):
    meta = TruncatingMetadata(bad=2)
    try:
        ag = make_agent(tmp_path, "gcp", meta.url)
        ag.tick()
        ag.tick()
        assert not (tmp_path / "stop").exists()
        ag.tick()  # the metadata server answers properly again: the notice is handled
    finally:
        meta.close()
    assert (tmp_path / "stop").exists()
    assert [e["kind"] for e in events(tmp_path)] == ["preemption-notice"]


def test_aws_instance_action_that_is_json_but_not_an_object_is_not_a_crash(tmp_path, meta):
    ag = make_agent(tmp_path, "aws", meta.url)
    meta.action = ["terminate"]  # 200 with a JSON list
    ag.tick()
    assert not (tmp_path / "stop").exists()


def test_a_garbled_watcher_answer_is_retried_not_raised(tmp_path, meta):
    import socket

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(8)
    watcher = FakeWatcher()

    def garble_once():  # one connection answered with a status line that is not HTTP (BadStatusLine)
        conn, _ = sock.accept()
        conn.recv(65536)
        conn.sendall(b"garbage\r\n\r\n")
        conn.close()

    threading.Thread(target=garble_once, daemon=True).start()
    try:
        ag = make_agent(tmp_path, "gcp", meta.url, watcher)
        ag.watcher_url = f"http://127.0.0.1:{sock.getsockname()[1]}"
        assert ag.post(ag.event("preemption-notice"), retries=1) is False  # garbled: a failed attempt
        ag.watcher_url = watcher.url
        assert ag.post(ag.event("preemption-notice"), retries=1) is True
    finally:
        sock.close()
        watcher.close()


def test_the_stop_saves_progress_is_reported_at_once_not_at_the_next_heartbeat(tmp_path, meta):
    watcher = FakeWatcher()
    try:
        ag = make_agent(tmp_path, "gcp", meta.url, watcher, heartbeat_every=3600)
        ag.tick()
        assert ag.flush(5) and [e["detail"].get("state") for e in watcher.events] == ["running"]
        meta.preempted = True
        ag.tick()
        assert ag.flush(5)
        _progress(tmp_path, step=9, state="preempted", checkpoint_step=9, checkpoint_bytes=1000)  # the stop save
        t0 = time.monotonic()
        ag.tick()
        assert ag.flush(5) and time.monotonic() - t0 < 5
        last = [e for e in watcher.events if e["kind"] == "progress"][-1]
        assert last["detail"].get("checkpoint_step") == 9 and last["detail"].get("state") == "preempted"
    finally:
        watcher.close()


def test_shutdown_sends_a_last_progress_report(tmp_path, meta):
    watcher = FakeWatcher()
    try:
        ag = make_agent(tmp_path, "gcp", meta.url, watcher, heartbeat_every=3600)
        ag.tick()
        assert ag.flush(5)
        _progress(tmp_path, step=12, checkpoint_step=10)
        ag.shutdown()
    finally:
        watcher.close()
    progress = [e for e in watcher.events if e["kind"] == "progress"]
    assert progress[-1]["step"] == 12 and progress[-1]["detail"]["checkpoint_step"] == 10
    assert watcher.events[-1]["kind"] == "shutdown"
