"""``kit train``: apply -> bootstrap -> watch -> cost report -> tear down, in one command.

The same loop for every cloud: the watcher (kit.watch) launches through the cloud's backend
(aws/gcp: render, terraform apply, ansible bootstrap; local: node processes), polls the cloud,
asks the policy and re-applies until the trainer reports ``done``. ``kit train`` again after an
interruption continues from the ledger (deploy/NAME/ledger.sqlite).

Local time: the local cloud runs on a compressed clock (``local.time_scale`` trace seconds per
wall second, :class:`kit.clock.VirtualClock`). The ledger, the policy and the cost report
all use that clock, so node-hours and costs are trace hours (what the same job would have cost
at the trace's pace); ``wall_seconds`` is real time.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING

from rich.markup import escape

from kit.errors import InputError, KitError
from kit.paths import DEFAULT_SPEC

if TYPE_CHECKING:
    from rich.console import Console

    from kit.spec import SpecBase

REPORT_FILE = "report.json"  # deploy/<name>/report.json: the finished run's cost report
PREVIOUS_DIR = "previous"  # deploy/<name>/previous/<stamp>/: finished runs kept by `kit train --fresh`
# deploy/<name>/teardown.json: how far the end of a run got (its export, then its teardown), so that a
# `kit train` after a kill or failure there continues it instead of exporting again from deleted nodes
TEARDOWN_FILE = "teardown.json"
EXPORT_DIR = "export"  # deploy/<name>/export/step-N: the finished run's final checkpoint, exported
log = logging.getLogger("kit.train")


def load_train_spec(spec_path: Path | None, *, cloud: str | None, time_scale: float | None,
                    preempt_every: float | None, no_preemptions: bool):
    from kit.spec import load_spec

    spec = load_spec(spec_path or DEFAULT_SPEC)
    if cloud is not None and cloud != spec.cloud:
        raise InputError(f"--cloud {cloud} but the spec is for cloud {spec.cloud}", where=str(spec_path or DEFAULT_SPEC),
                         fix=f"drop --cloud or use a spec with `cloud: {cloud}`")
    return spec.with_run_options(time_scale=time_scale, preempt_every=preempt_every, no_preemptions=no_preemptions)


def steps_lost(ledger) -> int:
    """Steps trained again after setbacks (a resume from an older checkpoint)."""
    lost, prev = 0, None
    for _, step in ledger.progress_history():
        if prev is not None and step < prev:
            lost += prev - step
        prev = step
    return lost


class TrainRun:
    """``kit train`` in named steps: :meth:`prepare` (the spec's checks), :meth:`previous` (a
    finished job is shown, or archived with --fresh), :meth:`loop` (the watcher until the trainer
    reports done), :meth:`finish` (export, tear down, report). One loop for every cloud: what
    differs lives behind the backend's hooks (kit.backends.base.Backend)."""

    def __init__(self, spec: SpecBase, *, console: Console, json_report: Path | None = None, plot: Path | None = None,
                 keep_disks: bool = False, fresh: bool = False):
        from kit.render import deployment_dir

        self.spec, self.console = spec, console
        self.json_report, self.plot, self.keep_disks, self.fresh = json_report, plot, keep_disks, fresh
        self.deploy_dir = Path(deployment_dir(spec))
        self.wall_start = time.time()
        self.shown_at = 0.0

    def prepare(self) -> None:
        """Before anything is written or started: plan, bootstrap and export need the SSH key, and
        the report files must be writable (not found out after the whole run), the figure a PNG as kit
        simulate's."""
        from kit.paths import check_output_file, check_plot_file
        from kit.spec import check_ssh_key, spec_warnings

        check_ssh_key(self.spec)
        if self.plot is not None:
            check_plot_file(Path(self.plot))
        if self.json_report is not None:
            check_output_file(Path(self.json_report), "--json-report")
        for warning in spec_warnings(self.spec):
            self.console.print(f"[yellow]warning:[/yellow] {escape(warning)}", highlight=False)

    def previous(self, session) -> dict | None:
        """The report of this spec's finished job when there is one and no --fresh (nothing to do)."""
        from kit.watch.session import LEDGER_FILE

        finished = session.ledger.finished()
        if not finished and self.fresh and session.ledger.latest_progress():
            raise InputError("--fresh starts over only after a finished run, and this one has not finished",
                             where=str(self.deploy_dir / LEDGER_FILE), fix="run `kit train` without --fresh to continue it")
        if not finished:
            return None
        if self.fresh:  # before anything moves: nothing of the finished run may leak into the fresh one
            check_fresh_start(self.spec, self.deploy_dir, session.ledger)
        session.ledger.close()
        if not self.fresh:  # nothing to do: say so and show what the run gave
            return show_finished(self.deploy_dir, self.console, self.json_report)
        archive_finished(self.spec, self.deploy_dir, self.console)
        session.reopen_ledger()
        return None

    def tearing_down(self) -> bool:
        """A run whose end was cut short (killed or failed after its export began): the trainer is done,
        only the teardown is left."""
        return (self.deploy_dir / TEARDOWN_FILE).exists()

    def loop(self, session):
        """The watcher until the trainer reports done; an interrupt lets the nodes save first."""
        from kit.watch.session import LEDGER_FILE

        backend = session.backend
        backend.start()
        self.console.print(f"training [bold]{self.spec.name}[/bold] on {self.spec.cloud} ({self.spec.nodes} nodes, "
                           f"policy {session.policy.name}"
                           + (f", time scale {backend.time_scale:g}x" if backend.time_scale != 1.0 else "") + ")")
        try:
            return session.watcher.run(threading.Event(), on_tick=lambda result: self.on_tick(session, result))
        except BaseException as error:  # the loop failed or was interrupted, not the trainers: they save
            session.stop_early(lambda note: self.console.print(escape(f"interrupted: {note}")))
            self.add_wall_time(session.ledger)
            if isinstance(error, KeyboardInterrupt):
                self.console.print(escape("interrupted: `kit train` again continues from the ledger "
                                          f"({self.deploy_dir / LEDGER_FILE})"))
            raise

    def on_tick(self, session, result) -> None:
        data = session.puller.pull()
        if data and data.get("state") == "done":
            session.wake.set()
        session.backend.on_tick()
        if time.time() - self.shown_at > 5:
            self.shown_at = time.time()
            self.add_wall_time(session.ledger)  # as it goes: a killed kit's time still counts
            progress = f"step {result.step}/{result.total_steps}" if result.step is not None else "starting"
            self.console.print(escape(f"[{time.strftime('%H:%M:%S')}] {self.spec.name}: market {result.market or 'none'}, "
                                      f"{result.nodes_up}/{session.backend.spec.nodes} up, {progress}, "
                                      f"policy says {result.decision or '-'}"))

    def add_wall_time(self, ledger) -> float:
        wall, self.wall_start = ledger.add_wall_seconds(time.time() - self.wall_start), time.time()
        return wall

    def export(self, session) -> tuple[str | None, bool]:
        """Export the final checkpoint while the nodes are still up (and billed: the report's cost
        includes it); the data disks go only once that export was verified against the trainer's
        final digest (and not with --keep-disks). Returns (export path, delete the disks)."""
        progress = session.ledger.latest_progress() or {}
        params_sha256 = session.ledger.params_sha256()
        export, why_kept = None, None
        try:
            manifest = export_final(session.backend, session.backend.nodes(), self.deploy_dir / EXPORT_DIR,
                                    step=progress.get("total_steps"), params_sha256=params_sha256, console=self.console)
            export = manifest["path"]
            if not params_sha256:  # training.export checks the digest only when it is given one
                why_kept = "the trainer reported no final params_sha256, so nothing vouches for the exported parameters"
        except KitError as error:
            why_kept = error.what + (f" ({error.fix})" if error.fix else "")
        if why_kept:
            self.console.print(f"[yellow]warning:[/yellow] {escape(why_kept)}; the data disks are kept")
        return export, export is not None and why_kept is None and not self.keep_disks

    def finish(self, session) -> dict:
        """Export, tear down, report; then the run is finished. A run cut short on the way (killed, a
        failure) is continued by the next ``kit train`` from what :meth:`teardown` recorded."""
        done = self.teardown(session)
        report = self.report(session, done["ended"], wall=self.add_wall_time(session.ledger), export=done["export"],
                             disks=done["disks"])
        render_report(report, self.console)
        write_report(self.deploy_dir / REPORT_FILE, report)  # what a later `kit train` of this spec shows
        try:
            self.write_outputs(session, report)
        finally:  # the job is done whatever became of the user's files: a next `kit train` must not continue it
            session.ledger.mark_finished()
            (self.deploy_dir / TEARDOWN_FILE).unlink(missing_ok=True)
        return report

    def write_outputs(self, session, report: dict) -> None:
        """``--json-report`` and ``--plot``: probed before the run (kit.paths.check_output_file), yet a disk may fill or a
        directory go meanwhile; a failed write is a KitError naming the flag, not a traceback."""
        from kit.report import plot_run

        for flag, path, write in (
                ("--json-report", self.json_report, lambda out: write_report(out, report)),
                ("--plot", self.plot, lambda out: plot_run(session.ledger, self.spec, out,
                                                            scale=session.backend.time_scale))):
            if not path:
                continue
            try:
                write(Path(path))
            except OSError as error:
                raise KitError(f"the job finished, but {flag} could not be written: {error.strerror or error}",
                               where=f"{flag} {path}", fix=f"the report is in {self.deploy_dir / REPORT_FILE}; "
                                                           "`kit train SPEC --json-report FILE` writes it again") from None

    def teardown(self, session) -> dict:
        """The export (once), then the teardown, each recorded in :data:`TEARDOWN_FILE` before the next step
        (``export`` and ``disks``, then ``ended``: when the nodes stopped costing). The ledger says finished only
        after the report; a ``kit train`` after a kill or failure in between continues from here: the nodes may
        be gone, so it cannot export again, and their cost ended when they were deleted, not when kit came back."""
        from training.contract import read_json, write_json_atomic

        path = self.deploy_dir / TEARDOWN_FILE
        done = read_json(path)
        if done is None:
            session.backend.settle()  # the trainers finish writing
            session.puller.pull(force=True)
            session.backend.close()
            export, delete_disks = self.export(session)
            done = {"export": export, "disks": "deleted" if delete_disks else "kept"}
            write_json_atomic(path, done)  # before anything is deleted
        else:
            self.console.print(escape(f"continuing the teardown of the finished training ({path})"))
            session.backend.close()
            if done.get("ended") is None:  # what stopped meanwhile (local nodes die with kit) stops costing then
                session.watcher.record_losses()
        if done.get("ended") is None:
            session.backend.destroy(keep_disks=done["disks"] != "deleted")
            done["ended"] = session.clock()
            write_json_atomic(path, done)
        session.ledger.release_nodes(done["ended"])  # both idempotent: a second run records nothing new
        if done["disks"] == "deleted":
            session.watcher.keeper.record_deleted_with_the_job(done["ended"])
        return done

    def report(self, session, now: float, *, wall: float, export: str | None, disks: str) -> dict:
        from kit.watch.status import cost_of, status_report

        ledger, spec = session.ledger, self.spec
        progress = ledger.latest_progress() or {}
        status = status_report(ledger, spec, now=now)
        final = cost_of(ledger, spec, now, steps=progress.get("total_steps"), finished=True)
        return {
            "cluster": spec.name, "cloud": spec.cloud, "policy": session.policy.name,
            "time_scale": session.backend.time_scale,
            "preemptions": status["preemptions"], "interruptions": status["interruptions"],
            "market_switches": status["market_switches"],
            "spot_hours": status["spot_hours"], "on_demand_hours": status["on_demand_hours"],
            "cost": status["cost"],
            # The same job all on-demand: nodes x on-demand price x (the first launch's start-up +
            # total steps x median step time + the final export), the simulator's baseline
            # N x Q x (d + C0) measured on this run (kit/watch/status.py).
            "cost_on_demand": final["cost_all_on_demand"], "compute_hours": final["compute_hours"],
            "startup_hours": final["startup_hours"], "startup_measured": final["startup_measured"],
            "finish_hours": final["finish_hours"],
            "steps": progress.get("step"), "total_steps": progress.get("total_steps"),
            "steps_lost": steps_lost(ledger), "wall_seconds": round(wall, 2),
            "params_sha256": ledger.params_sha256(),
            "nodes_lost": status["nodes_lost"], "capacity_errors": status["capacity_errors"],
            # where it ran: zone/shape/market per apply, moves between zones and shape switches
            "offers": status["offers"], "moves": status["moves"], "shape_switches": status["shape_switches"],
            "probes": status["probes"], "probes_without_capacity": status["probes_without_capacity"],
            "egress_cost": egress_cost(status["egress_per_checkpoint_gb"], export, ledger.checkpoint_gb()),
            # the data disks: every one the job used (those of zones and shapes it left sit idle until the end)
            "disk_cost": status["disk_cost"], "idle_disk_hours": status["idle_disk_hours"],
            "disks_used": len(status["disks"]),
            "export": export, "disks": disks,
        }


