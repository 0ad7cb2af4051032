"""Where the actors run: parameter servers on `ps` nodes, workers on `trainer` (or GPU) nodes.

Changes when where actors run, or how much memory they reserve, changes.

A cluster built from deploy/ labels its node groups with custom resources: high-memory CPU nodes
carry `ps`, training nodes (CPU or GPU) carry `trainer`, and the head carries neither, so it runs
the driver and no training. When the cluster has those resources, parameter servers ask for `ps`
and for the memory their slice of the tables takes (so Ray packs them by memory, not by count),
workers ask for `trainer`, and both are spread over the nodes that fit.

When the cluster has no such resource (a laptop, CI, any plain Ray cluster), the same calls fall
back to plain CPU placement: no custom resource, no memory request, no flag to set. On such a cluster
of several nodes, the servers run apart from the workers where the nodes allow (actor_nodes: a soft
preference for a node each actor is given), and a run says where each actor runs (where_lines).

The memory figure is the one deploy/README.md sizes nodes with:

    per PS = ceil(rows / num_ps) × (dim × 4 bytes [+ 4 bytes of Adagrad state]) summed over the tables
             × (1 + PS_HEADROOM) + PROCESS_BYTES

PROCESS_BYTES, a process of ours before its data, is also what `plan` counts for a process it cannot
measure: one figure for both.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import re
import time
from typing import TYPE_CHECKING, Any

import ray

from .settings import resident_documents, resident_tables

if TYPE_CHECKING:
    from .config import TableSpec

log = logging.getLogger(__name__)

PS_RESOURCE = "ps"  # custom resource of the nodes that host parameter servers (deploy/)
TRAINER_RESOURCE = "trainer"  # custom resource of the nodes that host workers (deploy/)

# One of our processes (a parameter server, a worker, the driver) before its data: Python, numpy, Ray's
# core worker, a worker's torch: about a quarter of a GiB of private memory for each role (the figures,
# with Ray 2.60 and torch 2.x, are in docs/benchmarks.md). One figure, rounded up so that what is asked
# for is never short: what a server asks Ray for beside its rows, what the fit check counts for a server and a worker,
# and what `plan` counts for a process it cannot measure.
PROCESS_BYTES = 512 << 20
# Above the tables: up to max_concurrency pull results being assembled, the id array a checkpoint
# writes beside each slice (8 bytes a row), allocator slack.
PS_HEADROOM = 0.25
FLOAT_BYTES = 4  # a worker's matrices are float32 (a server's rows are TableSpec.row_bytes: --dtype)


def table_bytes_per_ps(tables: dict[str, TableSpec], num_ps: int) -> int:
    """Bytes of the largest server's slice of every table, optimizer state included.

    tables: the trainer's table specs (ps.table_specs; a row is TableSpec.row_bytes: its vector in the
    run's --dtype, Adagrad's float32 accumulator). Row r lives on server r % num_ps, so server 0 holds
    ceil(rows / num_ps) rows of each table.
    """
    return sum(-(-spec.rows // num_ps) * spec.row_bytes for spec in tables.values())


def ps_memory_bytes(table_bytes: int) -> int:
    """What one parameter server asks Ray for with `memory=`: its tables plus headroom and the process."""
    return int(table_bytes * (1 + PS_HEADROOM)) + PROCESS_BYTES


def has_resource(name: str, resources: dict[str, float] | None = None) -> bool:
    resources = ray.cluster_resources() if resources is None else resources
    return resources.get(name, 0) > 0


def ps_options(config: Any, tables: dict[str, TableSpec], resources: dict[str, float] | None = None,
               nodes: list[dict] | None = None) -> dict:
    """`.options(...)` for the ParameterServer actors.

    Servers reserve no CPU (they serve pulls and pushes from threads, numpy releases the GIL). On a
    cluster with `ps` nodes each one takes one unit of `ps` and `memory=` for its slice; elsewhere
    it goes wherever Ray puts it. `resources` and `nodes` default to the live cluster's.
    """
    opts: dict[str, Any] = {"num_cpus": 0, **_spread(), **_ps_request(config, tables, resources)}
    if "memory" in opts:
        problem = ps_fit_problem(opts["memory"], config.num_ps, ray.nodes() if nodes is None else nodes)
        if problem:
            log.warning(f"warning: {problem} (waiting for the autoscaler)")
    return opts


def _ps_request(config: Any, tables: dict[str, TableSpec], resources: dict[str, float] | None) -> dict:
    """A server's `ps` unit and `memory=` for its slice, on a cluster with `ps` nodes; else nothing."""
    if not has_resource(PS_RESOURCE, resources):
        return {}
    return {"resources": {PS_RESOURCE: 1}, "memory": ps_memory_bytes(table_bytes_per_ps(tables, config.num_ps))}


