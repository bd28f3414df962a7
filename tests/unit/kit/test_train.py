"""`kit train` on a cloud spec: the same loop through the cloud backend interface (faked here:
no Terraform, no Ansible); the "agents" post heartbeats to the in-process watcher endpoint."""

from __future__ import annotations

import io
import json
import threading
import urllib.request
from pathlib import Path

import pytest
from rich.console import Console

from kit.errors import InputError, KitError
from kit.paths import EXAMPLES_DIR
from kit.watch.ledger import Ledger
from tests.support.trainer import write_final_checkpoint
from tests.support.watch import BackendSource, RecordingBackend


@pytest.fixture(autouse=True)
def ssh_key_home(tmp_path, monkeypatch):
    """The examples' key, ~/.ssh/id_ed25519.pub, which kit train checks before it starts."""
    from tests.support import make_home

    monkeypatch.setenv("HOME", str(make_home(tmp_path / "home")))


def test_missing_ssh_key_stops_before_anything_starts(tmp_path, monkeypatch):
    from kit.errors import InputError
    from kit.train import run_train

    (tmp_path / "home" / ".ssh" / "id_ed25519.pub").unlink()
    monkeypatch.setenv("KIT_DEPLOY_ROOT", str(tmp_path / "deploy"))
    with pytest.raises(InputError, match="ssh public key"):
        run_train(EXAMPLES_DIR / "aws-g5-spot.yaml", cloud="aws")
    assert not (tmp_path / "deploy").exists()


class AgentBackend(RecordingBackend):
    """bootstrap starts a fake agent that reports steps 0..total then done; the first run is
    preempted half-way once (node 0), so the loop must recover and bootstrap again."""

    def __init__(self, url, token, cluster, total=20, preempt_at=8):
        from kit.spec import load_spec

        # as many nodes as the example's offer: an apply that reports fewer is a failed apply
        super().__init__(nodes=load_spec(EXAMPLES_DIR / "aws-g5-spot.yaml").nodes)
        self.url, self.token, self.cluster, self.total, self.preempt_at = url, token, cluster, total, preempt_at
        self.step = 0
        self.final_sha = None

    def post(self, body):
        from kit.watch.server import node_token

        token = node_token(self.token, body["instance"])  # what the node's agent holds: its own token
        req = urllib.request.Request(f"{self.url}/v1/clusters/{self.cluster}/events", data=json.dumps(body).encode(),
                                     headers={"Authorization": f"Bearer {token}",
                                              "Content-Type": "application/json"})
        urllib.request.urlopen(req, timeout=5).read()

    def bootstrap(self, nodes):
        super().bootstrap(nodes)
        threading.Thread(target=self.train, daemon=True).start()

    def train(self):
        import time

        while self.step < self.total:
            self.step += 1
            state = "done" if self.step == self.total else "running"
            detail = {"state": state, **({"params_sha256": self.final_sha} if state == "done" and self.final_sha else {})}
            self.post({"kind": "progress", "instance": self.deployed[0].instance_id if self.deployed else "x",
                       "node_rank": 0, "time": time.time(), "cloud": "aws", "detail": detail,
                       "step": self.step, "total_steps": self.total, "step_time_s": 0.05})
            if self.step == self.preempt_at:
                self.preempt_at = None
                self.preempt(0)
                return
            time.sleep(0.02)


def _disks_in_status(tmp_path, now=None):
    """The data disks as `kit status` reports them for the example's deployment, an hour after now."""
    import time

    from kit.spec import load_spec
    from kit.watch.ledger import Ledger
    from kit.watch.status import status_report

    spec = load_spec(EXAMPLES_DIR / "aws-g5-spot.yaml")
    ledger = Ledger(tmp_path / "deploy" / spec.name / "ledger.sqlite")
    return status_report(ledger, spec, now=time.time() + 3600 if now is None else now)["disks"]


