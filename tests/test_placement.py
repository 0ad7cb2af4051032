"""placement: `ps` / `trainer` resources and memory where the cluster has them, plain CPU placement where not."""

import os

import pytest
import ray

from doc2vec_dist import placement, settings
from doc2vec_dist.config import TableSpec, TrainConfig

GiB = 1 << 30
TABLES = {"docs": TableSpec("docs", 1001, 100, init="uniform"),
          "words_out": TableSpec("words_out", 10, 100, init="zeros")}


def specs(**rows_dims) -> dict[str, TableSpec]:
    """Table specs by name from (rows, dim[, state]) tuples."""
    return {name: TableSpec(name, *shape) for name, shape in rows_dims.items()}


def node(memory, ps=0, alive=True, **extra):
    resources = {"memory": memory, **({"ps": ps} if ps else {}), **extra}
    return {"Alive": alive, "Resources": resources}


def test_the_session_cluster_has_no_custom_resources_so_placement_is_plain_cpu(ray_cluster):
    config = TrainConfig(num_ps=2, num_workers=2, cpus_per_worker=1)
    ps = placement.ps_options(config, TABLES)
    assert ps == {"num_cpus": 0, "scheduling_strategy": "SPREAD"}  # no `ps`, no memory request
    assert placement.worker_options(config) == {"num_cpus": 1, "num_gpus": 0, "scheduling_strategy": "SPREAD"}


def test_the_fallback_trains_on_the_session_cluster(trained_model):
    # trained_model trained through trainer.train with these options on a Ray that has neither resource
    assert "ps" not in ray.cluster_resources() and "trainer" not in ray.cluster_resources()
    assert os.path.exists(os.path.join(trained_model, "LATEST"))


def test_with_ps_and_trainer_resources_actors_ask_for_them_and_servers_for_memory(logged):
    config = TrainConfig(num_ps=2, num_workers=4, cpus_per_worker=3, gpus_per_worker=1)
    have = {"CPU": 64, "GPU": 8, "ps": 16, "trainer": 8, "memory": 512 * GiB}
    ps = placement.ps_options(config, TABLES, resources=have, nodes=[node(200 * GiB, ps=8)] * 2)
    per_ps = 501 * 100 * 4 + 5 * 100 * 4  # server 0 holds ceil(1001/2) docs rows and ceil(10/2) words_out rows
    assert ps == {"num_cpus": 0, "scheduling_strategy": "SPREAD", "resources": {"ps": 1},
                  "memory": placement.ps_memory_bytes(per_ps)}
    assert placement.worker_options(config, resources=have) == {
        "num_cpus": 3, "num_gpus": 1, "scheduling_strategy": "SPREAD", "resources": {"trainer": 1}}
    assert logged.text == ""  # it fits: no warning


def test_only_the_resources_that_exist_are_asked_for():
    config = TrainConfig()
    assert "resources" not in placement.ps_options(config, TABLES, resources={"CPU": 4, "trainer": 2}, nodes=[])
    assert placement.worker_options(config, resources={"CPU": 4, "trainer": 2})["resources"] == {"trainer": 1}
    assert "resources" not in placement.worker_options(config, resources={"CPU": 4, "ps": 2})


def test_table_bytes_count_the_largest_slice_and_the_optimizer_state():
    tables = specs(docs=(10, 8, 1), words_out=(3, 8))
    assert placement.table_bytes_per_ps(tables, 3) == 4 * 9 * 4 + 1 * 8 * 4
    assert placement.table_bytes_per_ps(tables, 1) == 10 * 9 * 4 + 3 * 8 * 4
    assert placement.ps_memory_bytes(1000) == 1250 + placement.PROCESS_BYTES


def test_a_sizing_that_no_live_ps_node_can_hold_is_named(logged):
    need = 30 * GiB
    assert placement.ps_fit_problem(need, 4, [node(64 * GiB, ps=8), node(64 * GiB, ps=8)]) is None
    problem = placement.ps_fit_problem(need, 5, [node(64 * GiB, ps=8), node(64 * GiB, ps=8)])
    assert "5 parameter servers need 30.0 GiB each" in problem and "fit 4" in problem
    assert placement.ps_fit_problem(need, 2, [node(64 * GiB, ps=1)]) is not None  # units cap it too
    assert "none is alive" in placement.ps_fit_problem(need, 1, [node(64 * GiB, ps=8, alive=False)])
    # ps_options warns (the autoscaler may still add nodes) instead of refusing
    config = TrainConfig(num_ps=64)
    placement.ps_options(config, specs(docs=(10**9, 100)), resources={"ps": 8},
                         nodes=[node(64 * GiB, ps=8)])
    assert "warning: 64 parameter servers need" in logged.text


