"""``kit train``: apply -> bootstrap -> watch -> cost report -> tear down, in one command (issue 6).

The same loop for every cloud: the watcher (kit.watch) launches through the cloud's backend
(aws/gcp: render, terraform apply, ansible bootstrap; local: node processes), polls the cloud,
asks the policy and re-applies until the trainer reports ``done``. ``kit train`` again after an
interruption continues from the ledger (deploy/NAME/ledger.sqlite).

Local time: the local cloud runs on a compressed clock (``local.time_scale`` trace seconds per
wall second, :class:`kit.local.injector.VirtualClock`). The ledger, the policy and the cost report
all use that clock, so node-hours and costs are trace hours (what the same job would have cost
at the trace's pace); ``wall_seconds`` is real time.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from pathlib import Path

from kit.errors import InputError, KitError
from kit.paths import EXAMPLES_DIR

DEFAULT_SPEC = EXAMPLES_DIR / "local.yaml"
REPORT_FILE = "report.json"  # deploy/<name>/report.json: the finished run's cost report
PREVIOUS_DIR = "previous"  # deploy/<name>/previous/<stamp>/: finished runs kept by `kit train --fresh`
log = logging.getLogger("kit.train")


def load_train_spec(spec_path: Path | None, *, cloud: str | None, time_scale: float | None,
                    preempt_every: float | None, no_preemptions: bool):
    from kit.spec import load_spec

    spec = load_spec(spec_path or DEFAULT_SPEC)
    if cloud is not None and cloud != spec.cloud:
        raise InputError(f"--cloud {cloud} but the spec is for cloud {spec.cloud}", where=str(spec_path or DEFAULT_SPEC),
                         fix=f"drop --cloud or use a spec with `cloud: {cloud}`")
    local = spec.local
    update = {}
    if time_scale is not None:
        if time_scale <= 0:
            raise InputError(f"--time-scale {time_scale} must be > 0", where="--time-scale", fix="e.g. 3600")
        update["time_scale"] = time_scale
    if preempt_every is not None:
        if preempt_every <= 0:
            raise InputError(f"--preempt-every {preempt_every} must be > 0", where="--preempt-every", fix="e.g. 20")
        update["preempt_every_seconds"] = preempt_every
    if no_preemptions:
        update["preemptions"] = False
    if update:
        spec = spec.model_copy(update={"local": local.model_copy(update=update)})
    return spec


def steps_lost(ledger) -> int:
    rows = ledger._query("SELECT step FROM progress ORDER BY id")
    lost, prev = 0, None
    for row in rows:
        if prev is not None and row["step"] < prev:
            lost += prev - row["step"]
        prev = row["step"]
    return lost


def run_train(spec_path: Path | None, *, cloud: str | None = None, time_scale: float | None = None,
              preempt_every: float | None = None, no_preemptions: bool = False, json_report: Path | None = None,
              plot: Path | None = None, keep_disks: bool = False, interval_s: float | None = None,
              listen: str | None = None, advertise_url: str | None = None, fresh: bool = False,
              console=None) -> dict:
    from rich.console import Console

    from kit.backends import cloud as cloud_backends
    from kit.render import deployment_dir
    from kit.watch import sources
    from kit.watch.acting import Actor
    from kit.watch.commands import LEDGER_FILE, LOCK_FILE, make_policy_for, observation_type
    from kit.watch.ledger import Ledger, WatcherLock
    from kit.watch.progress import ProgressPuller
    from kit.watch.server import WatcherServer, cluster_token, ledger_sink
    from kit.watch.status import cost_of, status_report
    from kit.watch.watcher import Watcher

    console = console or Console()
    spec = load_train_spec(spec_path, cloud=cloud, time_scale=time_scale, preempt_every=preempt_every,
                           no_preemptions=no_preemptions)
    if spec.cloud != "local":
        from kit.spec import check_ssh_key, spec_warnings

        check_ssh_key(spec)  # before anything is written or started: plan, bootstrap and export need it
        for warning in spec_warnings(spec):
            console.print(f"[yellow]warning:[/yellow] {warning}", highlight=False)
    deploy_dir = Path(deployment_dir(spec))
    deploy_dir.mkdir(parents=True, exist_ok=True)
    local = spec.cloud == "local"
    wall_start = time.time()
    with WatcherLock(deploy_dir / LOCK_FILE):
        ledger = Ledger(deploy_dir / LEDGER_FILE)
        finished = bool(ledger.get_meta("finished"))
        if not finished and fresh and ledger.latest_progress():
            ledger.close()
            raise InputError("--fresh starts over only after a finished run, and this one has not finished",
                             where=str(deploy_dir / LEDGER_FILE),
                             fix="run `kit train` without --fresh to continue it")
        if finished:
            ledger.close()
            if not fresh:  # nothing to do: say so and show what the run gave
                return show_finished(deploy_dir, console, json_report)
            archive_finished(deploy_dir, console)
            ledger = Ledger(deploy_dir / LEDGER_FILE)
        token = cluster_token(deploy_dir)
        policy = make_policy_for(spec)
        wake = threading.Event()
        injector = None
        scale = float(spec.local.time_scale) if local else 1.0
        if local:
            from kit.backends.local import LocalBackend
            from kit.local.injector import Injector, VirtualClock

            origin = float(ledger.get_meta("local_clock_origin") or 0) or wall_start
            ledger.set_meta("local_clock_origin", repr(origin))
            clock = VirtualClock(origin, scale)
            backend = LocalBackend(spec, deploy_dir, clock=clock)  # agents relay notices only (see docs)
            injector = Injector(backend, nodes=spec.nodes, clock=clock, origin=origin, trace=spec.local.trace,
                                preempt_every=spec.local.preempt_every_seconds,
                                grace_seconds=spec.local.grace_seconds, enabled=spec.local.preemptions)
            interval = interval_s or 0.5
        else:
            clock = time.time
            backend = None
            interval = interval_s or 15.0
        from kit.watch.commands import parse_listen

        # The endpoint is only opened to the network when the nodes are told where to reach it.
        host, port = parse_listen(listen or ("0.0.0.0:8787" if advertise_url and not local else "127.0.0.1:0"))
        with WatcherServer({spec.name: token}, ledger_sink(ledger, wake), host=host, port=port) as server:
            if backend is None:
                # Nodes post to the endpoint only at a URL they can reach; otherwise kit reads the
                # progress over SSH and the cloud APIs tell it about preemptions.
                url = advertise_url or (server.url if host not in ("0.0.0.0", "::") else None)
                backend = cloud_backends.backend_for(spec, deploy_dir, watcher_url=url, watcher_token=token)
            # The watcher's tick, in (trace) hours, is interval x scale, or longer when an apply +
            # bootstrap takes longer (kit.watch.watcher.Watcher.tick_hours).
            source = sources.source_for(spec, deploy_dir)
            watcher = Watcher(spec, ledger, Actor(backend, ledger, spec, clock=clock, source=source), policy,
                              source=source, interval_s=interval, clock=clock,
                              observation=observation_type(), time_scale=scale)
            watcher.wake = wake

            puller = ProgressPuller(backend, ledger, source=spec.cloud, clock=clock, time_scale=scale,
                                    every_s=0.0 if local else 15.0)

            def pump(result, force: bool = False) -> None:
                data = puller.pull(force=force)
                if data and data.get("state") == "done":
                    wake.set()

            shown = {"t": 0.0}

            crashed = {"since": None, "restarts": 0}

            def restart_crashed() -> None:
                """Every trainer exited without done or a preemption in flight (e.g. a rendezvous
                timeout): restart training on the same nodes, like a node's systemd unit would."""
                if not local or not backend.procs or (injector and injector.pending):
                    crashed["since"] = None
                    return
                data = backend.progress() or {}
                states = [backend.read_state(r) or {} for r in range(spec.nodes)]
                exited = all(backend.trainer_exit(r) is not None for r in backend.procs)
                if (not exited or data.get("state") == "done"
                        or any(st.get("state") != "running" for st in states)):
                    crashed["since"] = None
                    return
                if crashed["since"] is None:
                    crashed["since"] = time.time()
                elif time.time() - crashed["since"] > 5:
                    crashed["since"] = None
                    crashed["restarts"] += 1
                    if crashed["restarts"] > 5:
                        raise KitError("the trainers keep exiting without finishing", where=str(backend.root / "run"),
                                       fix="see train.log of each node")
                    log.warning("trainers exited without finishing; restarting them (%d)", crashed["restarts"])
                    backend.bootstrap(backend.nodes())

            def on_tick(result) -> None:
                pump(result)
                restart_crashed()
                if time.time() - shown["t"] > 5:
                    shown["t"] = time.time()
                    progress = f"step {result.step}/{result.total_steps}" if result.step is not None else "starting"
                    console.print(f"[{time.strftime('%H:%M:%S')}] {spec.name}: market {result.market or 'none'}, "
                                  f"{result.nodes_up}/{spec.nodes} up, {progress}, policy {result.decision or '-'}")

            stop = threading.Event()
            if injector:
                injector.start()
            console.print(f"training [bold]{spec.name}[/bold] on {spec.cloud} ({spec.nodes} nodes, policy "
                          f"{policy.name}" + (f", time scale {scale:g}x" if local else "") + ")")
            try:
                result = watcher.run(stop, on_tick=on_tick)
            except KeyboardInterrupt:
                if local:
                    console.print(f"interrupted: the trainers save and stop (up to {backend.save_grace_s:g} s; "
                                  "Ctrl-C again kills them)")
                _interrupted(ledger, wall_start, injector, backend, local)
                console.print("interrupted: `kit train` again continues from the ledger "
                              f"({deploy_dir / LEDGER_FILE})")
                raise
            except BaseException:  # the loop failed, not the trainers: they still save what they have
                _interrupted(ledger, wall_start, injector, backend, local)
                raise
            # done: let the trainers finish writing, then the report and tear-down
            if local:
                deadline = time.time() + 60
                while time.time() < deadline and any(backend.trainer_exit(r) is None for r in list(backend.procs)):
                    time.sleep(0.2)
            pump(result, force=True)
            if injector:
                injector.close()
            progress = ledger.latest_progress() or {}
            params_sha256 = ledger.get_meta("params_sha256")
            # Export the final checkpoint while the nodes are still up (and billed: the report's
            # cost includes it); the data disks are deleted only once that export has been
            # verified against the trainer's final digest (and not with --keep-disks).
            export_dir = deploy_dir / "export"
            export, why_kept = None, None
            try:
                manifest = export_final(backend, backend.nodes(), export_dir, step=progress.get("total_steps"),
                                        params_sha256=params_sha256, console=console)
                export = manifest["path"]
                if not params_sha256:  # training.export checks the digest only when it is given one
                    why_kept = ("the trainer reported no final params_sha256, so nothing vouches for the "
                                "exported parameters")
            except KitError as error:
                why_kept = error.what + (f" ({error.fix})" if error.fix else "")
            if why_kept:
                console.print(f"[yellow]warning:[/yellow] {why_kept}; the data disks are kept")
            delete_disks = export is not None and why_kept is None and not keep_disks
            backend.destroy(keep_disks=not delete_disks)
            now = clock()
            ledger.release_nodes(now)
            wall = float(ledger.get_meta("wall_seconds_done") or 0) + (time.time() - wall_start)
            ledger.set_meta("wall_seconds_done", repr(wall))
            status = status_report(ledger, spec, now=now)
            final = cost_of(ledger, spec, now, steps=progress.get("total_steps"), finished=True)
            report = {
                "cluster": spec.name, "cloud": spec.cloud, "policy": policy.name,
                "time_scale": scale,
                "preemptions": status["preemptions"], "market_switches": status["market_switches"],
                "spot_hours": status["spot_hours"], "on_demand_hours": status["on_demand_hours"],
                "cost": status["cost"],
                # The same job all on-demand: nodes x on-demand price x (the first launch's
                # start-up + total steps x median step time + the final export), the simulator's
                # baseline N x Q x (d + C0) measured on this run (kit/watch/status.py).
                "cost_on_demand": final["cost_all_on_demand"], "compute_hours": final["compute_hours"],
                "startup_hours": final["startup_hours"], "startup_measured": final["startup_measured"],
                "finish_hours": final["finish_hours"],
                "steps": progress.get("step"), "total_steps": progress.get("total_steps"),
                "steps_lost": steps_lost(ledger), "wall_seconds": round(wall, 2),
                "params_sha256": params_sha256,
                "nodes_lost": status["nodes_lost"], "capacity_errors": status["capacity_errors"],
                "export": export, "disks": "deleted" if delete_disks else "kept",
            }
            render_report(report, console)
            write_report(deploy_dir / REPORT_FILE, report)  # what a later `kit train` of this spec shows
            if json_report:
                write_report(Path(json_report), report)
            if plot:
                from kit.report import plot_run

                plot_run(ledger, spec, Path(plot), scale=scale)
            ledger.set_meta("finished", "1")
            return report