def egress_cost(per_gb: float, export: str | None, measured_gb: float | None = None) -> float | None:
    """What the moves cost in egress: $ per GB of checkpoint moved x the final checkpoint's size (the
    exported state file; without an export, the newest checkpoint size the trainer reported,
    ``measured_gb``; None without either, unless nothing moved across regions)."""
    if not per_gb:
        return 0.0
    state = Path(export) / "checkpoint" / "state.pt" if export else None
    if state is not None and state.is_file():
        return round(per_gb * state.stat().st_size / 1e9, 4)
    return None if measured_gb is None else round(per_gb * measured_gb, 4)


def run_train(spec_path: Path | None, *, cloud: str | None = None, time_scale: float | None = None,
              preempt_every: float | None = None, no_preemptions: bool = False, json_report: Path | None = None,
              plot: Path | None = None, keep_disks: bool = False, interval_s: float | None = None,
              listen: str | None = None, advertise_url: str | None = None, fresh: bool = False,
              console=None) -> dict:
    from rich.console import Console

    from kit.watch.session import Session, check_interval, check_listen

    check_interval(interval_s)  # before anything is read or started
    spec = load_train_spec(spec_path, cloud=cloud, time_scale=time_scale, preempt_every=preempt_every,
                           no_preemptions=no_preemptions)
    # Session.start binds it after the ledger, lock and token were written: tried now, the cloud's default too
    # (0.0.0.0:8787 with --advertise-url, which another process may hold)
    check_listen(listen or spec.cloud_facts.listen_default(advertise_url))
    run = TrainRun(spec, console=console or Console(), json_report=json_report, plot=plot, keep_disks=keep_disks,
                   fresh=fresh)
    run.prepare()
    with Session(spec, run.deploy_dir) as session:
        shown = run.previous(session)
        if shown is not None:
            return shown
        session.start(listen=listen, advertise_url=advertise_url, interval_s=interval_s)
        if not run.tearing_down():
            run.loop(session)
        return run.finish(session)


