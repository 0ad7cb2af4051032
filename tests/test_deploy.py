"""deploy/: the manifests parse, cluster.yaml passes Ray's own schema, and what they name agrees with the code
(image, Ray and torch versions, custom resources, entry points, token auth, dashboard exposure, /dev/shm)."""

from __future__ import annotations

import copy
import glob
import importlib.util
import json
import os
import re
import shlex

import jsonschema
import pytest
import ray
import yaml

from doc2vec_dist import placement

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEPLOY = os.path.join(ROOT, "deploy")
IMAGE_RE = re.compile(r"^(?P<repo>[a-z0-9.\-/]+)/doc2vec-dist:(?P<version>[0-9][0-9.]*)-(?P<variant>cpu|cuda)$")
SECRET = "doc2vec-dist-ray-token"
SHARED = "/mnt/shared"


def load(path: str) -> dict:
    with open(os.path.join(ROOT, path)) as fh:
        return yaml.safe_load(fh)


def text(path: str) -> str:
    with open(os.path.join(ROOT, path)) as fh:
        return fh.read()


def package_version() -> str:
    return re.search(r'^version = "([^"]+)"', text("pyproject.toml"), re.MULTILINE).group(1)


def ray_groups(spec: dict) -> dict[str, dict]:
    """name → group of a RayCluster spec ('head' for the head group)."""
    return {"head": spec["headGroupSpec"], **{g["groupName"]: g for g in spec["workerGroupSpecs"]}}


def custom_resources(group: dict) -> dict:
    raw = group["rayStartParams"].get("resources")
    # KubeRay's format: a JSON object inside a quoted string, backslashes included
    return json.loads(json.loads(raw)) if raw else {}


