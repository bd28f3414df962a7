#!/usr/bin/python3
"""A stand-in for systemd on the EC2 test hosts (tests/support/ec2_hosts.py), run by the host's own
Debian python3. The hosts are chroots in their own PID namespace, where the real systemd cannot run;
kit's roles install systemd units and start them with ``ansible.builtin.systemd_service``, so the
hosts need something that does what systemd does with those units. One file, three parts:

* ``systemd`` (the file's name on the host): PID 1. Starts ``sshd -D``, reaps orphans, and on SIGTERM
  (a shutdown) stops every running unit (as systemd does before power-off), then exits, which ends the
  PID namespace. The kernel names PID 1 after this file, so Ansible's ``service_mgr`` fact is
  ``systemd`` (ansible/module_utils/facts/system/service_mgr.py reads /proc/1/comm).
* ``systemctl`` (a symlink): ``daemon-reload``, ``show``, ``is-active``, ``is-enabled``,
  ``list-unit-files``, ``enable``, ``disable``, ``start``, ``stop``, ``restart`` — what
  ``systemd_service`` calls (ansible/modules/systemd_service.py).
* ``systemd --unit NAME``: one unit's supervisor, following systemd.service(5) and systemd.kill(5) for
  the settings kit's units use: ``ExecStart``, ``EnvironmentFile``, ``Environment``,
  ``RuntimeDirectory``, ``Restart`` (no / on-failure / always), ``RestartSec``,
  ``RestartForceExitStatus``, ``RestartPreventExitStatus``, ``KillMode`` (mixed / control-group),
  ``KillSignal``, ``TimeoutStopSec``. The service starts with systemd's clean environment; its output
  goes to /var/log/fake-systemd/NAME.log. Not modelled: ordering (After/Before), RequiresMountsFor,
  Type other than simple.
* At boot, what a host's earlier life left (a GCE VM stopped and started again keeps its boot disk):
  the file systems of /etc/fstab are mounted (``mount -a``, local-fs.target), then the enabled units
  are started (multi-user.target.wants), mounts first as RequiresMountsFor would order them. A host
  booted from a fresh image has neither.
"""
import json
import os
import shlex
import signal
import subprocess
import sys
import time

UNIT_DIR = "/etc/systemd/system"
WANTS = os.path.join(UNIT_DIR, "multi-user.target.wants")
STATE = "/run/fake-systemd"
LOGS = "/var/log/fake-systemd"
CLEAN_SIGNALS = (signal.SIGHUP, signal.SIGINT, signal.SIGTERM, signal.SIGPIPE)  # systemd.service(5), Restart=
PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def unit_name(arg):
    name = arg.strip("'")
    return name if name.endswith(".service") else name + ".service"


def load(unit):
    """The unit file's [Service] settings (the last value of a key wins, as systemd's do for these)."""
    settings, section = {}, None
    with open(os.path.join(UNIT_DIR, unit)) as f:
        for raw in f:
            line = raw.strip()
            if not line or line[0] in "#;":
                continue
            if line.startswith("["):
                section = line.strip("[]")
            elif section == "Service" and "=" in line:
                key, value = line.split("=", 1)
                settings.setdefault(key.strip(), []).append(value.strip())
    return {k: v[-1] for k, v in settings.items()}, settings


def env_file(path):
    env = {}
    with open(path) as f:
        for line in f:
            line = line.strip()
            if line and not line.startswith("#") and "=" in line:
                key, value = line.split("=", 1)
                parts = shlex.split(value) if value else [""]
                env[key.strip()] = " ".join(parts)
    return env


def state(unit):
    try:
        with open(os.path.join(STATE, unit + ".json")) as f:
            data = json.load(f)
    except (OSError, ValueError):
        return {"active": "inactive"}
    if not alive(data.get("supervisor", 0)):
        return {"active": "failed" if data.get("active") == "failed" else "inactive"}
    return data


def save(unit, **data):
    os.makedirs(STATE, exist_ok=True)
    tmp = os.path.join(STATE, unit + ".tmp")
    with open(tmp, "w") as f:
        json.dump(data, f)
    os.replace(tmp, os.path.join(STATE, unit + ".json"))


def alive(pid):
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def codes(text):
    return {int(c) for c in (text or "").split() if c.isdigit()}