def write_report(path: Path, report: dict) -> None:
    from training.stop import write_atomic

    write_atomic(path, json.dumps(report, indent=2, sort_keys=True) + "\n")


def show_finished(deploy_dir: Path, console, json_report: Path | None) -> dict:
    """The job of this spec already finished: print its report (and write it where asked) instead of
    training again; ``--fresh`` starts a new run."""
    from kit.watch.commands import LEDGER_FILE

    try:
        report = json.loads((deploy_dir / REPORT_FILE).read_text())
    except (OSError, ValueError):
        report = None
    console.print(f"this job already finished; `kit train --fresh` trains it again (the finished run is kept "
                  f"under {deploy_dir / PREVIOUS_DIR}/)")
    if report is None:  # finished by a kit that kept no report
        console.print(f"its report was not saved; `kit status` shows the ledger ({deploy_dir / LEDGER_FILE})")
        return {}
    render_report(report, console)
    if json_report:
        write_report(Path(json_report), report)
    return report


def archive_finished(deploy_dir: Path, console) -> Path:
    """Move a finished run's ledger, report and export to ``previous/<stamp>/``, so that a fresh run
    starts clean and never mistakes the old export for its own. Refused while the old run's data
    disks were kept: the new run would resume from their final checkpoint instead of starting over."""
    from kit.watch.commands import LEDGER_FILE

    try:
        disks = json.loads((deploy_dir / REPORT_FILE).read_text()).get("disks")
    except (OSError, ValueError):
        disks = None
    if disks == "kept":
        raise InputError("the finished run kept its data disks, so a fresh run would resume from their final "
                         "checkpoint instead of starting over", where=str(deploy_dir / REPORT_FILE),
                         fix="delete the disks first (`kit destroy SPEC --with-disks`; local nodes' disks are "
                             f"{deploy_dir / 'local' / 'disks'}), or run without --fresh to see the report")
    stamp = time.strftime("%Y%m%d-%H%M%S")
    target = deploy_dir / PREVIOUS_DIR / stamp
    n = 1
    while target.exists():
        n += 1
        target = deploy_dir / PREVIOUS_DIR / f"{stamp}-{n}"
    target.mkdir(parents=True)
    for name in (LEDGER_FILE, LEDGER_FILE + "-wal", LEDGER_FILE + "-shm", REPORT_FILE, "export"):
        if (deploy_dir / name).exists():
            (deploy_dir / name).rename(target / name)
    kept = target / REPORT_FILE
    if kept.exists():  # the report names its export where it now is
        report = json.loads(kept.read_text())
        if report.get("export"):
            report["export"] = report["export"].replace(str(deploy_dir / "export"), str(target / "export"), 1)
            write_report(kept, report)
    console.print(f"starting a fresh run; the finished one is kept in {target}")
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
                              log=lambda message: console.print(f"[yellow]{message}[/yellow]"))
            console.print(f"exported step {manifest['step']} from {node.name} to {manifest['path']}")
            return manifest
        except (KitError, ExportError, OSError) as error:
            failures.append(f"{node.name}: {getattr(error, 'what', None) or error}")
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
    raise KitError("the final checkpoint could not be exported: " + "; ".join(failures), where=str(dest),
                   fix="the data disks keep it; export it with `python -m training.export CKPT_DIR OUT` from a node")