def agent_backends(tmp_path, monkeypatch) -> dict:
    """`kit train` on a cloud spec runs against an :class:`AgentBackend` (made["b"], once the watcher makes it)
    and watches it through its own source; deployments under tmp_path."""
    from kit.backends import cloud
    from kit.watch import sources

    monkeypatch.setenv("KIT_DEPLOY_ROOT", str(tmp_path / "deploy"))
    made: dict = {}

    def backend_for(spec, deploy_dir, *, watcher_url=None, watcher_token=None):
        made["b"] = AgentBackend(watcher_url, watcher_token, spec.name)
        return made["b"]

    monkeypatch.setattr(cloud, "backend_for", backend_for)
    monkeypatch.setattr(sources, "source_for", lambda spec, deploy_dir: BackendSource(made["b"]))
    return made


def test_cloud_loop_recovers_and_keeps_disks(tmp_path, monkeypatch):
    from kit.train import run_train

    made = agent_backends(tmp_path, monkeypatch)
    with open(tmp_path / "out", "w") as out:
        report = run_train(EXAMPLES_DIR / "aws-g5-spot.yaml", cloud="aws", json_report=tmp_path / "r.json",
                           interval_s=0.1, listen="127.0.0.1:0", console=Console(file=out))
    backend = made["b"]
    assert report["steps"] == 20 and report["preemptions"] == 1
    assert len(backend.of("bootstrap")) == 2, "recovered once"
    assert backend.of("destroy") == [("destroy", True)], "no export (this fake has no checkpoints): disks kept"
    assert report["export"] is None and report["disks"] == "kept"
    assert {d["released"] for d in _disks_in_status(tmp_path)} == {None}, "kept disks are not shown deleted"
    written = json.loads((tmp_path / "r.json").read_text())
    assert written == {k: v for k, v in report.items()}
    # cost: the node-hours held x their prices; cost_on_demand: the same *job* all on-demand, the
    # spec's nodes x on-demand price x (20 steps x the measured 0.05 s + one changeover) — not the
    # node-hours held (which a preemption, lost steps and idle nodes inflate).
    from kit.spec import load_spec

    spec = load_spec(EXAMPLES_DIR / "aws-g5-spot.yaml")
    prices = spec.prices
    assert report["cost"] == pytest.approx(report["spot_hours"] * prices.spot_per_hour
                                           + report["on_demand_hours"] * prices.on_demand_per_hour, abs=1e-3)
    assert report["compute_hours"] == pytest.approx(20 * 0.05 / 3600)
    # d: the first launch's start-up as measured (here: the fake starts at once), else the spec's
    startup = report["startup_hours"]
    assert startup < 5 / 3600 if report["startup_measured"] else startup == spec.policy.changeover_hours
    assert 0 <= report["finish_hours"] < 10 / 3600
    # the report gives dollars to 4 decimals: this fake job's baseline is a fraction of a cent when its
    # start-up is measured (a few ms), so the tolerance is the rounding's
    assert report["cost_on_demand"] == pytest.approx(
        spec.nodes * prices.on_demand_per_hour * (startup + 20 * 0.05 / 3600 + report["finish_hours"]), rel=1e-3,
        abs=1e-4)


class DiskBackend(AgentBackend):
    """Nodes whose disks hold the final checkpoint: node 0's copy is truncated, node 1's is good."""

    def __init__(self, *args, disks, **kw):
        super().__init__(*args, **kw)
        self.disks = disks

    def checkpoint_dir(self, node, scratch):
        return self.disks / f"node-{node.rank}"