def write_report(path: Path, report: dict) -> None:
    from training.contract import write_atomic

    write_atomic(path, json.dumps(report, indent=2, sort_keys=True) + "\n")


def finished_report(deploy_dir: Path) -> dict | None:
    """The finished run's report (``deploy/<name>/report.json``), or None when it is missing or unreadable."""
    from training.contract import read_json

    return read_json(deploy_dir / REPORT_FILE)


def show_finished(deploy_dir: Path, console, json_report: Path | None) -> dict:
    """The job of this spec already finished: print its report (and write it where asked) instead of
    training again; ``--fresh`` starts a new run."""
    from kit.watch.session import LEDGER_FILE

    report = finished_report(deploy_dir)
    console.print(escape(f"this job already finished; `kit train --fresh` trains it again (the finished run is kept "
                         f"under {deploy_dir / PREVIOUS_DIR}/)"))
    if report is None:  # finished by a kit that kept no report
        console.print(escape(f"its report was not saved; `kit status` shows the ledger ({deploy_dir / LEDGER_FILE})"))
        return {}
    render_report(report, console)
    if json_report:
        write_report(Path(json_report), report)
    return report


def check_fresh_start(spec: SpecBase, deploy_dir: Path, ledger) -> None:
    """``--fresh`` over a finished run, refused (before anything is moved) where the fresh run's trainers would
    restore that run's final checkpoint instead of starting over: from its data disks, kept and still there,
    or from the job's prefix in ``checkpoint_bucket``, which kit neither moves nor deletes (a bucket is the
    user's, and may be shared). The local cloud's own bucket is moved with the run (:func:`archive_finished`)."""
    left = disks_left(spec, deploy_dir, ledger)
    if left is not None:
        raise InputError("the finished run kept its data disks, so a fresh run would resume from their final "
                         "checkpoint instead of starting over", where=str(deploy_dir / REPORT_FILE),
                         fix=f"delete the disks first ({left}), or run without --fresh to see the report")
    url = spec.bucket_url
    if url is None:
        return
    held = bucket_entries(url)
    if held:
        raise InputError(f"{url} holds the finished run's checkpoints ({held} entries), so a fresh run would resume from "
                         "them instead of starting over (and overwrite them)", where="checkpoint_bucket",
                         fix=f"move or delete everything under {url}, or set checkpoint_bucket to another prefix; "
                             "or run without --fresh to see the report")