def _interrupted(ledger, wall_start, injector, backend, local) -> None:
    if injector:
        injector.close()
    if local and backend is not None:  # the trainers save first (stop files), then the nodes stop
        backend.stop_all(grace_s=backend.save_grace_s)
    wall = float(ledger.get_meta("wall_seconds_done") or 0) + (time.time() - wall_start)
    ledger.set_meta("wall_seconds_done", repr(wall))


def render_report(report: dict, console) -> None:
    from rich.table import Table

    money = lambda v: "?" if v is None else f"${v:,.2f}"
    table = Table(title=f"kit train {report['cluster']} ({report['cloud']}, policy {report['policy']})",
                  title_justify="left")
    table.add_column("")
    table.add_column("value", justify="right")
    rows = [("steps", f"{report['steps']}/{report['total_steps']}"), ("steps lost", str(report["steps_lost"])),
            ("preemptions", str(report["preemptions"])), ("market switches", str(report["market_switches"])),
            ("spot node-hours", f"{report['spot_hours']:.2f}"), ("on-demand node-hours", f"{report['on_demand_hours']:.2f}"),
            ("cost", money(report["cost"])), ("same job all on-demand", money(report["cost_on_demand"])),
            ("wall time", f"{report['wall_seconds']:.1f} s"), ("params_sha256", str(report["params_sha256"])[:16] + "…")]
    if "disks" in report:
        rows.append(("final checkpoint", str(report.get("export") or "not exported")))
        rows.append(("data disks", report["disks"]))
    for key, value in rows:
        table.add_row(key, value)
    console.print(table)
    if report["cloud"] == "local":
        console.print(f"(local hours are trace hours: wall time × time scale {report['time_scale']:g})")