# ------------------------------------------------------------------ the supervisor of one unit
class Supervisor:
    def __init__(self, unit):
        self.unit = unit
        self.s, self.all = load(unit)
        self.stopping = False
        self.main = None

    def environment(self):
        env = {"PATH": PATH, "LANG": "C.UTF-8", "HOME": "/root"}
        for value in self.all.get("Environment", []):
            for item in shlex.split(value):
                key, _, val = item.partition("=")
                env[key] = val
        if self.s.get("EnvironmentFile"):
            path = self.s["EnvironmentFile"]
            optional = path.startswith("-")
            if not optional or os.path.exists(path.lstrip("-")):
                env.update(env_file(path.lstrip("-")))
        return env

    def on_stop(self, *_):
        self.stopping = True
        if self.main is not None and self.main.poll() is None:
            sig = getattr(signal, self.s.get("KillSignal", "SIGTERM"))
            mode = self.s.get("KillMode", "control-group")
            try:
                if mode == "mixed":  # the main process only; the rest when it is gone (or at the timeout)
                    self.main.send_signal(sig)
                else:
                    os.killpg(self.main.pid, sig)
            except ProcessLookupError:
                pass

    def run(self):
        signal.signal(signal.SIGTERM, self.on_stop)
        os.makedirs(LOGS, exist_ok=True)
        for d in (self.s.get("RuntimeDirectory") or "").split():
            os.makedirs(os.path.join("/run", d), exist_ok=True)
        argv = shlex.split(self.s["ExecStart"].lstrip("-@"))
        result = "inactive"
        while not self.stopping:
            with open(os.path.join(LOGS, self.unit + ".log"), "ab") as log:
                self.main = subprocess.Popen(argv, env=self.environment(), stdout=log, stderr=subprocess.STDOUT,
                                             cwd=self.s.get("WorkingDirectory", "/"), start_new_session=True)
            save(self.unit, active="active", supervisor=os.getpid(), main=self.main.pid)
            rc = self.wait_main()
            if self.stopping:
                break
            result = "inactive" if rc == 0 else "failed"
            if not self.restarts(rc):
                break
            save(self.unit, active="activating", supervisor=os.getpid(), main=0)
            deadline = time.time() + float(self.s.get("RestartSec", "0.1").rstrip("s"))
            while time.time() < deadline and not self.stopping:
                time.sleep(0.1)
        save(self.unit, active=result if not self.stopping else "inactive", supervisor=0, main=0)

    def wait_main(self):
        timeout = float(self.s.get("TimeoutStopSec", "90").rstrip("s"))
        stop_seen = None
        while True:
            try:
                rc = self.main.wait(timeout=0.2)
                break
            except subprocess.TimeoutExpired:
                if self.stopping and stop_seen is None:
                    stop_seen = time.time()
                if stop_seen is not None and time.time() - stop_seen > timeout:
                    os.killpg(self.main.pid, signal.SIGKILL)  # systemd: SIGKILL after TimeoutStopSec
        try:
            os.killpg(self.main.pid, signal.SIGKILL)  # what is left of the unit's processes
        except ProcessLookupError:
            pass
        return rc

    def restarts(self, rc):
        code = rc if rc >= 0 else None
        if code is not None and code in codes(self.s.get("RestartPreventExitStatus")):
            return False
        if code is not None and code in codes(self.s.get("RestartForceExitStatus")):
            return True
        policy = self.s.get("Restart", "no")
        if policy == "always":
            return True
        if policy == "on-failure":
            return code != 0 if code is not None else -rc not in CLEAN_SIGNALS
        return False


# ------------------------------------------------------------------ systemctl
def start(unit):
    if state(unit)["active"] in ("active", "activating"):
        return 0
    if not os.path.exists(os.path.join(UNIT_DIR, unit)):
        print(f"Failed to start {unit}: Unit {unit} not found.", file=sys.stderr)
        return 5
    if os.fork() == 0:  # double fork: the supervisor is PID 1's child, not the caller's
        os.setsid()
        if os.fork() == 0:
            devnull = os.open(os.devnull, os.O_RDWR)
            for fd in (0, 1, 2):
                os.dup2(devnull, fd)
            Supervisor(unit).run()
            os._exit(0)
        os._exit(0)
    os.wait()
    deadline = time.time() + 10
    while time.time() < deadline and state(unit)["active"] == "inactive":
        time.sleep(0.05)
    return 0


def stop(unit):
    data = state(unit)
    pid = data.get("supervisor")
    if not pid:
        return 0
    os.kill(pid, signal.SIGTERM)
    settings = load(unit)[0] if os.path.exists(os.path.join(UNIT_DIR, unit)) else {}
    deadline = time.time() + float(settings.get("TimeoutStopSec", "90").rstrip("s")) + 10
    while time.time() < deadline and alive(pid):
        time.sleep(0.1)
    return 0