def quantity(q: str) -> int:
    units = {"Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30, "Ti": 1 << 40, "": 1}
    m = re.fullmatch(r"(\d+)(Ki|Mi|Gi|Ti|)", str(q))
    assert m, f"unexpected quantity {q!r}"
    return int(m.group(1)) * units[m.group(2)]


CLUSTERS = {"deploy/k8s/raycluster.yaml": lambda d: d["spec"],
            "deploy/k8s/rayjob.yaml": lambda d: d["spec"]["rayClusterSpec"]}


# -- parsing and Ray's schema ----------------------------------------------------------------------
def test_every_yaml_in_deploy_parses():
    files = glob.glob(os.path.join(DEPLOY, "**", "*.yaml"), recursive=True)
    assert len(files) >= 5
    for path in files:
        with open(path) as fh:
            docs = [d for d in yaml.safe_load_all(fh) if d is not None]
        assert docs and all(isinstance(d, dict) for d in docs), path
        for d in docs:
            if "apiVersion" in d:
                assert d.get("kind") and d.get("metadata", {}).get("name"), path


def test_cluster_yaml_validates_against_rays_schema():
    from ray.autoscaler._private.util import prepare_config, validate_config

    config = load("deploy/cluster.yaml")
    validate_config(prepare_config(copy.deepcopy(config)))  # what `ray up` runs before launching anything
    broken = copy.deepcopy(config)
    broken["available_node_types"]["ps"]["resources"] = {"ps": "eight"}
    with pytest.raises(jsonschema.ValidationError):  # the schema does bite
        validate_config(prepare_config(broken))


def test_kuberay_manifests_have_the_fields_kuberay_needs():
    for path, spec_of in CLUSTERS.items():
        doc = load(path)
        assert doc["apiVersion"] == "ray.io/v1", path
        spec = spec_of(doc)
        assert spec["rayVersion"] == ray.__version__, path  # the Ray the image pins and the tests run
        for name, group in ray_groups(spec).items():
            assert all(isinstance(v, str) for v in group["rayStartParams"].values()), (path, name)
            if name != "head":
                assert group["minReplicas"] <= group["replicas"] <= group["maxReplicas"], (path, name)
            [container] = group["template"]["spec"]["containers"]
            assert container["name"] and container["image"], (path, name)
    rayjob = load("deploy/k8s/rayjob.yaml")
    # the RayJob starts the very cluster raycluster.yaml describes
    assert rayjob["spec"]["rayClusterSpec"] == load("deploy/k8s/raycluster.yaml")["spec"]
    assert rayjob["spec"]["shutdownAfterJobFinishes"] is True


# -- resources agree with placement.py -------------------------------------------------------------
def test_launcher_node_types_carry_the_resources_placement_asks_for():
    config = load("deploy/cluster.yaml")
    types = config["available_node_types"]
    head = types[config["head_node_type"]]["resources"]
    assert head.get("CPU") == 0 and placement.PS_RESOURCE not in head and placement.TRAINER_RESOURCE not in head
    ps = [t for t in types.values() if placement.PS_RESOURCE in t["resources"]]
    trainers = [t for t in types.values() if placement.TRAINER_RESOURCE in t["resources"]]
    assert len(ps) == 1 and len(trainers) == 1 and ps[0] is not trainers[0]
    names = {k for t in types.values() for k in t["resources"]}
    assert names <= {"CPU", "GPU", placement.PS_RESOURCE, placement.TRAINER_RESOURCE}
    assert ps[0]["min_workers"] >= 1 and trainers[0]["min_workers"] >= 1  # GPUs are checked at job start
    assert trainers[0]["docker"]["worker_image"].endswith("-cuda")
    assert any("OBJECT_STORE_MEMORY_PROPORTION" in o for o in ps[0]["docker"]["worker_run_options"])


def test_kuberay_groups_carry_the_resources_placement_asks_for():
    for path, spec_of in CLUSTERS.items():
        groups = ray_groups(spec_of(load(path)))
        head = groups.pop("head")
        assert head["rayStartParams"]["num-cpus"] == "0" and not custom_resources(head), path
        by_resource = {name: custom_resources(g) for name, g in groups.items()}
        assert sorted(k for r in by_resource.values() for k in r) == sorted(
            [placement.PS_RESOURCE, placement.TRAINER_RESOURCE]), (path, by_resource)
        for name, group in groups.items():
            limits = group["template"]["spec"]["containers"][0]["resources"]["limits"]
            if placement.TRAINER_RESOURCE in by_resource[name]:
                gpus = int(limits["nvidia.com/gpu"])  # KubeRay's num-gpus comes from this limit
                assert by_resource[name][placement.TRAINER_RESOURCE] == gpus, (path, name)
                assert group["template"]["spec"]["containers"][0]["image"].endswith("-cuda")
            else:
                assert "nvidia.com/gpu" not in limits


def test_pod_memory_object_store_and_dev_shm_agree():
    for path, spec_of in CLUSTERS.items():
        for name, group in ray_groups(spec_of(load(path))).items():
            pod = group["template"]["spec"]
            container = pod["containers"][0]
            res = container["resources"]
            assert res["requests"] == res["limits"], (path, name)  # guaranteed QoS; KubeRay reads limits
            limit = quantity(res["limits"]["memory"])
            store = int(group["rayStartParams"]["object-store-memory"])
            ray_memory = int(group["rayStartParams"].get("memory", limit - store))
            assert store + ray_memory <= limit, (path, name)  # /dev/shm counts against the pod's limit
            volumes = {v["name"]: v for v in pod["volumes"]}
            mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
            shm = volumes[mounts["/dev/shm"]]["emptyDir"]
            assert shm["medium"] == "Memory" and quantity(shm["sizeLimit"]) >= store, (path, name)
            assert "persistentVolumeClaim" in volumes[mounts[SHARED]], (path, name)


# -- image, versions, Dockerfile -------------------------------------------------------------------
def all_images() -> list[tuple[str, str]]:
    """(file, image) for every image named in deploy/."""
    found = []
    launcher = load("deploy/cluster.yaml")
    found.append(("cluster.yaml", launcher["docker"]["image"]))
    for t in launcher["available_node_types"].values():
        if t.get("docker", {}).get("worker_image"):
            found.append(("cluster.yaml", t["docker"]["worker_image"]))
    for path in glob.glob(os.path.join(DEPLOY, "k8s", "*.yaml")):
        found += [(path, m) for m in re.findall(r"^\s*image:\s*(\S+)", text(path), re.MULTILINE)]
    return found


def test_one_image_name_everywhere_tagged_with_the_package_version():
    images = all_images()
    assert len(images) >= 8
    matches = {img: IMAGE_RE.match(img) for _, img in images}
    assert all(matches.values()), [i for i, m in matches.items() if not m]
    assert len({m["repo"] for m in matches.values()}) == 1
    assert {m["version"] for m in matches.values()} == {package_version()}
    documented = set(re.findall(r"--target (cpu|cuda)\s+-t (\S+)", text("deploy/README.md")))
    built = set(re.findall(r"--target (cpu|cuda)\s+-t (\S+)", text("deploy/Dockerfile")))
    assert documented == built and {v for v, _ in documented} == {"cpu", "cuda"}
    assert {img for _, img in images} == {img for _, img in documented}
    for variant, img in documented:
        assert IMAGE_RE.match(img)["variant"] == variant


def dockerfile_stages() -> dict[str, list[str]]:
    """stage name → its instructions (continuation lines joined, comments dropped)."""
    lines, current = [], ""
    for line in text("deploy/Dockerfile").splitlines():
        if line.lstrip().startswith("#"):
            continue
        current += line.rstrip("\\").strip() + " "
        if not line.endswith("\\"):
            if current.strip():
                lines.append(current.strip())
            current = ""
    stages: dict[str, list[str]] = {"": []}
    name = ""
    for line in lines:
        m = re.match(r"FROM\s+(\S+)\s+AS\s+(\S+)", line, re.IGNORECASE)
        if m:
            name = m.group(2)
            stages[name] = [line]
        else:
            stages[name].append(line)
    return stages


def test_dockerfile_builds_both_variants_from_pyproject():
    stages = dockerfile_stages()
    assert set(stages) == {"", "cpu", "cuda"}
    args = dict(re.match(r"ARG (\w+)=(\S+)", line).groups() for line in stages[""])
    torch_pin = re.search(r"torch==([\d.]+)", text(".ci/run")).group(1)
    assert args["TORCH_VERSION"] == torch_pin  # the same torch as the README and CI install
    assert args["RAY_VERSION"] == ray.__version__
    assert stages["cpu"][0].startswith("FROM python:") and stages["cuda"][0].startswith("FROM nvidia/cuda:")
    for name, body in stages.items():
        if not name:
            continue
        joined = "\n".join(body)
        assert "WORKDIR /app" in joined
        torch = next(i for i, line in enumerate(body) if '"torch==${TORCH_VERSION}"' in line)
        project = next(i for i, line in enumerate(body) if re.match(r"COPY pyproject\.toml", line))
        install = next(i for i, line in enumerate(body) if re.match(r'RUN pip install \. "ray\[default\]==\$\{RAY_VERSION\}"', line))
        assert torch < project < install, name  # torch first, so `pip install .` keeps that build
        if name == "cpu":
            assert "https://download.pytorch.org/whl/cpu" in body[torch]
        copied = [src for line in body if line.startswith("COPY ") for src in line.split()[1:-1]]
        assert {"pyproject.toml", "README.md", "doc2vec_dist", "jobs", "data"} <= set(copied), name
        for src in copied:
            assert os.path.exists(os.path.join(ROOT, src)), f"{name}: COPY {src} does not exist"
    ignored = text("deploy/Dockerfile.dockerignore").split()
    assert ".venv" in ignored and "runs" in ignored


# -- entry points ----------------------------------------------------------------------------------
def load_job():
    spec = importlib.util.spec_from_file_location("train_job_deploy", os.path.join(ROOT, "jobs", "train.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_rayjob_entrypoint_runs_jobs_train_py_with_flags_it_accepts(monkeypatch):
    argv = shlex.split(load("deploy/k8s/rayjob.yaml")["spec"]["entrypoint"])
    assert argv[:2] == ["python", "/app/jobs/train.py"]
    # /app in the image is the repository root (Dockerfile: WORKDIR /app, COPY jobs, data)
    local = [os.path.join(ROOT, a[len("/app/"):]) if a.startswith("/app/") else a for a in argv[2:]]
    for arg, path in zip(argv[2:], local):
        if arg.startswith("/app/"):
            assert os.path.exists(path), arg
    monkeypatch.chdir(ROOT)
    job, prep, cfg, origin = load_job().parse(local)
    config = origin.config
    assert config.endswith("jobs/configs/multinode.yaml") and cfg.gpus_per_worker == 1
    assert all(p.startswith(SHARED) for p in (job.corpus, job.out, job.exports, prep.holdout_out))


def test_commands_in_deploy_name_files_that_exist():
    mentioned = set()
    for path in glob.glob(os.path.join(DEPLOY, "**", "*"), recursive=True):
        if os.path.isfile(path):
            mentioned |= set(re.findall(r"(?<![\w/])(jobs/[\w/]+\.(?:py|yaml))", text(path)))
    assert "jobs/train.py" in mentioned and "jobs/configs/multinode.yaml" in mentioned
    for rel in mentioned:
        assert os.path.exists(os.path.join(ROOT, rel)), rel
    readme = text("deploy/README.md")
    assert "ray job submit --address http://127.0.0.1:8265 --working-dir . --" in readme
    assert "ray up deploy/cluster.yaml" in readme


def test_the_multinode_config_keeps_shared_paths_on_the_shared_mount():
    config = load("jobs/configs/multinode.yaml")
    for key in ("corpus", "out", "exports", "holdout_out"):
        assert config[key].startswith(SHARED + "/"), key
    launcher = load("deploy/cluster.yaml")
    assert f"--volume {SHARED}:{SHARED}" in launcher["docker"]["run_options"]
    assert any(SHARED in c for c in launcher["initialization_commands"])


# -- token auth and exposure -----------------------------------------------------------------------
def test_token_auth_is_on_and_the_token_comes_from_a_secret():
    launcher = load("deploy/cluster.yaml")
    run_options = launcher["docker"]["run_options"]
    assert "--env RAY_AUTH_MODE=token" in run_options
    token_path = next(o for o in run_options if "RAY_AUTH_TOKEN_PATH=" in o).split("=", 1)[1]
    mount = next(o for o in run_options if o.startswith("--volume") and os.path.dirname(token_path) in o)
    host_dir = mount.split()[1].split(":")[0]
    assert any("secretsmanager get-secret-value" in c and host_dir in c for c in launcher["initialization_commands"])
    assert "RAY_AUTH_TOKEN=" not in text("deploy/cluster.yaml")  # no token in the file

    for path, spec_of in CLUSTERS.items():
        doc = load(path)
        spec = spec_of(doc)
        assert spec["authOptions"] == {"mode": "token", "secretName": SECRET}, path
        envs = [c.get("env", []) for g in ray_groups(spec).values() for c in g["template"]["spec"]["containers"]]
        envs.append(spec["autoscalerOptions"]["env"])
        if doc["kind"] == "RayJob":
            envs += [c.get("env", []) for c in doc["spec"]["submitterPodTemplate"]["spec"]["containers"]]
        for env in envs:
            by_name = {e["name"]: e for e in env}
            assert by_name["RAY_AUTH_MODE"]["value"] == "token", path
            token = by_name["RAY_AUTH_TOKEN"]
            assert "value" not in token and token["valueFrom"]["secretKeyRef"] == {"name": SECRET, "key": "auth_token"}
    assert "kubectl create secret generic " + SECRET in text("deploy/README.md")


def test_the_dashboard_is_not_exposed_beyond_the_cluster():
    launcher = text("deploy/cluster.yaml")
    assert "0.0.0.0" not in launcher
    [head_start] = [c for c in load("deploy/cluster.yaml")["head_start_ray_commands"] if "ray start" in c]
    assert "--dashboard-host=127.0.0.1" in head_start

    policy = load("deploy/k8s/network-policy.yaml")
    assert policy["kind"] == "NetworkPolicy" and "Ingress" in policy["spec"]["policyTypes"]
    selected = policy["spec"]["podSelector"]["matchLabels"]
    for path, spec_of in CLUSTERS.items():
        spec = spec_of(load(path))
        head = spec["headGroupSpec"]
        # KubeRay needs the dashboard bound inside the head pod for its Service and the RayJob
        # submitter; it stays internal because the Service is ClusterIP and the policy admits only
        # the namespace and the operator
        assert head.get("serviceType") == "ClusterIP", path
        for group in ray_groups(spec).values():
            labels = group["template"]["metadata"]["labels"]
            assert selected.items() <= labels.items(), path
    for path in glob.glob(os.path.join(DEPLOY, "**", "*.yaml"), recursive=True):
        for doc in yaml.safe_load_all(text(path)):
            if isinstance(doc, dict):
                assert doc.get("kind") not in ("Ingress", "Route"), path
                assert "LoadBalancer" not in json.dumps(doc) and "NodePort" not in json.dumps(doc), path