def test_cloud_disks_deleted_only_after_a_verified_export(tmp_path, monkeypatch, capsys):
    import shutil

    from kit.backends import cloud
    from kit.train import run_train
    from kit.watch import sources

    disks = tmp_path / "disks"
    sha = write_final_checkpoint(disks / "node-0", 20)
    shutil.copytree(disks / "node-0", disks / "node-1")
    state = disks / "node-0" / "step-00000020" / "state.pt"
    state.write_bytes(state.read_bytes()[:1000])  # node 0's copy is damaged: node 1's is exported
    monkeypatch.setenv("KIT_DEPLOY_ROOT", str(tmp_path / "deploy"))
    made = {}

    def backend_for(spec, deploy_dir, *, watcher_url=None, watcher_token=None):
        made["b"] = DiskBackend(watcher_url, watcher_token, spec.name, disks=disks, preempt_at=None)
        made["b"].final_sha = sha
        return made["b"]

    monkeypatch.setattr(cloud, "backend_for", backend_for)
    monkeypatch.setattr(sources, "source_for", lambda spec, deploy_dir: BackendSource(made["b"]))
    with open(tmp_path / "out", "w") as out:
        report = run_train(EXAMPLES_DIR / "aws-g5-spot.yaml", cloud="aws", interval_s=0.1, listen="127.0.0.1:0",
                           console=Console(file=out))
    assert report["params_sha256"] == sha
    assert report["export"].endswith("export/step-00000020") and report["disks"] == "deleted"
    assert made["b"].of("destroy") == [("destroy", False)]
    # `kit status` says so too, and charges the disks only until then (it showed them "kept" and counting)
    disks = _disks_in_status(tmp_path)
    assert disks and {d["released_why"] for d in disks} == {"job ended"}, disks
    assert all(d["released"] is not None and d["idle_hours"] < 0.01 for d in disks), disks
    assert "skipping step-00000020" in (tmp_path / "out").read_text()
    # and a day later `kit status` shows the finished job as it ended (it went on counting hours and cost)
    _status_a_day_later_is_the_report(report, capsys, monkeypatch)


def _status_a_day_later_is_the_report(report, capsys, monkeypatch):
    import time

    from kit.watch.commands import run_status

    real = time.time
    monkeypatch.setattr(time, "time", lambda: real() + 86400)
    capsys.readouterr()
    run_status(EXAMPLES_DIR / "aws-g5-spot.yaml", as_json=True)
    status = json.loads(capsys.readouterr().out)
    assert status["wall_hours"] < 0.1 and status["cost"] == pytest.approx(report["cost"], abs=0.01), status
    assert status["idle_disk_hours"] < 0.01


def test_no_trainer_digest_keeps_the_disks_and_export_time_is_billed(tmp_path, monkeypatch):
    """Finding 14: without the trainer's params_sha256 the export checks nothing, yet the disks were
    deleted; and the nodes were released before the export, so its time was not billed."""
    import shutil
    import time

    from kit.backends import cloud
    from kit.train import run_train
    from kit.watch import sources
    from kit.watch.ledger import Ledger

    disks = tmp_path / "disks"
    write_final_checkpoint(disks / "node-0", 20)
    shutil.copytree(disks / "node-0", disks / "node-1")
    monkeypatch.setenv("KIT_DEPLOY_ROOT", str(tmp_path / "deploy"))
    made, exporting = {}, []

    class SlowDiskBackend(DiskBackend):
        def checkpoint_dir(self, node, scratch):
            exporting.append(time.time())
            time.sleep(0.3)  # copying the checkpoint over SSH takes a while: the nodes are still billed
            return super().checkpoint_dir(node, scratch)

    def backend_for(spec, deploy_dir, *, watcher_url=None, watcher_token=None):
        made["b"] = SlowDiskBackend(watcher_url, watcher_token, spec.name, disks=disks, preempt_at=None)
        return made["b"]  # final_sha stays None: the trainer reported no digest

    monkeypatch.setattr(cloud, "backend_for", backend_for)
    monkeypatch.setattr(sources, "source_for", lambda spec, deploy_dir: BackendSource(made["b"]))
    with open(tmp_path / "out", "w") as out:
        report = run_train(EXAMPLES_DIR / "aws-g5-spot.yaml", cloud="aws", interval_s=0.1, listen="127.0.0.1:0",
                           console=Console(file=out))
    assert report["params_sha256"] is None
    assert report["export"].endswith("export/step-00000020"), "exported all the same"
    assert report["disks"] == "kept" and made["b"].of("destroy") == [("destroy", True)]
    assert "no final params_sha256" in (tmp_path / "out").read_text()
    ledger = Ledger(next((tmp_path / "deploy").glob("*/ledger.sqlite")))
    ends = [n.until for n in ledger.all_nodes() if n.state == "released"]
    assert ends and min(ends) >= exporting[0] + 0.3, "billed until the export was done"