def test_a_workers_memory_need_counts_its_resident_url_rows_where_they_live():
    tables = specs(docs=(1000, 100), words=(500, 100), words_out=(500, 100))
    _, base = placement.run_memory_bytes(TrainConfig(dim=100, num_workers=2, schedule="shared"), tables)  # none
    # two workers on the block schedule: half the URL rows each, and half the documents
    _, blocks = placement.run_memory_bytes(TrainConfig(dim=100, num_workers=2), tables)
    assert blocks - base == (250 + 500) * 100 * 4
    # one worker: every words_out row, and (issue 48) every document's
    _, cpu = placement.run_memory_bytes(TrainConfig(dim=100, num_workers=1), tables)
    assert cpu - base == (500 + 1000) * 100 * 4
    # PV-DM on the token path holds the words rows too; on a GPU worker they are in the GPU's memory
    _, dm = placement.run_memory_bytes(TrainConfig(dim=100, num_workers=1, mode="dm", kernel="batched"), tables)
    assert dm - base == (2 * 500 + 1000) * 100 * 4
    _, gpu = placement.run_memory_bytes(TrainConfig(dim=100, num_workers=1, mode="dm", gpus_per_worker=1), tables)
    assert gpu == base


def test_a_run_that_fits_only_without_resident_documents_runs_without_them():
    """20M users on 4 workers once needed 20.6 GiB of a 20.2 GiB machine: each worker's share of the
    documents, resident beside the servers' copy, was the excess. Where dropping those rows alone makes the
    run fit, the run drops them (each batch pulls its documents, as one worker does); where it does not, or
    nothing is resident, there is nothing to drop."""
    tables = specs(docs=(4_000_000, 100), words_out=(100_000, 100))
    config = TrainConfig(dim=100, num_workers=4, cpus_per_worker=1)
    assert settings.resident_documents(config, 4_000_000, 100_000) == 1_000_000
    per_ps, per_worker = placement.run_memory_bytes(config, tables)
    need = config.num_ps * per_ps + 4 * per_worker
    lighter_need = need - 4 * 1_000_000 * 100 * 4
    resources = {"CPU": 4, "memory": (need + lighter_need) / 2}
    assert placement.fit_problems(config, tables, resources)
    lighter = placement.without_resident_documents(config, tables, resources)
    assert lighter is not None and not lighter.resident_docs and settings.resident_documents(lighter, 4_000_000, 100_000) == 0
    assert not placement.fit_problems(lighter, tables, resources)
    assert (lighter.num_workers, lighter.dim, lighter.schedule) == (4, 100, config.schedule)
    line = placement.resident_documents_line(config, tables, resources)
    assert line.startswith(f"the workers do not keep their documents resident: with them the run needs {need / 2**30:.1f} GiB")
    # too small even without them: refused as before; nothing resident: nothing to drop
    assert placement.without_resident_documents(config, tables, {"CPU": 4, "memory": lighter_need - 1}) is None
    shared = TrainConfig(dim=100, num_workers=2, schedule="shared")
    assert placement.without_resident_documents(shared, tables, {"CPU": 4, "memory": 1}) is None


def test_a_tune_trial_reserves_what_its_actors_request():
    """run_bundles: one bundle per worker and, on a cluster with `ps` nodes, one per server, each
    holding exactly what that actor's options ask Ray for."""
    config, tables = TrainConfig(num_ps=2, num_workers=3, cpus_per_worker=2, gpus_per_worker=1), specs(docs=(10**6, 100))
    cluster = {"CPU": 16, "GPU": 4, "ps": 2, "trainer": 4, "memory": 64 << 30}
    need = placement.ps_memory_bytes(placement.table_bytes_per_ps(tables, 2))
    assert placement.run_bundles(config, tables, cluster) == (
        [{"CPU": 2, "GPU": 1, "trainer": 1}] * 3 + [{"ps": 1, "memory": need}] * 2)
    assert placement.run_bundles(config, tables, {"CPU": 16, "GPU": 4}) == [{"CPU": 2, "GPU": 1}] * 3


# --- issue 26, item 9: a run that can never fit is refused, or waited for with a deadline ------------------

def host(address, node_id, **resources):
    """A live node as ray.nodes() lists it."""
    return {"Alive": True, "NodeManagerAddress": address, "NodeID": node_id * 7, "Resources": resources}


# the three-node cluster, built from deploy/: a head with no CPU, a `ps` node, a `trainer` node
THREE_NODES = [host("10.0.0.1", "headhead", memory=8 * GiB), host("10.0.0.2", "ps00ps00", ps=1, memory=64 * GiB),
               host("10.0.0.3", "trainer0", trainer=1, CPU=1, memory=8 * GiB)]


