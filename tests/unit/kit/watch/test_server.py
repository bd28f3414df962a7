"""The agents' HTTP endpoint: auth, validation, recording, waking the loop."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import stat
import threading
import urllib.error
import urllib.request

import pytest

from kit.watch.ledger import Ledger
from kit.watch.server import MAX_BODY, WatcherServer, cluster_token, ledger_sink, node_token

TOKEN = "s3cret-token"  # the cluster's: the watcher's secret, which no node holds
AS_NODE = "as the node"  # post's default: the token of the instance the body names, what its agent holds


def post(url: str, body, token: str | None = AS_NODE, raw: bytes | None = None) -> tuple[int, dict]:
    if token == AS_NODE:  # a body naming no instance is refused before any token is compared
        token = node_token(TOKEN, body["instance"]) if isinstance(body, dict) and body.get("instance") else "any"
    data = raw if raw is not None else json.dumps(body).encode()
    headers = {"Content-Type": "application/json"}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    request = urllib.request.Request(url, data=data, headers=headers, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=10) as reply:
            return reply.status, json.loads(reply.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def notice(**overrides) -> dict:
    body = {"kind": "preemption-notice", "instance": "i-0abc", "node_rank": 0, "time": 1_700_000_000.5,
            "cloud": "aws", "detail": {"action": "terminate"}, "step": None, "total_steps": None,
            "step_time_s": None}
    return {**body, **overrides}


NODES = [{"name": "demo-0", "instance_id": "i-0abc", "rank": 0, "market": "spot", "private_ip": "10.0.0.5"},
         {"name": "demo-1", "instance_id": "i-0def", "rank": 1, "market": "spot", "private_ip": "10.0.0.6"}]


@pytest.fixture
def served(tmp_path):
    ledger = Ledger(tmp_path / "ledger.sqlite")
    ledger.adopt_deployment(NODES, "spot", "default", now=1_700_000_000.0)  # the nodes that may report
    wake = threading.Event()
    with WatcherServer({"demo": TOKEN}, ledger_sink(ledger, wake), deadline_s=2.0, max_connections=4) as server:
        yield f"{server.url}/v1/clusters/demo/events", ledger, wake, server


def agent_events(ledger: Ledger) -> list[dict]:
    return [e for e in ledger.events() if e["source"] == "agent"]


def test_notice_is_accepted_recorded_once_and_wakes_the_loop(served):
    url, ledger, wake, _ = served
    assert post(url, notice()) == (202, {"ok": True})
    assert post(url, notice()) == (202, {"ok": True})  # the agent's retry of the same notice
    events = agent_events(ledger)
    assert len(events) == 1 and events[0]["kind"] == "preemption" and events[0]["instance"] == "i-0abc"
    assert events[0]["detail"] == {"action": "terminate", "cloud": "aws"}
    assert wake.is_set()


def test_progress_heartbeat_goes_to_progress(served):
    url, ledger, wake, _ = served
    body = notice(kind="progress", step=120, total_steps=500, step_time_s=0.25, detail={"state": "running"})
    assert post(url, body)[0] == 202
    latest = ledger.latest_progress()
    assert (latest["step"], latest["total_steps"], latest["step_time_s"], latest["state"]) == (120, 500, 0.25, "running")
    assert not wake.is_set()  # heartbeats do not wake the loop


def test_heartbeat_before_training_started_is_accepted_and_ignored(served):
    url, ledger, _, _ = served
    assert post(url, notice(kind="progress"))[0] == 202
    assert ledger.latest_progress() is None


@pytest.mark.parametrize("token", [None, "wrong", TOKEN + "x", "", "Bearer", node_token(TOKEN, "i-0abc") + "x"])
def test_bad_or_missing_token_is_401_and_records_nothing(served, token):
    url, ledger, _, _ = served
    status, body = post(url, notice(), token=token)
    assert status == 401 and body["ok"] is False
    assert agent_events(ledger) == []


@pytest.mark.parametrize("as_b", [
    notice(instance="i-0def", node_rank=1),
    notice(kind="progress", instance="i-0def", node_rank=1, step=10, total_steps=10, detail={"state": "done"}),
], ids=["notice", "done"])
def test_a_node_s_token_reports_as_that_node_only(served, as_b):
    """A node (or whoever stole its token) posting a notice or a "done" as another node: refused, so a
    compromised node cannot have another replaced nor end the watch."""
    url, ledger, wake, _ = served
    token_a = node_token(TOKEN, "i-0abc")
    status, reply = post(url, as_b, token=token_a)
    assert status == 401 and "i-0def" in reply["error"]
    assert agent_events(ledger) == [] and ledger.latest_progress() is None and not wake.is_set()
    assert post(url, notice(), token=token_a) == (202, {"ok": True})  # its own reports go through
    assert [e["instance"] for e in agent_events(ledger)] == ["i-0abc"]


@pytest.mark.parametrize("instance, rank", [("i-0abc", 0), ("i-0def", 1)])
def test_the_cluster_token_is_not_a_node_s_token(served, instance, rank):
    """No node holds it any more; one that still does (bootstrapped before node tokens) must bootstrap again."""
    url, ledger, _, _ = served
    assert post(url, notice(instance=instance, node_rank=rank), token=TOKEN)[0] == 401
    assert agent_events(ledger) == []


def test_node_token_is_hmac_sha256_of_the_instance_keyed_by_the_cluster_token():
    # RFC 4231 test case 2 (https://www.rfc-editor.org/rfc/rfc4231#section-4.3): key "Jefe"
    digest = bytes.fromhex("5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843")
    assert node_token("Jefe", "what do ya want for nothing?") == base64.urlsafe_b64encode(digest).decode().rstrip("=")
    token = node_token(TOKEN, "i-0abc")
    assert token == node_token(TOKEN, "i-0abc") != node_token(TOKEN, "i-0def") != node_token(TOKEN + "x", "i-0abc")
    assert len(token) == 43 and set(token) <= set("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_")
    with pytest.raises(ValueError, match="empty cluster token"):
        node_token("", "i-0abc")


@pytest.mark.parametrize("body, reason", [
    ({"kind": "explode", "instance": "i", "node_rank": 0, "time": 1, "cloud": "aws"}, "kind"),
    (notice(instance=""), "instance"),
    ({k: v for k, v in notice().items() if k != "instance"}, "instance"),  # a token is good for an instance
    (notice(node_rank=-1), "node_rank"),
    (notice(node_rank=True), "node_rank"),
    (notice(time="yesterday"), "time"),
    (notice(cloud="azure"), "cloud"),
    (notice(detail=[1, 2]), "detail"),
    (notice(kind="progress", step=3), "total_steps"),
    (notice(kind="progress", step=1, total_steps=0), "total_steps"),
    (notice(kind="progress", step=501, total_steps=500), "past total_steps"),
    (notice(kind="progress", step=10**400, total_steps=10**401), "step"),
    (notice(kind="progress", step=1, total_steps=2**63), "total_steps"),
    (notice(time=10**400), "time"),
    (notice(node_rank=10**30), "node_rank"),
    ([1, 2, 3], "object"),
])
def test_malformed_body_is_400_with_the_reason(served, body, reason):
    url, ledger, _, _ = served
    status, reply = post(url, body)
    assert status == 400 and reason in reply["error"]
    assert agent_events(ledger) == [] and ledger.latest_progress() is None


def test_not_json_is_400(served):
    url, *_ = served
    status, reply = post(url, None, raw=b"{not json")
    assert status == 400 and "not JSON" in reply["error"]


def test_unknown_cluster_and_path_are_404(served):
    url, _, _, server = served
    assert post(url.replace("/demo/", "/other/"), notice())[0] == 404
    assert post(f"{server.url}/v2/whatever", notice())[0] == 404


def test_cluster_token_is_created_private_and_stable(tmp_path):
    token = cluster_token(tmp_path)
    assert len(token) >= 40 and cluster_token(tmp_path) == token
    mode = (tmp_path / "watcher" / "token").stat().st_mode
    assert stat.S_IMODE(mode) == 0o600


@pytest.mark.parametrize("left", ["", "\n", "short-token\n"])
def test_an_empty_or_short_token_file_is_replaced_not_served(tmp_path, left):
    """A crash between creating the token file and writing it left it empty: the token read back was "",
    and "Authorization: Bearer " (no token at all) was accepted."""
    path = tmp_path / "watcher" / "token"
    path.parent.mkdir()
    path.write_text(left)
    token = cluster_token(tmp_path)
    assert len(token) >= 40 and token != left.strip()
    assert path.read_text() == token + "\n" and stat.S_IMODE(path.stat().st_mode) == 0o600
    assert cluster_token(tmp_path) == token
    assert sorted(p.name for p in path.parent.iterdir()) == ["token"]  # no temporary file left behind


def test_an_empty_token_is_never_served_nor_matched(tmp_path):
    ledger = Ledger(tmp_path / "ledger.sqlite")
    with pytest.raises(ValueError, match="empty token"):
        WatcherServer({"demo": ""}, ledger_sink(ledger))
    with pytest.raises(ValueError, match="empty token"):
        WatcherServer({"demo": " \n"}, ledger_sink(ledger))
    ledger.adopt_deployment(NODES, "spot", "default", now=1_700_000_000.0)
    with WatcherServer({"demo": TOKEN}, ledger_sink(ledger)) as server:
        server._server.tokens["demo"] = ""  # however one got there, the comparison refuses it
        url = f"{server.url}/v1/clusters/demo/events"
        assert post(url, notice(), token="")[0] == 401
        # what a node token derived from the empty secret would be: anyone can compute it
        keyed_by_nothing = base64.urlsafe_b64encode(hmac.new(b"", b"i-0abc", hashlib.sha256).digest()).rstrip(b"=")
        assert post(url, notice(), token=keyed_by_nothing.decode())[0] == 401
    assert agent_events(ledger) == []


def raw_request(server, head: bytes, body: bytes = b"", wait: float = 8.0) -> bytes:
    """Send bytes as they are (no client-side checks) and return what comes back before the
    server closes the connection or ``wait`` seconds pass."""
    import socket

    host, port = server.address
    with socket.create_connection((host, port), timeout=wait) as sock:
        sock.sendall(head + body)
        received = b""
        try:
            while chunk := sock.recv(65536):
                received += chunk
        except TimeoutError:
            pass
    return received


def headers(length: str) -> bytes:
    return (f"POST /v1/clusters/demo/events HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {node_token(TOKEN, 'i-0abc')}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {length}\r\n\r\n").encode()


def test_negative_content_length_is_400_and_nothing_is_read_past_it(served):
    """int("-1") would pass the size check and rfile.read(-1) read to EOF, uncapped."""
    _, ledger, _, server = served
    reply = raw_request(server, headers("-1"), json.dumps(notice()).encode() + b" " * (MAX_BODY * 2))
    assert reply.startswith(b"HTTP/1.1 400") and b"Content-Length" in reply
    assert agent_events(ledger) == []


def test_a_stalled_body_times_out_instead_of_holding_a_thread(served, monkeypatch):
    """Without a socket timeout, a client that announced a body and stalled would hold its
    handler thread forever."""
    import time

    from kit.watch import server as server_module

    monkeypatch.setattr(server_module._Handler, "timeout", 0.5)
    _, ledger, _, server = served
    started = time.monotonic()
    reply = raw_request(server, headers("100"), b'{"kind": ', wait=8.0)
    assert reply.startswith(b"HTTP/1.1 408") and time.monotonic() - started < 5
    assert agent_events(ledger) == []


def test_the_handler_has_a_socket_timeout():
    from kit.watch.server import _Handler

    assert _Handler.timeout == 10


def test_deeply_nested_json_gets_a_400_reply(served):
    url, ledger, _, _ = served
    status, reply = post(url, None, raw=b"[" * 5000 + b"]" * 5000)
    assert status == 400 and "RecursionError" in reply["error"]
    assert agent_events(ledger) == []


@pytest.mark.parametrize("body, reason", [
    (notice(instance="i-stranger"), "not a node of this cluster"),
    (notice(instance="i-0abc", node_rank=1), "is node 0, not node 1"),
    (notice(kind="progress", instance="i-0abc", node_rank=7, step=10, total_steps=10), "not node 7"),
])
def test_only_the_clusters_nodes_may_report_at_their_own_rank(served, body, reason):
    """A "done" heartbeat from anywhere else would end the watch with nothing trained."""
    url, ledger, wake, _ = served
    status, reply = post(url, body)
    assert status == 403 and reason in reply["error"]
    assert agent_events(ledger) == [] and ledger.latest_progress() is None and not wake.is_set()


def test_a_node_reports_under_its_name_too(served):
    url, ledger, _, _ = served
    assert post(url, notice(instance="demo-1", node_rank=1))[0] == 202
    assert [e["instance"] for e in agent_events(ledger)] == ["demo-1"]


def test_a_trickling_client_is_cut_off_at_the_request_deadline(served):
    """One header byte every 0.3 s never trips the 10 s read timeout; the 2 s deadline ends it."""
    import socket
    import time

    _, _, _, server = served
    started = time.monotonic()
    with socket.create_connection(server.address, timeout=10) as sock:
        sock.sendall(b"POST /v1/clusters/demo/events HTTP/1.1\r\n")
        closed_after = None
        for _ in range(40):  # 12 s of trickling at most
            try:
                sock.sendall(b"X")
                time.sleep(0.3)
                sock.setblocking(False)
                try:
                    if sock.recv(1) == b"":
                        closed_after = time.monotonic() - started
                        break
                except BlockingIOError:
                    pass
                finally:
                    sock.setblocking(True)
            except OSError:  # reset by the server
                closed_after = time.monotonic() - started
                break
    assert closed_after is not None and closed_after < 6, closed_after


def test_connections_beyond_the_cap_are_closed_and_the_server_stays_up(served):
    import socket

    url, _, _, server = served
    idle = [socket.create_connection(server.address, timeout=5) for _ in range(4)]  # the cap: 4
    try:
        for sock in idle:
            sock.sendall(b"POST /v1/clusters/demo/events HTTP/1.1\r\n")  # and nothing more
        import time

        time.sleep(0.3)  # the server has taken them
        extra = socket.create_connection(server.address, timeout=5)
        try:
            assert extra.recv(1) == b""  # closed at once, unread
        except ConnectionResetError:
            pass
        finally:
            extra.close()
    finally:
        for sock in idle:
            sock.close()
    time.sleep(0.3)
    assert post(url, notice())[0] == 202
