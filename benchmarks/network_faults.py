"""Faults over the network: a training job in a cluster of network namespaces, and a node, a link or
the driver taken away mid-run (issue 28, item 3).

    python benchmarks/network_faults.py --corpus CORPUS --heldout HELDOUT --work DIR --epochs 8 --json faults.json
    python benchmarks/network_faults.py --corpus CORPUS --heldout HELDOUT --work DIR --faults trainer-killed link-flap

Each fault gets a cluster of its own (benchmarks/netcluster.py: one network namespace per node, every link
capped with tc's `tbf` at --gbps) and the same training job, submitted with `ray job submit` as a
user would. Once the job has committed --after-version checkpoints (and --delay seconds more, so the
fault lands mid-epoch), the fault is injected:

  ps-killed       every process of a `ps` node killed (its raylet, the server on it). Nodes: head+ps,
                  ps, trainer: the server on `ps` can be restarted by Ray on head+ps, which has room
                  (ps units and memory for both), from the last checkpoint.
  ps-killed-no-room  the same with one `ps` node (head, ps, trainer): nowhere to restart the server.
  trainer-killed  every process of the trainer node running the worker killed. Nodes: head+ps,
                  trainer, trainer: the worker can be restarted on the other trainer node.
  link-flap       the trainer node's link taken down (at the switch, a cable pulled) for --flap
                  seconds, then up again. Nodes: head+ps, trainer.
  link-cut        the trainer node's link taken down for good. Nodes: head+ps, trainer: the node is
                  cut off with the worker on it, and no other trainer node.
  driver-killed   the job's driver (the `python -m doc2vec_dist train` process in the head's
                  namespace) killed with SIGKILL. Nodes: head+ps, trainer.

A job that stops is resumed with the command its last line names (`--resume`), on the cluster
repaired: the killed node started again (a fresh Ray node at its address), the cut link up and its
node restarted. Per fault: the driver's own lines (errors, restart notices, the resume line), whether
the job finished, whether a resume was needed and whether it finished, recall@10 on the held-out
file (`doc2vec-dist evaluate`) against an undisturbed run of the same settings and seed, and the
committed versions: LATEST when the fault came, when the job ended, at the end. A committed
checkpoint is lost when LATEST goes back, or the final model lacks epochs.

tc's `netem` does not exist on these kernels: the links carry no added delay. Needs root (namespaces,
tc). Before each cluster starts, the script waits while --quiet-lock exists (another measurement
wants the machine quiet). Prints a markdown table; writes JSON with --json.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import signal
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))

import netcluster

JOB_SECONDS = 900  # a job that has not ended by then is recorded as hanging, and its cluster removed


@dataclasses.dataclass(frozen=True)
class Fault:
    name: str
    nodes: tuple[str, ...]  # the cluster (netcluster.NetCluster's node specs)
    what: str  # the fault, as the table names it


FAULTS = {f.name: f for f in [
    Fault("ps-killed", ("head+ps", "ps", "trainer"), "`ps` node killed (all its processes); head+ps has room"),
    Fault("ps-killed-no-room", ("head", "ps", "trainer"), "the only `ps` node killed (all its processes)"),
    Fault("trainer-killed", ("head+ps", "trainer", "trainer"),
          "`trainer` node of the worker killed; a second trainer node is up"),
    Fault("link-flap", ("head+ps", "trainer"), "the trainer's link down for {flap:g} s, then up"),
    Fault("link-cut", ("head+ps", "trainer"), "the trainer's link down for good (no other trainer node)"),
    Fault("driver-killed", ("head+ps", "trainer"), "the job's driver killed (SIGKILL) in the head's namespace"),
]}
BASELINE_NODES = ("head+ps", "trainer")

# The driver's own lines in a job's log (not Ray's, which carry a prefix or a date): its errors and
# warnings, restart notices and the resume line.
DRIVER_LINE = re.compile(r"(error|training stopped|interrupted|warning|worker \d|parameter server|node \S+ (\(\w+\) )?is dead"
                         r"|resumed from|removed checkpoint)")


def driver_lines(log: str) -> list[str]:
    """The driver's own lines, as `ray job submit` streamed them (for a failed job it prints the log's
    end once more, after "Status message", which is left out)."""
    streamed = log.split("Status message:")[0]
    return [line.strip() for line in streamed.splitlines() if DRIVER_LINE.match(line.strip())]


def resume_line(lines: list[str]) -> str | None:
    """The command a stopped run's line says to resume with, or None."""
    for line in lines:
        m = re.search(r"resume with `([^`]+)`", line)
        if m:
            return m.group(1)
    return None