def test_steps_lost_counts_resumes_not_late_reports(tmp_path):
    """Two nodes' reports interleave out of order (no step is lost there); a resume from an older
    checkpoint loses the steps since it."""
    from kit.train import steps_lost
    from kit.watch.ledger import Ledger
    from tests.support.watch import heartbeat

    ledger = Ledger(tmp_path / "l.sqlite")
    for step, rank, written in ((40, 0, 100.0), (46, 0, 103.0), (44, 1, 102.2), (48, 1, 104.0)):
        ledger.record(heartbeat(step, 120, rank=rank, written=written))
    assert steps_lost(ledger) == 0
    ledger.record(heartbeat(40, 120, rank=0, written=200.0))
    ledger.record(heartbeat(45, 120, rank=1, written=203.0))
    assert steps_lost(ledger) == 8


def test_the_report_prints_paths_and_offers_as_they_are_not_as_markup():
    """The export's path and the offers are the user's (a directory named "[/x]" is allowed): rich must
    not read them as markup."""
    import io

    from kit.train import render_report

    report = {"cluster": "demo", "cloud": "local", "policy": "default", "steps": 10, "total_steps": 10,
              "steps_lost": 0, "preemptions": 0, "market_switches": 0, "spot_hours": 1.0, "on_demand_hours": 0.0,
              "cost": 1.0, "cost_on_demand": 4.0, "wall_seconds": 3.0, "params_sha256": "ab" * 32,
              "export": "/data/[/x]/[red]export/step-10", "disks": "deleted",
              "offers": ["z-[/a]/2xlocal/spot", "z-b/1xlocal/spot"]}
    out = io.StringIO()
    render_report(report, Console(file=out, width=200))
    text = out.getvalue()
    assert "/data/[/x]/[red]export/step-10" in text and "z-[/a]/2xlocal/spot -> z-b/1xlocal/spot" in text, text


def test_egress_is_priced_on_the_export_else_on_the_checkpoint_size_the_trainer_reported(tmp_path):
    """The moves' egress: $/GB moved x the exported state file's size; a run whose export failed still
    gets a figure from the newest checkpoint size its trainer reported, and only without either is it
    unknown (None, printed "?"). Nothing moved across regions costs nothing either way."""
    from kit.train import egress_cost

    state = tmp_path / "export" / "checkpoint" / "state.pt"
    state.parent.mkdir(parents=True)
    state.write_bytes(b"\0" * 3_000_000)
    assert egress_cost(1.0, str(tmp_path / "export"), measured_gb=9.0) == pytest.approx(0.003)  # the export wins
    assert egress_cost(0.05, None, measured_gb=2.0) == pytest.approx(0.1)
    assert egress_cost(0.05, str(tmp_path / "missing"), measured_gb=2.0) == pytest.approx(0.1)
    assert egress_cost(0.05, None) is None
    assert egress_cost(0.0, None) == 0.0