def test_a_worker_asking_more_cpus_than_any_trainer_node_has_names_the_node():
    problem = placement.node_fit_problem(TrainConfig(num_ps=1, cpus_per_worker=2), TABLES, THREE_NODES)
    assert problem == ("a worker asks for 2 CPU, and no `trainer` node has that much: 10.0.0.3 (trainer0) has 1 CPU; "
                       "lower --cpus-per-worker")
    assert placement.node_fit_problem(TrainConfig(num_ps=1, cpus_per_worker=1), TABLES, THREE_NODES) is None


def test_more_servers_than_the_ps_units_names_the_ps_nodes():
    problem = placement.node_fit_problem(TrainConfig(num_ps=2, cpus_per_worker=1), TABLES, THREE_NODES)
    assert problem == ("2 parameter servers ask for 1 ps each, 2 ps in all, and the `ps` nodes hold 1: "
                       "10.0.0.2 (ps00ps00) has 1 ps; lower --num-ps")


def test_totals_that_fit_do_not_hide_a_worker_that_fits_no_node():
    """Two 2-CPU nodes have 4 CPUs, but no worker asking for 3 fits on either."""
    nodes = [host("10.0.0.4", "aaaaaaaa", CPU=2), host("10.0.0.5", "bbbbbbbb", CPU=2)]
    problem = placement.node_fit_problem(TrainConfig(cpus_per_worker=3), TABLES, nodes)
    assert problem.startswith("a worker asks for 3 CPU, and no node has that much: 10.0.0.4 (aaaaaaaa) has 2 CPU, "
                              "10.0.0.5 (bbbbbbbb) has 2 CPU")
    two = placement.node_fit_problem(TrainConfig(num_workers=3, cpus_per_worker=2), TABLES, nodes)
    assert two.startswith("3 workers ask for 2 CPU each, 6 CPU in all, and the nodes hold 2")
    assert placement.node_fit_problem(TrainConfig(num_workers=2, cpus_per_worker=2), TABLES, nodes) is None
    dead = [nodes[0], {**host("10.0.0.6", "cccccccc", CPU=8), "Alive": False}]
    assert "no node has that much" in placement.node_fit_problem(TrainConfig(cpus_per_worker=3), TABLES, dead)


@pytest.mark.parametrize("types, grows", [
    ({"node_" + "a" * 56: 1}, False),  # Ray's monitor with no cluster config: `ray start` by hand, a local Ray
    ({"node_" + "a" * 56: 1, "node_" + "b" * 56: 2}, False),
    ({"head": 1, "ps": 1, "trainer": 1}, True),  # the cluster launcher's node types, KubeRay's groups
])
def test_whether_the_cluster_can_grow_is_read_from_the_autoscalers_report(monkeypatch, types, grows):
    import json

    import ray.experimental.internal_kv as kv
    from ray._private import state

    monkeypatch.setattr(state.state, "get_cluster_config", lambda: None)
    report = {"autoscaler_report": {"active_nodes": types, "node_type_mapping": {}}}
    monkeypatch.setattr(kv, "_internal_kv_get", lambda key: json.dumps(report).encode())
    assert placement.cluster_can_grow(wait_seconds=0) is grows
    monkeypatch.setattr(kv, "_internal_kv_get", lambda key: None)  # no report yet: Ray says neither
    assert placement.cluster_can_grow(wait_seconds=0) is None


def test_the_session_cluster_cannot_grow(ray_cluster):
    assert placement.cluster_can_grow() is False


# --- issue 47, item 12: servers apart from the workers, and where each actor runs ----------------------------

HEAD = "node:__internal_head__"  # the resource Ray gives the head node


