"""A Ray cluster of network namespaces on this one machine, joined by bandwidth-capped links.

    python benchmarks/netcluster.py --nodes head ps trainer --gbps 1 -- \\
        python -m doc2vec_dist train --corpus C --out M --num-ps 2 --num-workers 1
    python benchmarks/netcluster.py --nodes head+ps trainer trainer --gbps 0.1 --json run.json -- \\
        python jobs/train.py --config jobs/configs/multinode.yaml --corpus /tmp/c --out /tmp/m
    python benchmarks/netcluster.py --sweep   # what a killed (SIGKILL) run left: its namespaces and processes

Every node is a network namespace of its own with one address, 10.213.0.N/24, on a veth pair whose
other end sits on a bridge in one more namespace (the switch). Nothing is created in the machine's
own namespace and no namespace has a default route, so the nodes reach each other and nothing else,
and no name of ours can clash with the machine's or another run's interfaces. Each link is capped
with tc's `tbf` in both directions (the node's end and the switch's end): one direction is what a
machine's network card sends, the other what it receives. `netem` does not exist on these kernels,
so no delay is added: every link here has a namespace's sub-millisecond latency, lower than any real
network's. Figures taken here are bandwidth-bound, never latency-bound.

Each node runs `ray start --block` inside its namespace (`ip netns exec`), in a process group of its
own, with its namespace's address as --node-ip-address and the resources deploy/ gives its role: the
head (no CPU, no custom resource; it runs the job's driver), `ps` (parameter servers, `memory` to
pack them by) and `trainer` (workers, their CPUs). A node may hold several roles (`head+ps`). Token
auth is on, with a token made for the run. Nodes start one at a time (two raylets starting at once
on a 2-core machine time out). The job is submitted with `ray job submit`, from inside the head's
namespace, as a user would.

Teardown removes exactly what the run made: every process inside its namespaces (`ip netns pids`:
a node is "killed" the same way), then the namespaces themselves, which takes their links and the
bridge with them. It runs on a normal exit, an exception, Ctrl-C, SIGTERM and at interpreter exit;
a run killed outright (SIGKILL) leaves its namespaces, named after its process id, for the next run
(or `--sweep`) to remove once that process is gone. Never `ray stop`, never a kill by name.

Link byte counters (the node's end, from the kernel: what `ip -s link` shows) are read before and
after the job: the bytes each node sent and received.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import dataclasses
import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from typing import Self

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RAY = os.path.join(os.path.dirname(sys.executable), "ray")
PREFIX = "d2vnc"  # every namespace of ours: d2vnc-<pid of the process that made it>-<run>-<node>
SUBNET = "10.213.0"  # only inside our namespaces: they have no route to any other network
MiB = 1 << 20
GCS_PORT, DASHBOARD_PORT = 6379, 8265  # each namespace has its own ports: Ray's defaults never clash
ROLES = ("head", "ps", "trainer")
NODE_START_SECONDS = 120


class NetClusterError(RuntimeError):
    """The cluster could not be made or started (no root, a node that did not come up)."""


def _run(args: list[str], check: bool = True, timeout: float = 60) -> subprocess.CompletedProcess:
    done = subprocess.run(args, capture_output=True, text=True, timeout=timeout, check=False)
    if check and done.returncode != 0:
        raise NetClusterError(f"{' '.join(args)}: {(done.stderr or done.stdout).strip()}")
    return done


def available() -> str | None:
    """Why namespaces cannot be made here (not root, no `ip`/`tc`), or None when they can."""
    if os.geteuid() != 0:
        return "network namespaces need root (CI runs as root)"
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            return f"`{tool}` (iproute2) is not installed"
    probe = f"{PREFIX}-{os.getpid()}-probe{secrets.token_hex(2)}"
    made = _run(["ip", "netns", "add", probe], check=False)
    if made.returncode != 0:
        return f"`ip netns add` failed: {made.stderr.strip()}"
    _run(["ip", "netns", "delete", probe], check=False)
    return None


def netns_pids(netns: str) -> list[int]:
    """Every process inside the namespace (`ip netns pids`)."""
    done = _run(["ip", "netns", "pids", netns], check=False)
    return [int(p) for p in done.stdout.split() if p.isdigit()] if done.returncode == 0 else []


def kill_netns_processes(netns: str, within: float = 30.0) -> None:
    """SIGKILL every process inside the namespace until none is left (or `within` seconds pass)."""
    deadline = time.monotonic() + within
    while True:
        pids = [p for p in netns_pids(netns) if p != os.getpid()]
        if not pids or time.monotonic() > deadline:
            return
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.2)


def our_namespaces() -> list[str]:
    done = _run(["ip", "netns", "list"], check=False)
    return [line.split()[0] for line in done.stdout.splitlines() if line.startswith(PREFIX + "-")]


def sweep(quiet: bool = False) -> list[str]:
    """Remove the namespaces (and every process inside them) of runs whose process is gone: what a run
    killed outright left. Another run's, whose process still lives, are never touched."""
    removed = []
    for netns in our_namespaces():
        m = re.match(rf"{PREFIX}-(\d+)-", netns)
        if not m or os.path.exists(f"/proc/{m.group(1)}"):
            continue
        kill_netns_processes(netns)
        if _run(["ip", "netns", "delete", netns], check=False).returncode == 0:
            removed.append(netns)
    if removed and not quiet:
        print(f"netcluster: removed {len(removed)} namespace(s) of runs that were killed: {', '.join(removed)}",
              file=sys.stderr)
    return removed