def lost(before: int | None, after: int | None, final: int | None, epochs_done: int | None, epochs: int) -> str:
    """What the run lost of what was committed, as the table says it: LATEST never goes back, and the
    final model has every epoch."""
    problems = []
    if before is not None and (after is None or after < before):
        problems.append(f"LATEST went back from v{before} to {'nothing' if after is None else f'v{after}'}")
    if epochs_done != epochs:
        problems.append(f"the final model has {epochs_done} of {epochs} epochs")
    return "; ".join(problems) or "nothing"


def wait_quiet(lock: str | None) -> None:
    """Wait while `lock` exists: another measurement is taking the machine's speed."""
    told = False
    while lock and os.path.exists(lock):
        if not told:
            print(f"network_faults: waiting while {lock} exists", file=sys.stderr)
            told = True
        time.sleep(10)


def train_args(args, model: str, *extra: str) -> list[str]:
    return ["python", "-m", "doc2vec_dist", "train", "--corpus", args.corpus, "--out", model, "--no-progress",
            "--num-ps", "2", "--num-workers", "1", "--cpus-per-worker", str(args.cpus), "--epochs", str(args.epochs),
            "--checkpoint-every", str(args.checkpoint_every), "--seed", str(args.seed), *args.train_args, *extra]


def resume_args(model: str, corpus: str) -> list[str]:
    return ["python", "-m", "doc2vec_dist", "train", "--corpus", corpus, "--out", model, "--resume", "--no-progress"]