def test_on_two_nodes_the_servers_go_to_the_node_the_workers_do_not_need():
    """The head and one extra node: the servers were placed on the worker's node, so losing that node
    stopped everything. The worker needs one node's CPUs; the servers go to the other (the head first: its
    loss ends a run whatever runs there)."""
    config = TrainConfig(num_ps=2, num_workers=1, cpus_per_worker=2)
    nodes = [host("10.0.0.1", "headhead", CPU=2, memory=8 * GiB, **{HEAD: 1}), host("10.0.0.2", "extra000", CPU=2, memory=8 * GiB)]
    homes = placement.actor_nodes(config, TABLES, nodes)
    assert homes == {"servers": ["headhead" * 7] * 2, "workers": ["extra000" * 7],
                     "server_memory": placement.ps_memory_bytes(placement.table_bytes_per_ps(TABLES, 2))}
    # asked for softly, and a server for its memory: Ray puts an actor that asks for nothing on a random node
    node_id = "0a" * 28  # (a node id is hex)
    opts = placement.on_node(placement.ps_options(config, TABLES, resources={"CPU": 4}), node_id,
                             homes["server_memory"])
    assert opts["memory"] == homes["server_memory"] and opts["num_cpus"] == 0
    assert opts["scheduling_strategy"].node_id == node_id and opts["scheduling_strategy"].soft
    assert placement.on_node({"num_cpus": 1}, None, 5) == {"num_cpus": 1}
    # a head with no CPU (deploy/'s): the same; two workers that need both nodes' CPUs: no preference
    nodes[0]["Resources"]["CPU"] = 0
    assert placement.actor_nodes(config, TABLES, nodes) == homes
    both = [host("10.0.0.1", "headhead", CPU=2, memory=8 * GiB, **{HEAD: 1}), host("10.0.0.2", "extra000", CPU=2, memory=8 * GiB)]
    assert placement.actor_nodes(TrainConfig(num_ps=2, num_workers=2, cpus_per_worker=2), TABLES, both) is None
    # one node, or `ps` / `trainer` nodes (the resources place them): nothing to decide
    assert placement.actor_nodes(config, TABLES, both[:1]) is None
    assert placement.actor_nodes(config, TABLES, THREE_NODES) is None


def test_the_servers_go_where_their_rows_fit_and_the_workers_spread_over_the_rest():
    config = TrainConfig(num_ps=2, num_workers=2, cpus_per_worker=4)
    tables = specs(docs=(20_000_000, 100), words_out=(1_000_000, 100))  # 4.2 GB a server: 5.7 GiB with headroom
    nodes = [host("10.0.0.1", "headhead", CPU=4, memory=4 * GiB, **{HEAD: 1}),  # too small for a server
             host("10.0.0.2", "bigmem00", CPU=4, memory=64 * GiB), host("10.0.0.3", "cpu00000", CPU=8, memory=16 * GiB),
             host("10.0.0.4", "cpu11111", CPU=8, memory=16 * GiB),
             {**host("10.0.0.5", "deaddead", CPU=64, memory=512 * GiB), "Alive": False}]
    homes = placement.actor_nodes(config, tables, nodes)
    servers, workers = homes["servers"], homes["workers"]
    # two nodes left over by two workers: a server on each, the roomiest in memory first; never the head
    assert servers[0] == "bigmem00" * 7 and servers[1] in ("cpu00000" * 7, "cpu11111" * 7)
    assert len(set(workers)) == 2 and not set(workers) & set(servers)  # a worker on each of the other two
    assert "deaddead" * 7 not in servers + workers
    # where no node apart from the workers' holds the servers' rows, Ray's own spreading decides, as before
    small = [{**n, "Resources": {**n["Resources"], "memory": 4 * GiB}} for n in nodes]
    assert placement.actor_nodes(config, tables, small) is None


def test_where_each_actor_runs_is_one_line_per_node():
    nodes = [host("10.0.0.1", "headhead", CPU=0, memory=8 * GiB, **{HEAD: 1}), host("10.0.0.2", "extra000", CPU=2, memory=8 * GiB)]
    node_of = {("server", 0): "headhead" * 7, ("server", 1): "headhead" * 7, ("worker", 0): "extra000" * 7,
               ("worker", 1): "extra000" * 7}
    assert placement.where_lines(node_of, nodes) == [
        "node 10.0.0.1 (headhead, the head) runs parameter servers 0, 1",
        "node 10.0.0.2 (extra000) runs workers 0, 1"]
    # together on one node, it says so in one line
    assert placement.where_lines({("server", 0): "extra000" * 7, ("worker", 0): "extra000" * 7}, nodes) == [
        "node 10.0.0.2 (extra000) runs worker 0 and parameter server 0"]


def test_a_run_on_the_session_cluster_says_where_its_actors_run(ray_cluster, small_corpus, tmp_path, logged):
    """The session's Ray has one node: everything runs there, and the line says so."""
    from doc2vec_dist.trainer import train

    train(small_corpus, str(tmp_path / "m"), TrainConfig(dim=8, epochs=1, num_ps=2, num_workers=1, cpus_per_worker=1,
                                                         progress=False))
    node = next(n for n in ray.nodes() if n["Alive"])
    lines = [r.getMessage() for r in logged.records if " runs " in r.getMessage()]
    assert lines == [f"node {placement.node_label(node)[:-1]}, the head) runs worker 0 and parameter servers 0, 1"]
