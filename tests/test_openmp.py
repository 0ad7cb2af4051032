"""OpenMP threads in Ray's worker processes spin briefly, then sleep (runners.calm_openmp_in_ray_workers):
with libgomp's default spin a device-path worker next to one busy process trained many times slower
(benchmarks/busy_core.py; docs/benchmarks.md)."""

from __future__ import annotations

import os

from doc2vec_dist.runners import CALMED_ENV, calm_openmp_in_ray_workers


def test_only_a_ray_worker_process_gets_it_and_a_users_choice_stands():
    in_worker = {"RAY_RAYLET_PID": "123"}
    assert calm_openmp_in_ray_workers(in_worker) and in_worker["GOMP_SPINCOUNT"] == "1000"
    driver: dict = {}
    assert not calm_openmp_in_ray_workers(driver) and "GOMP_SPINCOUNT" not in driver
    for chosen in ({"OMP_WAIT_POLICY": "ACTIVE"}, {"GOMP_SPINCOUNT": "50"}):
        environ = {"RAY_RAYLET_PID": "123", **chosen}
        assert not calm_openmp_in_ray_workers(environ)
        assert environ == {"RAY_RAYLET_PID": "123", **chosen}
    # the driver's calm_openmp (for faiss, before a local Ray started) is not a user's choice: a worker spins 1,000
    inherited = {"RAY_RAYLET_PID": "123", "OMP_WAIT_POLICY": "PASSIVE", CALMED_ENV: "1"}
    assert calm_openmp_in_ray_workers(inherited)
    assert inherited == {"RAY_RAYLET_PID": "123", "GOMP_SPINCOUNT": "1000"}


def test_a_runs_worker_actor_has_it_before_torch_loads_libgomp(ray_cluster):
    """The Worker actor's process, as a run starts it: the package is imported before torch (which reads
    the variable once, as libgomp loads), and the driver's own environment is left as it was."""
    import ray

    @ray.remote(num_cpus=0)
    class Probe:
        def spin(self):
            import sys

            torch_first = "torch" in sys.modules
            import doc2vec_dist.worker  # noqa: F401  (what a run's Worker actor imports)

            return os.environ.get("GOMP_SPINCOUNT"), torch_first

    probe = Probe.remote()
    try:
        assert ray.get(probe.spin.remote()) == ("1000", False)
    finally:
        ray.kill(probe)
    assert "GOMP_SPINCOUNT" not in os.environ or os.environ.get("RAY_RAYLET_PID")