def recall(model: str, heldout: str) -> float | None:
    """recall@10 on the held-out file, through `doc2vec-dist evaluate` (it saves MODEL/eval-heldout.json)."""
    done = subprocess.run([sys.executable, "-m", "doc2vec_dist", "evaluate", "--model", model, "--heldout", heldout,
                           "--no-progress"], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        print(f"network_faults: evaluate {model} failed: {done.stderr.strip()[-500:]}", file=sys.stderr)
        return None
    with open(os.path.join(model, "eval-heldout.json")) as fh:
        return json.load(fh)["model_recall@10"]


def latest(model: str) -> int | None:
    from doc2vec_dist import modeldir

    try:
        return modeldir.latest_version(model)
    except Exception:  # noqa: BLE001 - a model dir still being made
        return None


def epochs_done(model: str) -> int | None:
    from doc2vec_dist import modeldir

    try:
        return int(modeldir.load_manifest(model)[1]["epoch"])
    except Exception:  # noqa: BLE001 - no committed version
        return None


def actor_nodes(cluster: netcluster.NetCluster) -> dict[str, str]:
    """Where the run's live actors are: "worker" / "server" + index -> our node's name."""
    by_ip = {n.address: n.name for n in cluster.nodes}
    ip_of = {n["node_id"]: n["node_ip"] for n in cluster.state("nodes")}
    found = {}
    for actor in cluster.state("actors"):
        if actor.get("state") != "ALIVE":
            continue
        name = actor.get("name") or ""
        m = re.search(r"-ps(\d+)$", name)
        key = f"server{m.group(1)}" if m else "worker" if actor.get("class_name") == "Worker" else None
        node = by_ip.get(ip_of.get(actor.get("node_id"), ""))
        if key and node:
            found[key] = node
    return found


def wait_job(job: subprocess.Popen, seconds: float) -> int | None:
    """The job's exit status, or None if it has not ended within `seconds` (it is left running)."""
    try:
        return job.wait(timeout=seconds)
    except subprocess.TimeoutExpired:
        return None


class Case:
    """One fault's run: its cluster, its job, the fault, the resume."""

    def __init__(self, args, fault: Fault | None):
        self.args, self.fault = args, fault
        self.name = fault.name if fault else "undisturbed"
        self.dir = os.path.join(args.work, self.name)
        self.model = os.path.join(self.dir, "model")
        self.record: dict = {"fault": self.name,
                             "what": fault.what.format(flap=args.flap) if fault else "none",
                             "nodes": list(fault.nodes if fault else BASELINE_NODES)}

    def run(self) -> dict:
        import shutil

        args, rec = self.args, self.record
        shutil.rmtree(self.dir, ignore_errors=True)
        os.makedirs(self.dir)
        wait_quiet(args.quiet_lock)
        t0 = time.monotonic()
        cluster = netcluster.NetCluster(rec["nodes"], args.gbps, ps_memory=3 << 30, object_store=200 << 20,
                                        trainer_cpus=args.cpus)
        with cluster:
            rec["cluster_seconds"] = round(time.monotonic() - t0, 1)
            rec["command"] = train_args(args, self.model)
            log1 = os.path.join(self.dir, "job1.log")
            with open(log1, "w") as out:
                t_job = time.monotonic()
                job = cluster.submit(rec["command"], output=out)
                if self.fault:
                    self.inject(cluster, job)
                rc = wait_job(job, JOB_SECONDS)
                if rc is None:  # a hang: recorded as such; the cluster's teardown ends it
                    rec["hang"] = f"no end within {JOB_SECONDS}s"
                rec["job_seconds"] = round(time.monotonic() - t_job, 1)
            with open(log1) as fh:
                text = fh.read()
            rec.update(read_log(text))
            rec["finished"] = rc == 0
            rec["latest_after"] = latest(self.model)
            if "fault_at" in rec:
                rec["ended_after_fault_seconds"] = round(time.monotonic() - t_job - rec["fault_at"], 1)
            if rc not in (0, None):
                if not rec["lines"]:
                    rec["log_tail"] = text[-3000:]
                self.resume(cluster)
        rec["latest_final"] = latest(self.model)
        rec["epochs_done"] = epochs_done(self.model)
        rec["lost"] = lost(rec.get("latest_before"), rec["latest_after"], rec["latest_final"], rec["epochs_done"],
                           args.epochs)
        rec["recall@10"] = recall(self.model, args.heldout) if rec["epochs_done"] == args.epochs else None
        rec["seconds"] = round(time.monotonic() - t0, 1)
        return rec

    def inject(self, cluster: netcluster.NetCluster, job: subprocess.Popen) -> None:
        """Wait for --after-version committed checkpoints and --delay seconds, then the fault."""
        args, rec, name = self.args, self.record, self.fault.name
        t_job = time.monotonic()
        while (latest(self.model) or 0) < args.after_version:
            if job.poll() is not None:
                rec["fault_missed"] = "the job ended before the checkpoint the fault waits for"
                return
            time.sleep(0.2)
        time.sleep(args.delay)
        placed = actor_nodes(cluster)
        rec["placement"] = placed
        rec["latest_before"] = latest(self.model)
        rec["fault_at"] = round(time.monotonic() - t_job, 1)
        if name.startswith("ps-killed"):
            self.target = "ps"  # the head's node cannot go: it is the cluster
            rec["servers_on_target"] = sorted(k for k, v in placed.items() if k.startswith("server") and v == "ps")
            cluster.kill_node(self.target)
        elif name == "trainer-killed":
            self.target = placed.get("worker", "trainer1")
            cluster.kill_node(self.target)
        elif name in ("link-flap", "link-cut"):
            self.target = placed.get("worker", "trainer")
            cluster.link(self.target, False)
            if name == "link-flap":
                time.sleep(args.flap)
                cluster.link(self.target, True)
        elif name == "driver-killed":
            self.target = cluster.head.name
            pids = cluster.driver_pids(self.model)
            rec["driver_pids"] = pids
            for pid in pids:
                os.kill(pid, signal.SIGKILL)
        rec["target"] = self.target

    def resume(self, cluster: netcluster.NetCluster) -> None:
        """Repair the cluster (the killed node started again, the cut link up and its node restarted),
        then run the resume command the stopped job named."""
        rec, name = self.record, self.fault.name if self.fault else ""
        target = getattr(self, "target", None)
        if target and target != cluster.head.name:
            if name.startswith("link"):  # Ray declared the cut-off node dead: a fresh node at its address
                cluster.kill_node(target)
                cluster.link(target, True)
            cluster.start_node(target)
        named = resume_line(rec["lines"])
        rec["resume_named"] = named
        rec["resume_command"] = resume_args(self.model, self.args.corpus)
        t0 = time.monotonic()
        rc, text = cluster.run_job(rec["resume_command"], os.path.join(self.dir, "job2.log"), timeout=JOB_SECONDS)
        rec["resumed"] = True
        rec["resume_seconds"] = round(time.monotonic() - t0, 1)
        rec["resume_finished"] = rc == 0
        rec["resume_lines"] = driver_lines(text)


def read_log(text: str) -> dict:
    """What a job printed: the driver's lines, and Ray's status message for a job that failed."""
    status = re.search(r"Status message: (.*?)(, last available logs|$)", text, re.MULTILINE)
    return {"lines": driver_lines(text), "ray_status": status.group(1) if status else None}


def reread(records: list[dict], work: str) -> None:
    """Each record's lines read again from its job logs under `work`, where they are still there (so that
    runs made in parts show their lines as this version of driver_lines picks them)."""
    for r in records:
        for log, key in (("job1.log", None), ("job2.log", "resume_lines")):
            path = os.path.join(work, r["fault"], log)
            if os.path.exists(path) and (key is None or r.get("resumed")):
                with open(path) as fh:
                    found = read_log(fh.read())
                if key:
                    r[key] = found["lines"]
                else:
                    r.update(found)


def short(line: str, width: int = 160) -> str:
    line = line.replace("|", "\\|")
    return line if len(line) <= width else line[:width - 1] + "…"


def table(records: list[dict]) -> str:
    """The markdown table: fault | what the run printed | finished? | resumed? | recall@10 vs undisturbed | lost."""
    base = next((r for r in records if r["fault"] == "undisturbed"), None)
    ref = base and base.get("recall@10")
    rows = ["| fault | what the run printed | finished? | resumed? | recall@10 vs undisturbed | lost |",
            "|---|---|---|---|---|---|"]
    for r in records:
        printed = "<br>".join(short(line) for line in r.get("lines", [])) or (
            f"(nothing; Ray: {r['ray_status']})" if r.get("ray_status") else "(nothing)")
        if r.get("hang"):
            printed += f"<br>**{r['hang']}**"
        finished = f"yes (job {r['job_seconds']:g} s)" if r.get("finished") else "no" + (
            f" (stopped {r['ended_after_fault_seconds']:g} s after the fault)" if "ended_after_fault_seconds" in r else "")
        if r.get("resumed"):
            resumed = "yes, " + (f"finished (job {r['resume_seconds']:g} s)" if r.get("resume_finished") else "**failed**")
            resumed += "".join(f"<br>{short(x)}" for x in r.get("resume_lines", []))
        else:
            resumed = "no"
        got = r.get("recall@10")
        if got is None:
            quality = "n/a"
        elif r["fault"] == "undisturbed" or ref is None:
            quality = f"{got:.4f}"
        else:
            quality = f"{got:.4f} vs {ref:.4f} ({got - ref:+.4f})"
        versions = f" (LATEST v{r.get('latest_before')} → v{r.get('latest_after')} → v{r.get('latest_final')})" \
            if r.get("latest_before") is not None else ""
        rows.append(f"| {r['what']} | {printed} | {finished} | {resumed} | {quality} | {r.get('lost', '?')}{versions} |")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--corpus", help="a corpus made by prepare (required but with --from-json)")
    ap.add_argument("--heldout", help="its held-out file (prepare --holdout)")
    ap.add_argument("--work", help="a folder for the models and job logs (each fault's is replaced)")
    ap.add_argument("--faults", nargs="*", choices=list(FAULTS), default=[f for f in FAULTS if f != "ps-killed-no-room"])
    ap.add_argument("--no-baseline", action="store_true", help="skip the undisturbed run")
    ap.add_argument("--epochs", type=int, default=8)
    ap.add_argument("--checkpoint-every", type=float, default=20.0, help="train's --checkpoint-every, seconds")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--cpus", type=int, default=2, help="the worker's CPUs, and each trainer node's")
    ap.add_argument("--gbps", type=float, default=1.0, help="every link's cap, Gbit/s (default 1)")
    ap.add_argument("--after-version", type=int, default=2, help="inject once this checkpoint version is committed")
    ap.add_argument("--delay", type=float, default=3.0, help="seconds after that checkpoint (mid-epoch)")
    ap.add_argument("--flap", type=float, default=10.0, help="seconds the link is down in link-flap")
    ap.add_argument("--quiet-lock", default="/work/scratch/quiet.lock",
                    help="wait while this file exists before each cluster starts ('' : never)")
    ap.add_argument("--json", help="write every record here")
    ap.add_argument("--from-json", nargs="+", metavar="JSON",
                    help="run nothing: print the table of the records these --json files hold (runs made in parts)")
    ap.add_argument("train_args", nargs=argparse.REMAINDER, help="-- more flags for train (e.g. -- --dim 64)")
    args = ap.parse_args(argv)
    args.train_args = args.train_args[1:] if args.train_args[:1] == ["--"] else args.train_args
    if args.from_json:
        records = []
        for path in args.from_json:
            with open(path) as fh:
                saved = json.load(fh)
            reread(saved["records"], saved["settings"]["work"])
            records += saved["records"]
        report(sorted(records, key=lambda r: r["fault"] != "undisturbed"))
        return 0
    for flag in ("corpus", "heldout", "work"):
        if not getattr(args, flag):
            ap.error(f"--{flag} is required")
    args.corpus, args.heldout, args.work = (os.path.abspath(p) for p in (args.corpus, args.heldout, args.work))
    why = netcluster.available()
    if why:
        print(f"error: {why}", file=sys.stderr)
        return 2

    def stop(signum, frame):  # SIGTERM, SIGHUP: unwind through the clusters' teardown, as Ctrl-C does
        raise KeyboardInterrupt

    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, stop)
    records: list[dict] = []
    cases = ([] if args.no_baseline else [None]) + [FAULTS[f] for f in args.faults]
    try:
        for fault in cases:
            case = Case(args, fault)
            print(f"network_faults: {case.name}: nodes {' '.join(case.record['nodes'])}", file=sys.stderr)
            records.append(case.run())
            r = records[-1]
            print(f"network_faults: {case.name}: finished {r['finished']}, resumed {r.get('resumed', False)}, "
                  f"recall@10 {r['recall@10']}, lost {r['lost']}, {r['seconds']:g}s", file=sys.stderr)
            if args.json:
                with open(args.json, "w") as fh:
                    json.dump({"settings": {k: v for k, v in vars(args).items()}, "records": records}, fh, indent=2)
    except KeyboardInterrupt:
        print("network_faults: interrupted; every namespace and process of the current run removed", file=sys.stderr)
        return 130
    report(records)
    return 0


def report(records: list[dict]) -> None:
    """The table, then each run's commands."""
    print(table(records))
    print()
    for r in records:
        print(f"- {r['fault']}: `{' '.join(r['command'])}`" + (f"; then `{' '.join(r['resume_command'])}`"
                                                              if r.get("resume_command") else ""))


if __name__ == "__main__":
    sys.exit(main())