def disks_left(spec: SpecBase, deploy_dir: Path, ledger) -> str | None:
    """How to delete the finished run's data disks when its report says they were kept and they may still be
    there; None when they are gone. A cloud that renders no Terraform (the local one) has them on this machine,
    each a directory (its disk id): gone once deleted by hand. A cloud's disks are gone once its disks roots'
    Terraform state lists none (:func:`terraform_disks_gone`)."""
    if (finished_report(deploy_dir) or {}).get("disks") != "kept":
        return None
    if spec.cloud_facts.renders_terraform:
        return None if terraform_disks_gone(deploy_dir) else ("`kit destroy SPEC --with-disks`, which also drops "
                                                              "disks deleted in the console from Terraform's state")
    there = sorted({d["disk_id"] for d in ledger.disks() if Path(d["disk_id"]).exists()})
    return f"rm -r {' '.join(there)}" if there else None


def terraform_disks_gone(deploy_dir: Path) -> bool:
    """Whether the disks roots' Terraform state provably lists no data disk (``kit destroy --with-disks`` ran
    since the run kept them); False while it lists one, and when it cannot be read (said in the log)."""
    from kit import terraform

    try:
        held = terraform.disks_held(deploy_dir)
    except KitError as error:
        log.warning("cannot tell whether the finished run's kept disks are gone: %s", error.what)
        return False
    return not held