@pytest.mark.parametrize("dies_in", ["destroy", "report"])
def test_a_run_cut_short_after_its_export_is_finished_by_the_next_not_exported_again(tmp_path, monkeypatch, dies_in):
    """kit killed (or failed) after the export began and before the ledger said finished: while the disks
    were deleted, or while the report was written. The next `kit train` found no nodes, exported nothing,
    said the disks it had deleted were kept (so `--fresh` was refused for good) and billed the nodes until
    then. It continues the teardown instead: the first export, the disks deleted, the nodes' cost ending
    when they were."""
    import shutil

    from kit import train
    from kit.backends import cloud
    from kit.train import run_train
    from kit.watch import sources

    disks = tmp_path / "disks"
    sha = write_final_checkpoint(disks / "node-0", 20)
    shutil.copytree(disks / "node-0", disks / "node-1")
    monkeypatch.setenv("KIT_DEPLOY_ROOT", str(tmp_path / "deploy"))
    made: list[DiskBackend] = []
    real_render = train.render_report

    class Dying(DiskBackend):
        def destroy(self, keep_disks=True):
            super().destroy(keep_disks)
            if dies_in == "destroy" and len(made) == 1:
                raise KeyboardInterrupt  # the kill, or a cloud call that failed

    def backend_for(spec, deploy_dir, *, watcher_url=None, watcher_token=None):
        made.append(Dying(watcher_url, watcher_token, spec.name, disks=disks, preempt_at=None))
        made[-1].final_sha = sha
        return made[-1]

    def render_report(report, console):
        if dies_in == "report" and len(made) == 1:
            raise KeyboardInterrupt
        real_render(report, console)

    monkeypatch.setattr(cloud, "backend_for", backend_for)
    monkeypatch.setattr(sources, "source_for", lambda spec, deploy_dir: BackendSource(made[-1]))
    monkeypatch.setattr(train, "render_report", render_report)
    args = {"cloud": "aws", "interval_s": 0.1, "listen": "127.0.0.1:0"}
    with open(tmp_path / "out", "w") as out, pytest.raises(KeyboardInterrupt):
        run_train(EXAMPLES_DIR / "aws-g5-spot.yaml", **args, console=Console(file=out))
    with open(tmp_path / "out", "w") as out:
        report = run_train(EXAMPLES_DIR / "aws-g5-spot.yaml", **args, console=Console(file=out))
    assert report["export"].endswith("export/step-00000020") and report["disks"] == "deleted", report
    assert made[1].of("bootstrap") == [], "the trainer was done: nothing launched again"
    assert made[1].of("destroy") == ([("destroy", False)] if dies_in == "destroy" else [])
    with open(tmp_path / "out", "w") as out:  # finished: shown, and --fresh is not refused
        assert run_train(EXAMPLES_DIR / "aws-g5-spot.yaml", **args, console=Console(file=out)) == report
    ledger = Ledger(next((tmp_path / "deploy").glob("*/ledger.sqlite")))
    assert ledger.finished() and not list((tmp_path / "deploy").glob("*/teardown.json"))
    ends = {n.until for n in ledger.all_nodes()}
    assert len(ends) == 1 and report["spot_hours"] == pytest.approx(
        sum(n.until - n.since for n in ledger.all_nodes()) / 3600, abs=1e-3), "billed until the first teardown"


def _finish(session, disks: str = "deleted") -> None:
    """The ledger and report of a run `kit train` finished."""
    from kit.train import REPORT_FILE, write_report

    session.ledger.mark_finished()
    write_report(session.deploy_dir / REPORT_FILE, {"disks": disks, "export": None})


def _fresh(spec, session):
    """`kit train --fresh`'s look at the finished run (archived when it may go): None, or InputError."""
    import io

    from kit.train import TrainRun

    return TrainRun(spec, console=Console(file=io.StringIO()), fresh=True).previous(session)


def test_fresh_moves_the_local_job_s_own_bucket_with_the_finished_run(tmp_path, monkeypatch):
    """A local job with zones keeps its checkpoints in a bucket of its own, in its deployment directory. --fresh
    left it there: the fresh run's trainers restored the finished run's final checkpoint and trained nothing,
    and its copies were overwritten. It is kept with the rest of the finished run."""
    from kit.backends.local import LocalBackend
    from kit.render import deployment_dir
    from kit.spec import load_spec
    from kit.watch.session import LOCK_FILE, Session

    monkeypatch.setenv("KIT_DEPLOY_ROOT", str(tmp_path / "deploy"))
    spec = load_spec(EXAMPLES_DIR / "local.yaml")
    deploy = deployment_dir(spec)
    command = LocalBackend(spec, deploy).trainer_command(0, "127.0.0.1:1")
    bucket = command[command.index("--ckpt-bucket") + 1]
    assert bucket.startswith(f"file://{deploy}/")
    final = Path(bucket.removeprefix("file://")) / "step-00000400" / "COMPLETE"
    final.parent.mkdir(parents=True)
    final.write_text("{}")
    with Session(spec, deploy) as session:
        _finish(session)
        assert _fresh(spec, session) is None
        assert not session.ledger.finished()
    assert not final.exists(), "the fresh run would restore the finished run's final checkpoint"
    (kept,) = (deploy / "previous").iterdir()
    assert (kept / final.relative_to(deploy)).is_file() and (kept / "ledger.sqlite").is_file()
    assert (deploy / LOCK_FILE).exists()


