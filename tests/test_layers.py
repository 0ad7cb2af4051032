"""The package's shape (issue 49): layers that import only downward, modules a newcomer can read, short jobs.

The flow goes ingest -> engine -> model -> serving, and the commands sit on top. A module imports only
modules of its own layer or of a layer below it; every import counts, those inside functions and those
under `if TYPE_CHECKING:` too (a type drags in its module for the reader as much as for Python).
`python tests/test_layers.py` prints the import table: each layer's modules and what they import.
"""
from __future__ import annotations

import ast
import functools
import pathlib
import re
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "doc2vec_dist"

# lowest first; a module imports from its own layer or one listed before it
LAYERS: dict[str, set[str]] = {
    # what every layer uses: errors, files, settings' declarations, arithmetic with no model in it
    "base": {"errors", "logs", "storage", "outputs", "ids", "urls", "memwatch", "metrics", "runlog",
             "precision", "row_kernels", "sampling", "sharding", "environment", "config", "lr", "runners", "cluster"},
    # events and text in, the prepared corpus out
    "ingest": {"corpus", "modeldir", "readers", "read_files", "read_formats", "read_times", "synthetic",
               "prepare_base", "passes", "shard_pass", "raydata", "prepare_merge", "prepare_report", "prepare",
               "compact", "forgotten"},
    # training: the servers, the workers, their kernels and schedule, checkpoints, the run's settings
    "engine": {"checkpoint", "kernels", "cpu_kernel", "fused_kernels", "triton_kernel", "device_examples",
               "schedule", "placement", "ps", "client", "worker", "worker_blocks", "peers", "units", "run", "trainer", "warmup", "plan",
               "plan_model", "plan_calibration", "plan_report", "settings", "warmstart"},
    # a trained model's arithmetic: scoring, where vectors came from, URLs never seen, users never seen
    "model": {"scoring", "provenance", "compose", "infer"},
    # what users read out of a model: the Python object, exports, faiss indexes, quality figures
    "serving": {"model", "export", "index_sources", "index", "index_update", "evaluate", "baseline", "drift"},
    # the commands and the pipeline that strings the layers together
    "commands": {"cli", "tune", "search_space", "search_cost", "search_report", "report", "forget_files",
                 "forget_steps", "forget", "pipeline", "__main__", "__init__"},
}
ORDER = list(LAYERS)
ENGINE_CORE = {"trainer", "worker", "client", "ps", "schedule", "kernels"}
MAX_MODULE_LINES = 800
MAX_JOB_LINES = 60


def _layer_of() -> dict[str, str]:
    return {module: layer for layer, modules in LAYERS.items() for module in modules}


@functools.cache
def parsed(path: pathlib.Path) -> ast.Module:
    """A module's syntax tree, parsed once for every test of the layers (the files do not change during a run)."""
    return ast.parse(path.read_text(), str(path))


def package_imports() -> dict[str, set[str]]:
    """Each module of the package -> the package's modules it imports (anywhere in its text)."""
    found = {}
    for path in sorted(PACKAGE.glob("*.py")):
        deps = set()
        for node in ast.walk(parsed(path)):
            if isinstance(node, ast.ImportFrom) and node.level == 1:
                if node.module:
                    deps.add(node.module.split(".")[0])
                else:
                    deps.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("doc2vec_dist."):
                deps.add(node.module.split(".")[1])
            elif isinstance(node, ast.Import):
                deps.update(a.name.split(".")[1] for a in node.names if a.name.startswith("doc2vec_dist."))
        found[path.stem] = deps - {path.stem}
    return found


def upward_imports() -> list[str]:
    layer = _layer_of()
    wrong = []
    for module, deps in package_imports().items():
        for dep in sorted(deps):
            if dep in layer and module in layer and ORDER.index(layer[dep]) > ORDER.index(layer[module]):
                wrong.append(f"{module} ({layer[module]}) imports {dep} ({layer[dep]})")
    return wrong


def test_every_module_has_a_layer():
    unplaced = sorted(set(package_imports()) - set(_layer_of()))
    assert not unplaced, f"modules in no layer of tests/test_layers.py's LAYERS: {unplaced}"


def test_no_layer_imports_a_layer_above_it():
    assert upward_imports() == []


def test_the_engine_imports_nothing_of_the_trained_model_or_serving():
    imports = package_imports()
    wrong = {m: sorted(imports[m] & {"model", "index", "export", "infer"}) for m in ENGINE_CORE if m in imports}
    assert {m: d for m, d in wrong.items() if d} == {}


def test_no_module_passes_800_lines():
    long = {p.name: n for p in PACKAGE.glob("*.py") if (n := len(p.read_text().splitlines())) > MAX_MODULE_LINES}
    assert long == {}


def test_jobs_are_short_entry_points_that_import_no_private_name():
    wrong = []
    for path in sorted((ROOT / "jobs").glob("*.py")):
        text = path.read_text()
        if (n := len(text.splitlines())) > MAX_JOB_LINES:
            wrong.append(f"{path.name}: {n} lines")
        if "sys.path" in text:
            wrong.append(f"{path.name}: edits sys.path")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.ImportFrom):
                wrong += [f"{path.name}: imports {node.module}.{a.name}" for a in node.names if a.name.startswith("_")]
    assert wrong == []


@pytest.mark.parametrize("name", ["settle_segments"])
def test_a_runs_settings_are_resolved_in_one_place(name):
    """RunSettings.resolve decides the segments; nothing else calls the settling function."""
    callers = [f"{p.name}:{i}" for p in sorted(PACKAGE.glob("*.py"))
               for i, line in enumerate(p.read_text().splitlines(), 1)
               if re.search(rf"\b{name}\(", line) and not line.lstrip().startswith("def ")]
    assert len(callers) <= 1, callers


def test_the_how_it_works_diagram_is_the_layers():
    """docs/how-it-works.md's picture names every module in its layer, and no module that is not there."""
    text = (ROOT / "docs" / "how-it-works.md").read_text()
    block = text.split("## The layers", 1)[1].split("```text", 1)[1].split("```", 1)[0]
    drawn: dict[str, set[str]] = {}
    layer = None
    for line in block.splitlines():
        words = line.split()
        if not words or words == ["|"] or line.startswith(" " * 14):  # the arrows, and each layer's one-line gloss
            continue
        if words[0] in LAYERS:
            layer, words = words[0], words[1:]
        drawn.setdefault(layer, set()).update(words)
    modules = set(package_imports())
    assert drawn == {name: members & modules for name, members in LAYERS.items()}


def import_table() -> str:
    imports, layer = package_imports(), _layer_of()
    lines = ["| layer | module | lines | imports (package modules) |", "|---|---|---|---|"]
    for name in ORDER:
        for module in sorted(LAYERS[name] & set(imports)):
            lines.append(f"| {name} | {module} | {len((PACKAGE / f'{module}.py').read_text().splitlines())} | "
                         f"{', '.join(sorted(imports[module], key=lambda d: (ORDER.index(layer.get(d, 'base')), d)))} |")
    return "\n".join(lines)


if __name__ == "__main__":
    print(import_table())
    wrong = upward_imports()
    print("\n".join(["", "imports against the layers:"] + wrong) if wrong else "\nno import against the layers")
    sys.exit(1 if wrong else 0)