def bucket_entries(url: str) -> int:
    """How many entries the bucket prefix ``url`` holds (fsspec, as the trainer reaches it: s3://, gs://,
    file://). Refused (InputError) when it cannot be listed: an unknown prefix is not an empty one."""
    try:
        import fsspec

        fs, root = fsspec.core.url_to_fs(url)
        fs.invalidate_cache()  # s3fs/gcsfs cache listings
        try:
            return len(fs.ls(root.rstrip("/"), detail=False))
        except FileNotFoundError:
            return 0
    except Exception as error:  # no package for the scheme, no credentials, no network: refused, said why
        raise InputError(f"cannot tell whether {url} holds the finished run's checkpoints: {error}",
                         where="checkpoint_bucket", fix=f"check that kit can list {url}, or empty it (or set "
                                                        "checkpoint_bucket to another prefix)") from error


def archive_finished(spec: SpecBase, deploy_dir: Path, console) -> Path:
    """Move a finished run to ``previous/<stamp>/`` (:func:`check_fresh_start` first), so that a fresh run
    starts clean and never mistakes the old run's files for its own: its ledger, report and export; and for a
    cloud that renders no Terraform (the local one), everything else of it here too, its own checkpoint
    bucket among them (its trainers restored the old run's final checkpoint from it and trained nothing).
    A cloud's deployment directory also holds Terraform's roots: its resources, not the run's, stay."""
    from kit.watch.session import LEDGER_FILE, LOCK_FILE

    stamp = time.strftime("%Y%m%d-%H%M%S")
    target = deploy_dir / PREVIOUS_DIR / stamp
    n = 1
    while target.exists():
        n += 1
        target = deploy_dir / PREVIOUS_DIR / f"{stamp}-{n}"
    target.mkdir(parents=True)
    names = [LEDGER_FILE, LEDGER_FILE + "-wal", LEDGER_FILE + "-shm", REPORT_FILE, TEARDOWN_FILE, EXPORT_DIR]
    if not spec.cloud_facts.renders_terraform:  # the lock is held: it stays
        names = [p.name for p in deploy_dir.iterdir() if p.name not in (LOCK_FILE, PREVIOUS_DIR)]
    for name in names:
        if (deploy_dir / name).exists():
            (deploy_dir / name).rename(target / name)
    kept = target / REPORT_FILE
    if kept.exists():  # the report names its export where it now is
        report = json.loads(kept.read_text())
        if report.get("export"):
            report["export"] = report["export"].replace(str(deploy_dir / EXPORT_DIR), str(target / EXPORT_DIR), 1)
            write_report(kept, report)
    console.print(escape(f"starting a fresh run; the finished one is kept in {target}"))
    return target