def show(unit):
    loaded = os.path.exists(os.path.join(UNIT_DIR, unit))
    data = state(unit) if loaded else {"active": "inactive"}
    enabled = os.path.exists(os.path.join(WANTS, unit))
    sub = {"active": "running", "activating": "auto-restart"}.get(data["active"], "dead")
    print(f"Id={unit}\nNames={unit}\nLoadState={'loaded' if loaded else 'not-found'}\nActiveState={data['active']}\n"
          f"SubState={sub}\nMainPID={data.get('main', 0)}\nUnitFileState={'enabled' if enabled else 'disabled'}\n"
          f"FragmentPath={os.path.join(UNIT_DIR, unit) if loaded else ''}")
    return 0


def systemctl(args):
    words = [a for a in args if not a.startswith("-")]
    command, units = words[0], [unit_name(u) for u in words[1:]]
    if command in ("daemon-reload", "daemon-reexec"):
        return 0
    unit = units[0]
    if command in ("show", "is-active", "is-enabled", "list-unit-files"):
        return query(command, unit)
    if command in ("enable", "disable"):
        os.makedirs(WANTS, exist_ok=True)
        link = os.path.join(WANTS, unit)
        if command == "enable" and not os.path.lexists(link):
            os.symlink(os.path.join(UNIT_DIR, unit), link)
        elif command == "disable" and os.path.lexists(link):
            os.unlink(link)
        return 0
    if command == "start":
        return start(unit)
    if command == "stop":
        return stop(unit)
    if command == "restart":
        stop(unit)
        return start(unit)
    print(f"fake systemctl: unsupported command {command}", file=sys.stderr)
    return 1


def query(command, unit):
    if command == "show":
        return show(unit)
    if command == "is-active":
        active = state(unit)["active"]
        print(active)
        # 0 only for an active unit: one waiting to restart is "activating", 3 (systemctl(1), is-active)
        return 0 if active == "active" else 3
    if command == "is-enabled":
        enabled = os.path.exists(os.path.join(WANTS, unit))
        print("enabled" if enabled else "disabled")
        return 0 if enabled else 1
    if command == "list-unit-files":
        pattern = unit.removesuffix(".service").rstrip("*").removesuffix(".service")
        for name in sorted(os.listdir(UNIT_DIR)):
            if name.startswith(pattern) and name.endswith(".service"):
                print(name, "enabled" if os.path.exists(os.path.join(WANTS, name)) else "disabled")
        return 0
    return 1


# ------------------------------------------------------------------ PID 1
def boot_units():
    """local-fs.target, then multi-user.target: fstab's file systems, then the enabled units."""
    with open(os.path.join(LOGS, "boot.log"), "ab") as log:
        subprocess.run(["mount", "-a"], stdout=log, stderr=subprocess.STDOUT, check=False)
    for unit in sorted(os.listdir(WANTS)) if os.path.isdir(WANTS) else []:
        start(unit)


def init():
    shutting_down = []

    def shutdown(*_):
        shutting_down.append(time.time())

    signal.signal(signal.SIGTERM, shutdown)
    os.makedirs("/run/sshd", exist_ok=True)
    os.makedirs("/run/systemd/system", exist_ok=True)  # sd_booted(3)'s canary
    os.makedirs(LOGS, exist_ok=True)
    with open(os.path.join(LOGS, "sshd.log"), "ab") as log:
        sshd = subprocess.Popen(["/usr/sbin/sshd", "-D", "-e", "-o", "UseDNS=no",
                                 "-o", "PermitRootLogin=prohibit-password"], stdout=log, stderr=subprocess.STDOUT)
    boot_units()
    while True:
        if shutting_down:
            units = [n[:-5] for n in os.listdir(STATE) if n.endswith(".json")] if os.path.isdir(STATE) else []
            for unit in units:
                stop(unit)
            return 0
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            pid = 0
        if pid == sshd.pid:
            return 1
        if pid == 0:
            time.sleep(0.2)


if __name__ == "__main__":
    name = os.path.basename(sys.argv[0])
    if name == "systemctl":
        sys.exit(systemctl(sys.argv[1:]))
    if sys.argv[1:2] == ["--unit"]:
        Supervisor(sys.argv[2]).run()
        sys.exit(0)
    sys.exit(init())