@pytest.fixture(params=["file", "s3"])
def checkpoint_bucket(request, tmp_path, monkeypatch):
    """A checkpoint_bucket URL: a directory, or S3 (moto)."""
    if request.param == "file":
        yield f"file://{tmp_path / 'bucket'}"
        return
    from tests.support.moto import s3_bucket

    with s3_bucket(monkeypatch) as url:
        yield f"{url}/kit"


def test_fresh_is_refused_while_the_job_s_prefix_in_its_checkpoint_bucket_holds_checkpoints(
        tmp_path, monkeypatch, checkpoint_bucket):
    """The trainers of a fresh run would restore the finished run's final checkpoint from the bucket (and then
    overwrite its copies); a bucket is the user's, so kit moves nothing out of it: --fresh is refused, naming the
    prefix, until it is empty. Nothing is moved meanwhile."""
    import fsspec

    from kit.render import deployment_dir
    from kit.spec import parse_spec
    from kit.watch.session import Session

    monkeypatch.setenv("KIT_DEPLOY_ROOT", str(tmp_path / "deploy"))
    spec = parse_spec({"name": "b", "cloud": "local", "checkpoint_bucket": checkpoint_bucket})
    assert spec.bucket_url
    fs, root = fsspec.core.url_to_fs(spec.bucket_url)
    fs.mkdirs(f"{root}/step-00000020", exist_ok=True)
    fs.pipe(f"{root}/step-00000020/COMPLETE", b"{}")
    deploy = deployment_dir(spec)
    with Session(spec, deploy) as session:
        _finish(session)
        with pytest.raises(InputError, match="holds the finished run's checkpoints") as refused:
            _fresh(spec, session)
        assert spec.bucket_url in refused.value.fix and "checkpoint_bucket" in refused.value.fix
        assert session.ledger.finished() and not (deploy / "previous").exists(), "nothing moved"
        fs.rm(root, recursive=True)
        assert _fresh(spec, session) is None


def test_fresh_sees_that_kept_cloud_disks_were_destroyed(tmp_path, monkeypatch):
    """The finished cloud run kept its disks: --fresh is refused while the disks roots' Terraform state lists
    them, and when it cannot be read; once `kit destroy --with-disks` destroyed them it is not (it was refused
    for good: the report still says kept)."""
    from kit import terraform
    from kit.errors import KitError
    from kit.render import deployment_dir
    from kit.watch.session import Session
    from tests.support.watch import cloud_spec

    monkeypatch.setenv("KIT_DEPLOY_ROOT", str(tmp_path / "deploy"))
    spec = cloud_spec("aws")
    deploy = deployment_dir(spec)
    state: list = []

    def disks_held(deploy_dir):
        assert Path(deploy_dir) == deploy
        if isinstance(state[0], Exception):
            raise state[0]
        return state[0]

    monkeypatch.setattr(terraform, "disks_held", disks_held)
    with Session(spec, deploy) as session:
        _finish(session, disks="kept")
        for held in (["module.disks.aws_ebs_volume.this[0]"], KitError("terraform state list failed: AccessDenied")):
            state[:] = [held]
            with pytest.raises(InputError, match="kept its data disks") as refused:
                _fresh(spec, session)
            assert refused.value.fix and "kit destroy SPEC --with-disks" in refused.value.fix
            assert session.ledger.finished() and not (deploy / "previous").exists(), "nothing moved"
        state[:] = [[]]
        assert _fresh(spec, session) is None
        assert not session.ledger.finished()