def export_final(backend, nodes, dest: Path, *, step: int | None, params_sha256: str | None, console) -> dict:
    """Export the job's final checkpoint (training.export) from the first node that has it, in rank
    order: verified copy, model weights, manifest under ``dest/step-N``. KitError when no node can."""
    import shutil

    from training.export import ExportError, export

    if not nodes:
        raise KitError("no nodes are up to export the final checkpoint from", where=str(dest),
                       fix="the checkpoint is on the data disks; `kit apply` and export it with python -m training.export")
    failures = []
    scratch = dest / ".fetch"
    for node in sorted(nodes, key=lambda n: n.rank):
        try:
            source = backend.checkpoint_dir(node, scratch)
            manifest = export(source, dest, step=step, params_sha256=params_sha256,
                              log=lambda message: console.print(f"[yellow]{escape(message)}[/yellow]"))
            console.print(escape(f"exported step {manifest['step']} from {node.name} to {manifest['path']}"))
            return manifest
        except (KitError, ExportError, OSError) as error:
            failures.append(f"{node.name}: {getattr(error, 'what', None) or error}")
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
    raise KitError("the final checkpoint could not be exported: " + "; ".join(failures), where=str(dest),
                   fix="the data disks keep it; export it with `python -m training.export CKPT_DIR OUT` from a node")


def render_report(report: dict, console) -> None:
    from rich.table import Table

    from kit.watch.status import route

    money = lambda v: "?" if v is None else f"${v:,.2f}"
    table = Table(title=escape(f"kit train {report['cluster']} ({report['cloud']}, policy {report['policy']})"),
                  title_justify="left")
    table.add_column("")
    table.add_column("value", justify="right")
    rows = [("steps", f"{report['steps']}/{report['total_steps']}"), ("steps lost", str(report["steps_lost"])),
            # a report kept from before interruptions were counted has none
            ("interruptions (nodes preempted)", f"{report.get('interruptions', '?')} ({report['preemptions']})"),
            ("market switches", str(report["market_switches"])),
            ("moves / shape switches", f"{report.get('moves', 0)} / {report.get('shape_switches', 0)}"),
            ("egress of the moves", money(report.get("egress_cost", 0.0))),
            ("data disks used (idle hours)", f"{report.get('disks_used', 0)} ({report.get('idle_disk_hours', 0):.2f})"),
            ("spot node-hours", f"{report['spot_hours']:.2f}"), ("on-demand node-hours", f"{report['on_demand_hours']:.2f}"),
            ("cost", money(report["cost"])), ("same job all on-demand", money(report["cost_on_demand"])),
            ("wall time", f"{report['wall_seconds']:.1f} s"), ("params_sha256", str(report["params_sha256"])[:16] + "…")]
    if "disks" in report:
        rows.append(("final checkpoint", str(report.get("export") or "not exported")))
        rows.append(("data disks", report["disks"]))
    for key, value in rows:
        table.add_row(key, escape(value))  # the export's path, for one
    console.print(table)
    if len(set(report.get("offers") or [])) > 1:
        console.print(escape("ran on: " + route(report["offers"])), highlight=False)
    if report.get("time_scale", 1.0) != 1.0:  # a compressed clock: the local backend's trace time
        console.print(f"(local hours are trace hours: wall time × time scale {report['time_scale']:g})")
