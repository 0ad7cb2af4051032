"""benchmarks/network_faults.py's own logic, without namespaces: which lines of a job's log are the driver's,
the resume command they name, what counts as lost, and the table (issue 28, item 3)."""

from __future__ import annotations

from conftest import load_benchmark

faults = load_benchmark("network_faults", "network_faults")

LOG = """2026-11-26 15:45:35,028	INFO job_manager.py:581 -- Runtime env is setting up.
Running entrypoint for job raysubmit_x: python -m doc2vec_dist train --corpus /c --out /m --no-progress
engine: 1 worker(s) x 2 CPU(s), 2 parameter server(s); kernel exact
worker 0 failed (The actor 0464 is unavailable: RpcError); restarting it from its last checkpointed position
\x1b[33m(raylet)\x1b[0m The node with node id: d8b3 and address: 10.213.0.3 has been marked dead
node 10.213.0.3 (6ad92c29) is dead (Ray: health check failed): it ran worker 0; Ray restarts it on a live node
worker 0 is back, on node b902109c
training stopped: the model at /m is kept up to checkpoint v3; resume with `doc2vec-dist train --corpus /c --out /m --resume`
error: node 10.213.0.3 (d8b3232e) is dead (Ray: health check failed): it ran worker 0, which cannot be restarted
2026-11-26 15:46:16,453	ERR cli.py:75 -- Job 'raysubmit_x' failed
2026-11-26 15:46:16,453	INFO cli.py:89 -- Status message: Job entrypoint command failed with exit code 2, last logs:
training stopped: the model at /m is kept up to checkpoint v3; resume with `doc2vec-dist train --corpus /c --out /m --resume`
error: node 10.213.0.3 (d8b3232e) is dead (Ray: health check failed): it ran worker 0, which cannot be restarted
"""


def test_the_drivers_lines_are_its_notices_and_errors_once_and_the_resume_command_is_read_from_them():
    lines = faults.driver_lines(LOG)
    assert [line.split(" ")[0] for line in lines] == ["worker", "node", "worker", "training", "error:"]  # not Ray's, not repeated
    assert faults.resume_line(lines) == "doc2vec-dist train --corpus /c --out /m --resume"
    assert faults.resume_line(lines[:1]) is None


def test_lost_is_latest_going_back_or_missing_epochs():
    assert faults.lost(3, 3, 9, 8, 8) == "nothing"
    assert faults.lost(None, None, 9, 8, 8) == "nothing"  # a run with no fault has no before
    assert faults.lost(3, 2, 9, 8, 8) == "LATEST went back from v3 to v2"
    assert faults.lost(3, None, None, None, 8) == ("LATEST went back from v3 to nothing; the final model has None "
                                                   "of 8 epochs")


def test_the_table_compares_each_fault_with_the_undisturbed_run():
    records = [{"fault": "undisturbed", "what": "none", "lines": [], "finished": True, "job_seconds": 90.0,
                "recall@10": 0.2001, "lost": "nothing"},
               {"fault": "trainer-killed", "what": "trainer killed", "finished": False, "ended_after_fault_seconds": 17.0,
                "lines": ["error: a | b"], "resumed": True, "resume_finished": True, "resume_seconds": 41.5,
                "resume_lines": ["resumed from v3 (epoch 2, 9,574,406 tokens)"], "recall@10": 0.1990,
                "lost": "nothing", "latest_before": 3, "latest_after": 3, "latest_final": 9}]
    rows = faults.table(records).splitlines()
    assert rows[0].count("|") == 7 and len(rows) == 4
    assert rows[2] == "| none | (nothing) | yes (job 90 s) | no | 0.2001 | nothing |"
    assert rows[3] == ("| trainer killed | error: a \\| b | no (stopped 17 s after the fault) | yes, finished (job 41.5 s)"
                       "<br>resumed from v3 (epoch 2, 9,574,406 tokens) | "
                       "0.1990 vs 0.2001 (-0.0011) | nothing (LATEST v3 → v3 → v9) |")