@dataclasses.dataclass
class Node:
    name: str
    roles: tuple[str, ...]
    index: int  # its address is SUBNET.(index + 1), its switch port p<index>
    netns: str
    gbps: float | None
    proc: subprocess.Popen | None = None
    log: str = ""

    @property
    def address(self) -> str:
        return f"{SUBNET}.{self.index + 1}"

    @property
    def port(self) -> str:
        return f"p{self.index}"


def tbf_args(gbps: float) -> list[str]:
    """tc's tbf for a rate: a bucket of at least 4 ms of the rate (the kernel's timer can refill no
    finer) and 64 KiB (a veth hands over segments up to that size), a queue of 50 ms."""
    rate = gbps * 1e9 / 8
    burst = max(int(rate * 0.004), 64 * 1024)
    return ["tbf", "rate", f"{int(gbps * 1e9)}bit", "burst", str(burst), "latency", "50ms"]


class NetCluster:
    """The cluster: nodes (each "head", "ps", "trainer" or roles joined by "+", the head first), each
    on a link of `gbps` Gbit/s (None: uncapped; `link_gbps` overrides it per node name)."""

    def __init__(self, nodes: list[str], gbps: float | None = None, *, link_gbps: dict[str, float | None] | None = None,
                 ps_units: int = 2, ps_memory: int = 4096 * MiB, trainer_units: int = 2, trainer_cpus: int = 2,
                 object_store: int = 256 * MiB, env: dict | None = None, ray: bool = True):
        specs = [tuple(spec.split("+")) for spec in nodes]
        for roles in specs:
            if not roles or any(r not in ROLES for r in roles):
                raise NetClusterError(f"node {'+'.join(roles)!r}: roles are {', '.join(ROLES)} (joined by +)")
        if not specs or "head" not in specs[0] or any("head" in r for r in specs[1:]):
            raise NetClusterError("the first node, and only it, is the head (e.g. --nodes head ps trainer)")
        self.run_id = f"{PREFIX}-{os.getpid()}-{secrets.token_hex(2)}"
        self.switch = f"{self.run_id}-sw"
        counts: dict[str, int] = {}
        self.nodes: list[Node] = []
        for i, roles in enumerate(specs):
            base = "+".join(roles)
            counts[base] = counts.get(base, 0) + 1
            name = base if sum(s == roles for s in specs) == 1 else f"{base}{counts[base]}"
            gbps_here = (link_gbps or {}).get(name, gbps)
            self.nodes.append(Node(name, roles, i, f"{self.run_id}-{name.replace('+', '_')}", gbps_here))
        self.ps_units, self.ps_memory = ps_units, ps_memory
        self.trainer_units, self.trainer_cpus = trainer_units, trainer_cpus
        self.object_store = object_store
        self.with_ray = ray  # False: the namespaces and links alone
        self.token = secrets.token_hex(16)
        self.env = {**(env or os.environ), "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": self.token,
                    # a job's `python` is the first on the PATH of the node that runs it: this interpreter's
                    "PATH": os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", "")}
        self.env.pop("RAY_ADDRESS", None)
        self.temp_root = ""
        self.made: list[str] = []  # namespaces made, in order
        self.jobs: list[subprocess.Popen] = []
        self._closed = False

    # -- lifecycle -------------------------------------------------------------------------------
    def __enter__(self) -> Self:
        try:
            self.start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @property
    def head(self) -> Node:
        return self.nodes[0]

    def node(self, name: str) -> Node:
        for n in self.nodes:
            if n.name == name:
                return n
        raise KeyError(f"no node {name!r} (nodes: {', '.join(n.name for n in self.nodes)})")

    def start(self) -> None:
        """Namespaces, links, then (unless ray=False) the Ray nodes one at a time; returns once every
        node is alive."""
        why = available()
        if why:
            raise NetClusterError(why)
        sweep()
        atexit.register(self.close)
        self.temp_root = tempfile.mkdtemp(prefix=PREFIX, dir="/tmp")  # short: Ray's socket paths fit 107 bytes
        self._add_netns(self.switch)
        _run(["ip", "-n", self.switch, "link", "add", "br0", "type", "bridge"])
        _run(["ip", "-n", self.switch, "link", "set", "br0", "up"])
        for node in self.nodes:
            self._add_netns(node.netns)
            _run(["ip", "-n", self.switch, "link", "add", node.port, "type", "veth", "peer", "name", "eth0",
                  "netns", node.netns])
            _run(["ip", "-n", self.switch, "link", "set", node.port, "master", "br0", "up"])
            _run(["ip", "-n", node.netns, "addr", "add", f"{node.address}/24", "dev", "eth0"])
            for dev in ("lo", "eth0"):
                _run(["ip", "-n", node.netns, "link", "set", dev, "up"])
            self.cap(node.name, node.gbps)
        for node in self.nodes if self.with_ray else []:
            self.start_node(node.name)

    def _add_netns(self, netns: str) -> None:
        _run(["ip", "netns", "add", netns])
        self.made.append(netns)

    def cap(self, name: str, gbps: float | None) -> None:
        """Cap the node's link at `gbps` both ways (None: uncapped)."""
        node = self.node(name)
        for netns, dev in ((node.netns, "eth0"), (self.switch, node.port)):
            _run(["tc", "-n", netns, "qdisc", "del", "dev", dev, "root"], check=False)
            if gbps:
                _run(["tc", "-n", netns, "qdisc", "add", "dev", dev, "root", *tbf_args(gbps)])
        node.gbps = gbps

    def close(self) -> None:
        """Kill every process in our namespaces, then delete the namespaces (links and bridge go with
        them) and the nodes' temp dirs. Idempotent; Ctrl-C cannot cut it short."""
        if self._closed:
            return
        self._closed = True
        previous = None
        with contextlib.suppress(ValueError):  # off the main thread: no handler to swap
            previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
        try:
            for netns in reversed(self.made):
                kill_netns_processes(netns)
            for proc in [n.proc for n in self.nodes if n.proc] + self.jobs:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(timeout=10)
            for netns in reversed(self.made):
                _run(["ip", "netns", "delete", netns], check=False)
            if self.temp_root:
                shutil.rmtree(self.temp_root, ignore_errors=True)
        finally:
            if previous is not None:
                signal.signal(signal.SIGINT, previous)
            atexit.unregister(self.close)

    # -- nodes -------------------------------------------------------------------------------------
    def _ray_start_args(self, node: Node) -> list[str]:
        resources: dict[str, int] = {}
        cpus = 0
        args = ["start", "--block", "--disable-usage-stats", "--node-ip-address", node.address,
                "--object-store-memory", str(self.object_store),
                "--temp-dir", os.path.join(self.temp_root, node.name.replace("+", "_"))]
        if "head" in node.roles:
            args += ["--head", "--port", str(GCS_PORT), "--dashboard-host", "127.0.0.1",
                     "--dashboard-port", str(DASHBOARD_PORT)]
        else:
            args += ["--address", f"{self.head.address}:{GCS_PORT}"]
        if "ps" in node.roles:
            resources["ps"] = self.ps_units
            args += ["--memory", str(self.ps_memory)]
        if "trainer" in node.roles:
            resources["trainer"] = self.trainer_units
            cpus = self.trainer_cpus
        args += ["--num-cpus", str(cpus)]
        if resources:
            args += ["--resources", json.dumps(resources)]
        return args

    def start_node(self, name: str) -> None:
        """Start the node's Ray (again, after kill_node: a fresh node at the same address) and wait
        until it has joined."""
        node = self.node(name)
        node.log = os.path.join(self.temp_root, f"{node.name.replace('+', '_')}.log")
        before = self.alive_nodes() if "head" not in node.roles else []
        with open(node.log, "a") as log:  # the child keeps its own copy
            node.proc = subprocess.Popen(["ip", "netns", "exec", node.netns, RAY, *self._ray_start_args(node)],
                                         env=self.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + NODE_START_SECONDS
        while True:
            if node.proc.poll() is not None:
                raise NetClusterError(f"node {name} stopped while starting:\n{self.log_tail(name)}")
            if time.monotonic() > deadline:
                raise NetClusterError(f"node {name} did not join within {NODE_START_SECONDS}s:\n{self.log_tail(name)}")
            if "head" in node.roles:
                if self.ray(["job", "list", "--address", self.dashboard]).returncode == 0:
                    return
            elif any(n["node_ip"] == node.address and n["state"] == "ALIVE" and n["node_id"] not in
                     {b["node_id"] for b in before} for n in self.alive_nodes()):
                return
            time.sleep(1)

    def kill_node(self, name: str) -> None:
        """The node's machine gone: SIGKILL every process in its namespace (its raylet, its actors,
        a driver there). Its link stays up; nothing answers at its address."""
        node = self.node(name)
        kill_netns_processes(node.netns)
        if node.proc is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                node.proc.wait(timeout=10)

    def link(self, name: str, up: bool) -> None:
        """Take the node's link down or up at the switch (a cable pulled, plugged back)."""
        _run(["ip", "-n", self.switch, "link", "set", self.node(name).port, "up" if up else "down"])

    def log_tail(self, name: str, chars: int = 3000) -> str:
        with contextlib.suppress(OSError), open(self.node(name).log) as fh:
            return fh.read()[-chars:]
        return "(no log)"

    # -- what runs there ---------------------------------------------------------------------------
    @property
    def dashboard(self) -> str:
        """The job API's address, inside the head's namespace."""
        return f"http://127.0.0.1:{DASHBOARD_PORT}"

    def popen(self, name: str, args: list[str], **kwargs) -> subprocess.Popen:
        """A process inside the node's namespace, with the cluster's environment (token, PATH)."""
        return subprocess.Popen(["ip", "netns", "exec", self.node(name).netns, *args],
                                env=kwargs.pop("env", self.env), **kwargs)

    def ray(self, args: list[str], timeout: float = 60) -> subprocess.CompletedProcess:
        """The `ray` command line, in the head's namespace."""
        return subprocess.run(["ip", "netns", "exec", self.head.netns, RAY, *args], env=self.env,
                              capture_output=True, text=True, timeout=timeout, check=False)

    def state(self, kind: str) -> list[dict]:
        """`ray list KIND` (nodes, actors, jobs) from Ray's state API, as dicts; [] when it does not answer."""
        done = self.ray(["list", kind, "--address", self.dashboard, "--format", "json", "--detail", "--limit", "1000"])
        if done.returncode != 0:
            return []
        try:
            return json.loads(done.stdout)
        except json.JSONDecodeError:  # "No resource in the cluster"
            return []

    def alive_nodes(self) -> list[dict]:
        return [n for n in self.state("nodes") if n.get("state") == "ALIVE"]

    def submit(self, entrypoint: list[str], working_dir: str | None = ROOT, submission_id: str | None = None,
               output=None) -> subprocess.Popen:
        """`ray job submit` of `entrypoint` (it waits for the job and streams its log to `output`, a
        file; its exit status is the job's: 0 succeeded, 1 failed). Returns at once."""
        args = [RAY, "job", "submit", "--address", self.dashboard]
        if working_dir:
            args += ["--working-dir", working_dir]
        if submission_id:
            args += ["--submission-id", submission_id]
        proc = self.popen(self.head.name, [*args, "--", *entrypoint], stdout=output, stderr=subprocess.STDOUT,
                          start_new_session=True)
        self.jobs.append(proc)
        return proc

    def run_job(self, entrypoint: list[str], log_path: str, timeout: float | None = None,
                working_dir: str | None = ROOT) -> tuple[int, str]:
        """Submit and wait; (exit status, the job's log). A submit that comes before the head's agent
        can take jobs ("No available agent") is retried."""
        for _ in range(15):
            with open(log_path, "w") as out:
                proc = self.submit(entrypoint, working_dir=working_dir, output=out)
                rc = proc.wait(timeout=timeout)
            with open(log_path) as fh:
                text = fh.read()
            if "No available agent" not in text:
                return rc, text
            time.sleep(2)
        return rc, text

    def driver_pids(self, marker: str) -> list[int]:
        """The job drivers in the head's namespace whose command line holds `marker` (a path unique to
        the job): what "the head's driver killed" kills."""
        found = []
        for pid in netns_pids(self.head.netns):
            with contextlib.suppress(OSError), open(f"/proc/{pid}/cmdline", "rb") as fh:
                argv = fh.read().split(b"\0")
                if marker.encode() in b" ".join(argv) and not any(b"ray" == os.path.basename(a) for a in argv[:2]):
                    found.append(pid)
        return found

    def counters(self) -> dict[str, dict[str, int]]:
        """Each node's link counters at its own end (what `ip -s link` shows): bytes sent and received."""
        found = {}
        for node in self.nodes:
            done = _run(["ip", "-n", node.netns, "-s", "-j", "link", "show", "dev", "eth0"])
            stats = json.loads(done.stdout)[0]["stats64"]
            found[node.name] = {"tx_bytes": stats["tx"]["bytes"], "rx_bytes": stats["rx"]["bytes"]}
        return found

    def describe(self) -> str:
        return "\n".join(f"  {n.name:10s} {n.address:12s} netns {n.netns}, link "
                         + (f"{n.gbps:g} Gbit/s" if n.gbps else "uncapped") for n in self.nodes)


def traffic(before: dict, after: dict) -> dict[str, dict[str, int]]:
    """Bytes each node sent and received between two counters() readings."""
    return {name: {k: after[name][k] - before[name][k] for k in after[name]} for name in after}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", nargs="+", default=["head", "ps", "trainer"],
                    help="one entry per node, the head first: head, ps, trainer, or roles joined by + (default: "
                         "head ps trainer)")
    ap.add_argument("--gbps", type=float, default=None, help="cap every link at this many Gbit/s (default: uncapped)")
    ap.add_argument("--ps-units", type=int, default=2, help="`ps` resource of each ps node (servers it hosts)")
    ap.add_argument("--ps-memory-gib", type=float, default=4.0, help="Ray `memory` of each ps node, GiB")
    ap.add_argument("--trainer-units", type=int, default=2, help="`trainer` resource of each trainer node (workers)")
    ap.add_argument("--trainer-cpus", type=int, default=2, help="CPUs of each trainer node")
    ap.add_argument("--object-store-mib", type=int, default=256, help="object store of each node, MiB")
    ap.add_argument("--working-dir", default=ROOT, help="the job's --working-dir (default: this checkout)")
    ap.add_argument("--json", help="write the nodes, the job's status and seconds and each link's bytes here")
    ap.add_argument("--sweep", action="store_true", help="only remove what killed runs left, then exit")
    ap.add_argument("--no-ray", action="store_true",
                    help="the namespaces and links alone: run the command in the head's namespace (to check the "
                         "network: reach another node's address, time a transfer)")
    ap.add_argument("entrypoint", nargs=argparse.REMAINDER, help="-- the job's command")
    args = ap.parse_args(argv)
    entrypoint = args.entrypoint[1:] if args.entrypoint[:1] == ["--"] else args.entrypoint
    if args.sweep:
        sweep()
        return 0
    if not entrypoint:
        ap.error("give the job's command after --")

    def stop(signum, frame):  # SIGTERM, SIGHUP: unwind through the teardown, as Ctrl-C does
        raise KeyboardInterrupt

    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, stop)
    try:
        cluster = NetCluster(args.nodes, args.gbps, ps_units=args.ps_units,
                             ps_memory=int(args.ps_memory_gib * 1024) * MiB, trainer_units=args.trainer_units,
                             trainer_cpus=args.trainer_cpus, object_store=args.object_store_mib * MiB,
                             ray=not args.no_ray)
        t0 = time.monotonic()
        with cluster:
            print(f"netcluster: {len(cluster.nodes)} nodes up in {time.monotonic() - t0:.1f}s\n{cluster.describe()}",
                  file=sys.stderr)
            before = cluster.counters()
            t_job = time.monotonic()
            log_path = os.path.join(cluster.temp_root, "job.log")
            with open(log_path, "w") as out:  # streamed to the terminal as it comes
                if args.no_ray:
                    job = cluster.popen(cluster.head.name, entrypoint, stdout=out, stderr=subprocess.STDOUT,
                                        start_new_session=True)
                    cluster.jobs.append(job)
                else:
                    job = cluster.submit(entrypoint, working_dir=args.working_dir, output=out)
                with open(log_path) as reader:
                    while job.poll() is None:
                        sys.stdout.write(reader.read())
                        sys.stdout.flush()
                        time.sleep(0.5)
                    sys.stdout.write(reader.read())
            seconds = time.monotonic() - t_job
            moved = traffic(before, cluster.counters())
        for name, t in moved.items():
            print(f"netcluster: {name:10s} sent {t['tx_bytes'] / 1e6:10.2f} MB, received {t['rx_bytes'] / 1e6:10.2f} MB",
                  file=sys.stderr)
        print(f"netcluster: job {'succeeded' if job.returncode == 0 else 'failed'} in {seconds:.1f}s", file=sys.stderr)
        if args.json:
            with open(args.json, "w") as fh:
                json.dump({"nodes": [{"name": n.name, "roles": list(n.roles), "address": n.address, "gbps": n.gbps}
                                     for n in cluster.nodes], "entrypoint": entrypoint,
                           "status": "SUCCEEDED" if job.returncode == 0 else "FAILED", "seconds": seconds,
                           "links": moved}, fh, indent=2)
        return job.returncode
    except NetClusterError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("netcluster: interrupted; every namespace and process of this run removed", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