def worker_options(config: Any, resources: dict[str, float] | None = None) -> dict:
    """`.options(...)` for the Worker actors: their CPUs and GPUs, one `trainer` unit where that exists."""
    opts: dict[str, Any] = {"num_cpus": config.cpus_per_worker, "num_gpus": config.gpus_per_worker, **_spread()}
    if has_resource(TRAINER_RESOURCE, resources):
        opts["resources"] = {TRAINER_RESOURCE: 1}
    return opts


def _spread() -> dict:
    """Spread the actors over the nodes; but inside a placement group (a `tune` trial's), leave them
    to it: the group holds exactly their resources, and an explicit strategy would schedule them
    outside it, on CPUs the group has reserved."""
    from ray.util import get_current_placement_group

    inside = ray.is_initialized() and get_current_placement_group() is not None  # (it starts a Ray if none runs)
    return {} if inside else {"scheduling_strategy": "SPREAD"}


def run_bundles(config: Any, tables: dict[str, TableSpec], resources: dict[str, float] | None = None) -> list[dict]:
    """The resources of a run's actors as placement-group bundles, from the same requests as their
    options: one per worker (worker_options) and, where servers request anything (`ps` nodes), one per
    server. A `tune` trial reserves these, so trials start only when all of a run fits."""
    bundles = [_bundle(worker_options(config, resources))] * config.num_workers
    server = _bundle(_ps_request(config, tables, resources))
    return bundles + [server] * config.num_ps if server else bundles


def _bundle(opts: dict) -> dict:
    """An actor's `.options(...)` as a placement-group bundle: its nonzero resources."""
    wanted = {"CPU": opts.get("num_cpus", 0), "GPU": opts.get("num_gpus", 0), "memory": opts.get("memory", 0),
              **opts.get("resources", {})}
    return {name: amount for name, amount in wanted.items() if amount}


