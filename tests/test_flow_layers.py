"""Each name has one home low enough for every module that needs it (issue 49, items 3 and 7).

What tests/test_layers.py checks for the whole package, checked here name by name: who reads a model
directory and who writes one, who connects to Ray, what the parameter server, infer and the warm-up
import, and that the library's modules print to the terminal only through `logs`.
"""
from __future__ import annotations

import ast
import pathlib

import pytest
from test_layers import LAYERS, package_imports, parsed

PACKAGE = pathlib.Path(__file__).resolve().parent.parent / "doc2vec_dist"


def _tree(module: str) -> ast.Module:
    return parsed(PACKAGE / f"{module}.py")


def _defined_in(name: str) -> list[str]:
    """The package's modules that define `name` at their top level (a function, a class or an assignment)."""
    found = []
    for path in sorted(PACKAGE.glob("*.py")):
        for node in parsed(path).body:
            targets = ([node.name] if isinstance(node, (ast.FunctionDef, ast.ClassDef)) else
                       [t.id for t in node.targets if isinstance(t, ast.Name)] if isinstance(node, ast.Assign) else
                       [node.target.id] if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)
                       else [])
            if name in targets:
                found.append(path.stem)
    return found


def _calls(module: str, dotted: str) -> int:
    """How many calls of `dotted` (print, ray.init) the module's text makes."""
    def name(func: ast.expr) -> str:
        if isinstance(func, ast.Attribute):
            return f"{name(func.value)}.{func.attr}"
        return func.id if isinstance(func, ast.Name) else ""

    return sum(1 for node in ast.walk(_tree(module)) if isinstance(node, ast.Call) and name(node.func) == dotted)


@pytest.mark.parametrize("name", ["ModelDir", "KEY_TABLES", "load_manifest", "latest_version", "read_shard",
                                  "local_copy", "matrix_of", "vectors_array"])
def test_a_model_directory_is_read_by_modeldir(name):
    assert _defined_in(name) == ["modeldir"]


@pytest.mark.parametrize("name", ["commit", "commit_training", "write_slice", "start_model_dir", "resume_point",
                                  "writing"])
def test_a_model_directory_is_written_by_checkpoint(name):
    assert _defined_in(name) == ["checkpoint"]


def test_ingest_reads_a_base_model_without_the_engine():
    imports = package_imports()
    assert {m: "checkpoint" for m in LAYERS["ingest"] if "checkpoint" in imports.get(m, ())} == {}


def test_the_parameter_server_imports_no_warm_start_module():
    """ps reads an earlier model's rows (a warm start) but takes them as a value: it imports warmstart not even for
    a type, since warmstart is how a run from an earlier model is decided, a step before the servers."""
    assert "warmstart" not in package_imports()["ps"]


@pytest.mark.parametrize("name", ["PARQUET_OPTIONS", "key_vector_table"])
def test_what_infer_and_export_both_write_with_has_one_home_below_both(name):
    homes = _defined_in(name)
    assert len(homes) == 1, homes
    layer = {module: layer for layer, modules in LAYERS.items() for module in modules}
    assert list(LAYERS).index(layer[homes[0]]) <= list(LAYERS).index("model"), homes


def test_infer_imports_nothing_of_serving():
    assert package_imports()["infer"] & LAYERS["serving"] == set()


@pytest.mark.parametrize("name", ["connect", "ray_connection", "local_object_store_bytes"])
def test_one_module_owns_the_ray_connection(name):
    homes = [m for m in _defined_in(name) if not (name == "connect" and m == "client")]  # client.connect: to servers
    assert homes == ["cluster"]


def test_only_the_cluster_module_starts_or_joins_ray():
    assert [m for m in sorted(p.stem for p in PACKAGE.glob("*.py")) if _calls(m, "ray.init")] == ["cluster"]


def test_warmup_compiles_without_prepare_or_generated_logs():
    assert package_imports()["warmup"] & {"prepare", "synthetic", "readers", "passes"} == set()


@pytest.mark.parametrize("module", ["evaluate", "environment"])
def test_the_library_prints_to_the_terminal_through_logs(module):
    assert _calls(module, "print") == 0
    assert "logs" in package_imports()[module]