def test_fresh_sees_that_kept_local_disks_were_deleted(tmp_path, monkeypatch):
    """The finished run kept its disks: --fresh is refused while they are there (the fresh run would resume
    from them), naming them; deleted by hand, as the refusal says, they no longer hold it back (the report
    still says kept, and was taken at its word for good)."""
    import shutil

    from kit.render import deployment_dir
    from kit.watch.session import Session
    from tests.support.watch import local_spec

    monkeypatch.setenv("KIT_DEPLOY_ROOT", str(tmp_path / "deploy"))
    spec = local_spec(name="d", nodes=1)
    deploy = deployment_dir(spec)
    disk = deploy / "local" / "disks" / "node-0"
    (disk / "ckpt").mkdir(parents=True)
    with Session(spec, deploy) as session:
        session.ledger.adopt_deployment([{"instance_id": "node-0-1", "name": "node-0", "rank": 0, "market": "spot",
                                          "disk_id": str(disk)}], "spot", "default", 1000.0)
        session.ledger.release_nodes(2000.0)
        _finish(session, disks="kept")
        with pytest.raises(InputError, match="kept its data disks") as refused:
            _fresh(spec, session)
        assert str(disk) in refused.value.fix
        shutil.rmtree(disk)
        assert _fresh(spec, session) is None


@pytest.mark.parametrize("listen", ["256.0.0.1:0", "8.8.8.8:0", "[::1]:0", "in use"])
def test_a_listen_address_that_cannot_be_bound_is_refused_before_anything_is_written(tmp_path, monkeypatch, listen):
    """The endpoint binds after the ledger, lock and token were written: the address is tried first
    (256 is no octet: no DNS lookup; 8.8.8.8 is not this machine's: bound, never sent to)."""
    import socket

    from kit.train import run_train

    monkeypatch.setenv("KIT_DEPLOY_ROOT", str(tmp_path / "deploy"))
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        if listen == "in use":
            listen = f"127.0.0.1:{taken.getsockname()[1]}"
        with pytest.raises(InputError) as refused:
            run_train(EXAMPLES_DIR / "local.yaml", listen=listen, console=Console(file=io.StringIO()))
    assert refused.value.where == "--listen"
    assert not (tmp_path / "deploy").exists()


def test_the_clouds_default_listen_address_is_tried_too(tmp_path, monkeypatch):
    """Without --listen, the cloud's default (0.0.0.0:8787 with --advertise-url) may be held by another process."""
    import socket

    from kit.clouds.local import CLOUD
    from kit.train import run_train

    monkeypatch.setenv("KIT_DEPLOY_ROOT", str(tmp_path / "deploy"))
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        monkeypatch.setattr(type(CLOUD), "listen_default", lambda self, url: f"127.0.0.1:{taken.getsockname()[1]}")
        with pytest.raises(InputError, match="Address already in use"):
            run_train(EXAMPLES_DIR / "local.yaml", console=Console(file=io.StringIO()))
    assert not (tmp_path / "deploy").exists()


def test_a_report_that_cannot_be_written_at_the_end_still_finishes_the_job(tmp_path, monkeypatch):
    """--json-report was probed before the run, but the disk may fill meanwhile: the write's OSError was a
    traceback, and it came before the ledger said the job was finished, so the next `kit train` took the run
    for one cut short and continued it. Now a KitError naming the flag, after the job is marked finished."""
    from kit.train import run_train

    agent_backends(tmp_path, monkeypatch)
    from kit import train

    real = train.write_report

    def disk_full(path, report):
        if path == tmp_path / "r.json":
            raise OSError(28, "No space left on device")
        real(path, report)

    monkeypatch.setattr(train, "write_report", disk_full)
    with open(tmp_path / "out", "w") as out, pytest.raises(KitError) as failed:
        run_train(EXAMPLES_DIR / "aws-g5-spot.yaml", cloud="aws", json_report=tmp_path / "r.json",
                  interval_s=0.1, listen="127.0.0.1:0", console=Console(file=out))
    assert failed.value.where == f"--json-report {tmp_path / 'r.json'}" and "No space left" in failed.value.what
    monkeypatch.setattr(train, "write_report", real)
    with open(tmp_path / "out2", "w") as out:
        again = run_train(EXAMPLES_DIR / "aws-g5-spot.yaml", cloud="aws", json_report=tmp_path / "r.json",
                          interval_s=0.1, listen="127.0.0.1:0", console=Console(file=out))
    assert "already finished" in (tmp_path / "out2").read_text() and again["steps"] == 20