def ps_fit_problem(need: int, num_ps: int, nodes: list[dict]) -> str | None:
    """Why `num_ps` servers of `need` bytes each cannot all be placed on the live `ps` nodes, or None.

    Packs greedily by each node's `ps` units and Ray `memory` resource. A None does not promise the
    placement (other actors may hold memory); a message means it cannot happen without more nodes.
    """
    ps_nodes = [n["Resources"] for n in nodes if n.get("Alive") and n["Resources"].get(PS_RESOURCE, 0) > 0]
    if not ps_nodes:
        return f"{num_ps} parameter servers need `{PS_RESOURCE}` nodes and none is alive yet"
    fits = sum(min(int(r[PS_RESOURCE]), int(r.get("memory", 0) // need)) for r in ps_nodes)
    if fits >= num_ps:
        return None
    largest = max(r.get("memory", 0) for r in ps_nodes)
    return (f"{num_ps} parameter servers need {need / 2**30:.1f} GiB each, but the {len(ps_nodes)} live "
            f"`{PS_RESOURCE}` node(s) fit {fits} (largest offers {largest / 2**30:.1f} GiB); "
            "add ps nodes, or raise --num-ps for smaller slices")


# -- does the run fit -------------------------------------------------------------------------------

def run_memory_bytes(config: Any, tables: dict[str, TableSpec]) -> tuple[int, int]:
    """(bytes per parameter server, bytes per worker) a run needs at least: each server its slice and
    the process (ps_memory_bytes), each worker its process (PROCESS_BYTES) and resident rows (a GPU
    worker's are on its GPU)."""
    words_out = tables["words_out"]
    rows = (sum(resident_tables(config, words_out.rows).values())
            + resident_documents(config, tables["docs"].rows, words_out.rows))
    resident = 0 if config.gpus_per_worker else rows * words_out.width * FLOAT_BYTES
    return ps_memory_bytes(table_bytes_per_ps(tables, config.num_ps)), PROCESS_BYTES + resident


def local_resources(object_store_bytes: int) -> dict[str, float]:
    """What a local Ray started on this machine will offer, before starting it: its CPUs (as Ray
    counts them, cgroup limits included), GPUs, and memory left beside the object store."""
    import psutil

    try:
        from ray._private.utils import get_num_cpus  # the count a local ray.init() uses

        cpus = get_num_cpus()
    except (ImportError, AttributeError):
        cpus = os.cpu_count() or 1
    gpus = 0
    if os.environ.get("CUDA_VISIBLE_DEVICES", None) != "":
        try:  # the count a local ray.init() detects (NVML), without importing torch (0.8 s of start-up)
            from ray._private.accelerators import get_accelerator_manager_for_resource

            manager = get_accelerator_manager_for_resource("GPU")
            gpus = manager.get_current_node_num_accelerators()
            visible = manager.get_current_process_visible_accelerator_ids()
            if visible is not None:
                gpus = min(gpus, len(visible))
        except (ImportError, AttributeError):
            import torch

            gpus = torch.cuda.device_count()
    return {"CPU": float(cpus), "GPU": float(gpus),
            "memory": float(psutil.virtual_memory().available - object_store_bytes)}


def _count(n: int, thing: str) -> str:
    return f"{n} {thing}" + ("" if n == 1 else "s")


def fit_problems(config: Any, tables: dict[str, TableSpec], resources: dict[str, float], *,
                 where: str = "the Ray cluster", way_out: bool = True) -> list[str]:
    """Why the run's servers and workers cannot fit `resources` (a cluster's totals, or
    local_resources()), one line each naming the flag to change; empty when they fit. where: what
    the lines call the holder of `resources`; way_out False: the lines say what is short, and the
    caller the way out (plan's calibration has ways of its own)."""
    problems = []
    need = {"CPU": config.num_workers * config.cpus_per_worker, "GPU": config.num_workers * config.gpus_per_worker}
    for name, amount in need.items():
        if amount > resources.get(name, 0):
            verb = "needs" if config.num_workers == 1 else "need"
            problems.append(f"{_count(config.num_workers, 'worker')} {verb} {amount:g} {name} but {where} has "
                            f"{resources.get(name, 0):g}"
                            + (f"; lower --num-workers or --{name.lower()}s-per-worker" if way_out else ""))
    per_ps, per_worker = run_memory_bytes(config, tables)
    total = config.num_ps * per_ps + config.num_workers * per_worker
    have = resources.get("memory", 0)
    if total > have:
        problems.append(f"{_count(config.num_ps, 'parameter server')} x {per_ps / 2**30:.2f} GiB + "
                        f"{_count(config.num_workers, 'worker')} x {per_worker / 2**30:.2f} GiB need {total / 2**30:.1f} GiB, but {where} has "
                        f"{have / 2**30:.1f} GiB of memory"
                        + ("; lower --num-ps or --num-workers (each is a process of its own), or run `doc2vec-dist plan` "
                           "for the details" if way_out else ""))
    return problems


def without_resident_documents(config: Any, tables: dict[str, TableSpec], resources: dict[str, float]) -> Any | None:
    """The config whose workers do not keep their documents resident (each macro-batch pulls and pushes its
    documents' rows instead), where that alone makes a run that does not fit `resources` fit them; else
    None. On the token path a worker keeps its share of the documents for the run, beside the servers'
    copy: a second copy of the largest table (a GPU worker's in its device's memory, not the host's)."""
    if not resident_documents(config, tables["docs"].rows, tables["words_out"].rows):
        return None
    lighter = dataclasses.replace(config, resident_docs=False)
    return None if fit_problems(lighter, tables, resources) else lighter


def resident_documents_line(config: Any, tables: dict[str, TableSpec], resources: dict[str, float]) -> str:
    """What a run that drops its resident documents prints: why, in memory."""
    per_ps, per_worker = run_memory_bytes(config, tables)
    need = config.num_ps * per_ps + config.num_workers * per_worker
    return (f"the workers do not keep their documents resident: with them the run needs {need / 2**30:.1f} GiB, "
            f"the Ray cluster has {resources.get('memory', 0) / 2**30:.1f} GiB; each macro-batch pulls and pushes "
            "its documents' rows instead")


# -- does each actor fit a node ----------------------------------------------------------------------

# What to lower when an actor's request fits no node, by role and resource: the flag that sets it.
_FLAGS = {("worker", "CPU"): "--cpus-per-worker", ("worker", "GPU"): "--gpus-per-worker",
          ("parameter server", "memory"): "--num-ps (smaller slices)"}
_COUNT_FLAGS = {"worker": "--num-workers", "parameter server": "--num-ps"}


def node_label(node: dict) -> str:
    """A node as a line names it: its address and the start of its id (nodes on one machine share an address)."""
    return f"{node.get('NodeManagerAddress') or '?'} ({str(node.get('NodeID', ''))[:8]})"


def _amount(resource: str, value: float) -> str:
    return f"{value / 2**30:.1f} GiB of memory" if resource == "memory" else f"{value:g} {resource}"


def node_fit_problem(config: Any, tables: dict[str, TableSpec], nodes: list[dict],
                     resources: dict[str, float] | None = None) -> str | None:
    """Why the run's actors cannot all be placed on the live `nodes` (ray.nodes()) as they are, each on
    one node with all it asks for (worker_options, _ps_request), in one line naming the resource and the
    nodes that lack it; None when they can. A cluster's totals can hide it: 3 CPUs on two 2-CPU nodes
    do not hold a worker asking for 3. Workers and servers ask for different resources (servers for no
    CPU), so each role is counted on its own; for one role every actor asks the same, so a node holds
    the fewest copies any of its resources allows."""
    alive = [n for n in nodes if n.get("Alive")]
    if resources is None:
        resources = {}
        for n in alive:
            for name, value in n["Resources"].items():
                resources[name] = resources.get(name, 0) + value
    asks = (("worker", config.num_workers, _bundle(worker_options(config, resources))),
            ("parameter server", config.num_ps, _bundle(_ps_request(config, tables, resources))))
    for role, count, bundle in asks:
        problem = _role_fit_problem(role, count, bundle, alive) if bundle else None
        if problem:
            return problem
    return None


def _role_fit_problem(role: str, count: int, bundle: dict[str, float], nodes: list[dict]) -> str | None:
    custom = [r for r in bundle if r not in ("CPU", "GPU", "memory")]  # `ps` / `trainer`: the nodes meant for it
    kind = "".join(f"`{r}` " for r in custom)
    hosts = [n for n in nodes if all(n["Resources"].get(r, 0) > 0 for r in custom)]
    if not hosts and not custom:
        return (f"{_count(count, role)} ask{'s' if count == 1 else ''} for "
                f"{', '.join(_amount(r, need) for r, need in bundle.items())}, and no node is alive")
    if not hosts:
        return (f"{_count(count, role)} ask{'s' if count == 1 else ''} for {kind}nodes, and no live node has "
                f"{' or '.join(custom)}")
    for resource, need in bundle.items():
        if max(n["Resources"].get(resource, 0) for n in hosts) < need:
            have = ", ".join(f"{node_label(n)} has {_amount(resource, n['Resources'].get(resource, 0))}"
                             for n in hosts)
            lower = _FLAGS.get((role, resource))
            return (f"a {role} asks for {_amount(resource, need)}, and no {kind}node has that much: {have}"
                    + (f"; lower {lower}" if lower else ""))
    fits = sum(min(int(n["Resources"].get(r, 0) // need) for r, need in bundle.items()) for n in hosts)
    if fits >= count:
        return None
    short = next((r for r, need in bundle.items()
                  if sum(int(n["Resources"].get(r, 0) // need) for n in hosts) < count), None)
    what = (f"{_amount(short, bundle[short])} each, {_amount(short, bundle[short] * count)} in all" if short
            else ", ".join(_amount(r, need) for r, need in bundle.items()) + " each")
    have = ", ".join(f"{node_label(n)} has " + ", ".join(_amount(r, n["Resources"].get(r, 0))
                                                         for r in ([short] if short else bundle)) for n in hosts)
    return (f"{_count(count, role)} ask{'s' if count == 1 else ''} for {what}, and the {kind}nodes hold {fits}: {have}; lower "
            f"{_COUNT_FLAGS[role]}" + (f" or {_FLAGS[(role, short)]}" if (role, short) in _FLAGS else ""))


# A node type as Ray's monitor names it when it runs without a cluster config (`ray start` by hand, a local
# Ray): its read-only node provider mirrors each live node as a type of its own, node_<node id>, and
# launches nothing (ray.autoscaler._private.util.format_readonly_node_type).
_READONLY_TYPE = re.compile(r"node_[0-9a-f]{56}")
# What asking Ray's private state may raise when it is missing, changed or not answering.
_UNANSWERED = (ImportError, AttributeError, KeyError, TypeError, ValueError, RuntimeError, OSError,
               ray.exceptions.RayError)


def cluster_can_grow(wait_seconds: float = 10.0) -> bool | None:
    """Whether an autoscaler may add nodes to the cluster this process is connected to.

    False: Ray's monitor runs with its read-only node provider (every node type is a live node's own,
    _READONLY_TYPE): nothing will ever be added. True: it runs with node types of a cluster config (the
    cluster launcher's, KubeRay's worker groups), or the cluster config the autoscaler reported to the
    GCS lets a node group grow (how Ray Data asks). None: Ray says neither within wait_seconds (the
    monitor writes its first report a few seconds after the head starts).
    """
    import json

    from ray._private import ray_constants
    from ray.experimental.internal_kv import _internal_kv_get

    try:
        from ray._private.state import state

        config = state.get_cluster_config()
        if config and config.node_group_configs:
            return any(group.max_count == -1 or group.max_count > group.min_count
                       for group in config.node_group_configs if group.resources and group.max_count != 0)
    except _UNANSWERED as exc:  # a private API of Ray's: missing or changed, ask the next source
        log.debug(f"no cluster config from the GCS: {exc}")
    deadline = time.monotonic() + wait_seconds
    while True:
        types: set[str] = set()
        try:
            raw = _internal_kv_get(ray_constants.DEBUG_AUTOSCALING_STATUS)
            report = (json.loads(raw) if raw else {}).get("autoscaler_report") or {}
            types = set((report.get("node_type_mapping") or {}).values()) | set(report.get("active_nodes") or {})
        except _UNANSWERED as exc:  # as above
            log.debug(f"no autoscaler status: {exc}")
        if types:
            return not all(_READONLY_TYPE.fullmatch(t) for t in types)
        if time.monotonic() >= deadline:
            return None
        time.sleep(0.5)


# -- which node each actor runs on -------------------------------------------------------------------

HEAD_RESOURCE = "node:__internal_head__"  # the resource Ray gives the head node (ray._common.constants)


def actor_nodes(config: Any, tables: dict[str, TableSpec], nodes: list[dict] | None = None) -> dict | None:
    """The node each server and each worker is to run on, where the cluster lets the servers run apart
    from the workers: {"servers": [node id] * num_ps, "workers": [node id] * num_workers, "server_memory":
    what each server asks Ray for (on_node: an actor asking for nothing is put on a random node, whatever
    its scheduling strategy says: Ray's GetBestSchedulableNode)}; None where
    there is nothing to decide (one live node; `ps` / `trainer` nodes, whose resources place them; a
    `tune` trial's placement group) or no way to (the workers need every node, or no node they leave
    holds the servers' rows): Ray spreads them (_spread).

    On a plain cluster of a head and one more node, Ray's spreading once put the servers on the worker's
    node, so that losing that node lost the servers' rows too (a run stops, to be resumed) where a worker
    alone comes back from its checkpointed position. So the servers take the nodes the workers can do
    without: the head first (its loss ends a run whatever runs there), then the nodes with the least room
    for workers and the most memory; one node for them, or more where there are more nodes than workers
    (at most one a server), as long as the rest still hold every worker (their CPUs and GPUs, by the
    nodes' totals) and they hold the servers' rows (ps_memory_bytes each, by the nodes' `memory`). The
    servers are dealt over their nodes and the workers over the rest, one to each before a second
    (_deal). The caller asks for these nodes softly (on_node): a node that is full or gone lets Ray choose.
    nodes: ray.nodes() (default: the live cluster's)."""
    if nodes is None:
        if _spread() == {}:  # inside a placement group
            return None
        nodes = ray.nodes()
    alive = [n for n in nodes if n.get("Alive")]
    resources: dict[str, float] = {}
    for n in alive:
        for name, value in n["Resources"].items():
            resources[name] = resources.get(name, 0) + value
    if len(alive) < 2 or has_resource(PS_RESOURCE, resources) or has_resource(TRAINER_RESOURCE, resources):
        return None
    wants = _bundle(worker_options(config, resources))
    server = ps_memory_bytes(table_bytes_per_ps(tables, config.num_ps))

    def room(node: dict) -> int:  # workers the node holds
        return min((int(node["Resources"].get(r, 0) // need) for r, need in wants.items()), default=config.num_workers)

    def servers_held(chosen: list[dict]) -> int:
        return sum(int(n["Resources"].get("memory", 0) // server) for n in chosen)

    order = sorted(alive, key=lambda n: (n["Resources"].get(HEAD_RESOURCE, 0) == 0, room(n),
                                         -n["Resources"].get("memory", 0)))
    wanted = min(config.num_ps, max(1, len(alive) - config.num_workers))
    chosen: list[dict] = []
    for n in order:
        if len(chosen) >= wanted and servers_held(chosen) >= config.num_ps:
            break
        rest = [m for m in alive if m is not n and all(m is not c for c in chosen)]
        if sum(room(m) for m in rest) >= config.num_workers and n["Resources"].get("memory", 0) >= server:
            chosen.append(n)
    if not chosen or servers_held(chosen) < config.num_ps:
        return None
    rest = [m for m in alive if all(m is not c for c in chosen)]
    return {"servers": _deal(chosen, config.num_ps, lambda n: n["Resources"].get("memory", 0), server),
            "workers": _deal(rest, config.num_workers, room, 1), "server_memory": server}


def _deal(nodes: list[dict], count: int, capacity, each: float) -> list[str]:
    """`count` actors dealt one at a time, each taking `each` of a node's capacity: to the node with the
    fewest so far that has room for it, the one with the most left among those (the callers checked that
    the nodes hold them all)."""
    left, dealt, out = [capacity(n) for n in nodes], [0] * len(nodes), []
    for _ in range(count):
        i = max((k for k in range(len(nodes)) if left[k] >= each), key=lambda k: (-dealt[k], left[k]))
        left[i] -= each
        dealt[i] += 1
        out.append(nodes[i]["NodeID"])
    return out


def on_node(options: dict, node_id: str | None, memory: int | None = None) -> dict:
    """An actor's `.options(...)` asking for `node_id` softly (Ray runs it elsewhere where that node is
    full or gone, as it restarts it elsewhere when the node dies), and for `memory` where it asks for
    none yet (a server: else it asks for nothing, and Ray puts such an actor on a random node); as they
    are where node_id is None."""
    if node_id is None:
        return options
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    asked = {"memory": memory} if memory and "memory" not in options else {}
    return {**options, **asked, "scheduling_strategy": NodeAffinitySchedulingStrategy(node_id, soft=True)}


def actor_names(keys: list[tuple[str, int]]) -> str:
    """("worker", i) and ("server", s) keys as a line names them: "workers 0, 1 and parameter server 0"."""
    workers = sorted(i for role, i in keys if role == "worker")
    servers = sorted(i for role, i in keys if role == "server")
    parts = ([f"worker{'s' if len(workers) > 1 else ''} {', '.join(map(str, workers))}"] if workers else []) + \
            ([f"parameter server{'s' if len(servers) > 1 else ''} {', '.join(map(str, servers))}"] if servers else [])
    return " and ".join(parts)


def where_lines(node_of: dict[tuple[str, int], str], nodes: list[dict]) -> list[str]:
    """One line per node naming the actors that run on it (node_of: ("worker", i) or ("server", s) → node
    id), in the order of `nodes` (ray.nodes())."""
    lines = []
    for node in nodes:
        keys = [key for key, where in node_of.items() if where == node.get("NodeID")]
        if keys:
            head = ", the head" if node["Resources"].get(HEAD_RESOURCE) else ""
            lines.append(f"node {node_label(node)[:-1]}{head}) runs {actor_names(keys)}")
    return lines
