"""The documentation: the site builds in strict mode, every shell block a user pastes is run here or marked
as needing what a test run lacks, the flags page matches the code, and no library docstring or comment
carries a dated measurement.

Marker convention, on the line before a ```bash, ```sh, ```shell or ```console block:
    <!-- needs: cluster|gpu|install|time|data -->   not run here: a Ray cluster, a GPU, a fresh venv
                                                   (downloads), a long run (a benchmark), or your own data
    <!-- run-by: PATH[::TEST] -->                  run by that test (or script); the test checks it exists
A block without a marker is run by this file, in a temporary directory, so it must be cheap.

Regenerate docs/flags.md after changing a flag:  PYTHONPATH=. python tests/test_docs.py
"""

from __future__ import annotations

import contextlib
import glob
import importlib.util
import io
import os
import re
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHELL_LANGS = {"bash", "sh", "shell", "console"}
NEEDS = {"cluster", "gpu", "install", "time", "data"}
HELP_COLUMNS = "100"  # argparse wraps help to the terminal; the page is made at one width


def read(path: str) -> str:
    with open(path, encoding="utf-8") as fh:
        return fh.read()


def doc_files() -> list[str]:
    return [os.path.join(ROOT, "README.md"), *sorted(glob.glob(os.path.join(ROOT, "docs", "*.md")))]


def shell_blocks(path: str) -> list[tuple[int, str | None, str]]:
    """(line number, marker or None, code) of each shell code block of a Markdown file."""
    lines = read(path).split("\n")
    blocks, i = [], 0
    while i < len(lines):
        fence = re.match(r"^(\s*)```(\w*)\s*$", lines[i])
        if not fence:
            i += 1
            continue
        start, lang = i, fence.group(2)
        end = next(j for j in range(i + 1, len(lines)) if lines[j].strip() == "```")
        if lang in SHELL_LANGS:
            before = next((lines[j].strip() for j in range(start - 1, -1, -1) if lines[j].strip()), "")
            marker = re.fullmatch(r"<!--\s*(.+?)\s*-->", before)
            blocks.append((start + 1, marker.group(1) if marker else None, "\n".join(lines[start + 1:end])))
        i = end + 1
    return blocks


def all_blocks() -> list[tuple[str, int, str | None, str]]:
    return [(os.path.relpath(p, ROOT), n, m, code) for p in doc_files() for n, m, code in shell_blocks(p)]


def marker_problems(blocks: list[tuple[str, int, str | None, str]]) -> list[str]:
    """What is wrong with the blocks' markers: a need not in NEEDS, a test that does not exist, another marker."""
    problems = []
    for path, line, marker, _ in blocks:
        where = f"{path}:{line}"
        if marker is None:
            continue
        kind, _, value = marker.partition(":")
        kind, value = kind.strip(), value.strip()
        if kind == "needs":
            if value not in NEEDS:
                problems.append(f"{where}: unknown need {value!r} (one of {sorted(NEEDS)})")
        elif kind == "run-by":
            target, _, test = value.partition("::")
            if not os.path.exists(os.path.join(ROOT, target)):
                problems.append(f"{where}: {target} does not exist")
            elif test and not re.search(rf"^def {re.escape(test)}\(",
                                        read(os.path.join(ROOT, target)), re.MULTILINE):
                problems.append(f"{where}: no {test} in {target}")
        else:
            problems.append(f"{where}: unknown marker <!-- {marker} -->")
    return problems


def test_every_shell_block_is_run_or_marked():
    """A marker names a known need, or a test that exists; a block with neither is run below."""
    blocks = all_blocks()
    assert len(blocks) > 5, "few shell blocks found: the extraction is broken"
    assert marker_problems(blocks) == []


@pytest.mark.parametrize("block", [b for b in all_blocks() if b[2] is None], ids=lambda b: f"{b[0]}:{b[1]}")
def test_unmarked_shell_blocks_run(block, tmp_path):
    """Each unmarked block runs as a user would paste it: from a directory holding the repository's data
    and jobs, with the installed command on the PATH."""
    path, line, _, code = block
    for name in ("data", "jobs"):
        os.symlink(os.path.join(ROOT, name), tmp_path / name)
    env = {**os.environ, "PYTHONPATH": ROOT, "PATH": os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"]}
    done = subprocess.run(["bash", "-euo", "pipefail", "-c", code], cwd=tmp_path, env=env, check=False, capture_output=True,
                          text=True, timeout=240)
    assert done.returncode == 0, f"{path}:{line} failed ({done.returncode}):\n{done.stderr[-3000:]}"


def test_marker_check_catches_an_unknown_need_and_a_missing_test(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("<!-- needs: moon -->\n```bash\necho\n```\n\ntext\n\n```console\nls\n```\n\n"
                    "<!-- run-by: tests/test_docs.py::no_such_test -->\n```sh\nx\n```\n```python\nprint()\n```\n"
                    "<!-- run-by: tests/test_docs.py::flags_page -->\n```bash\ny\n```\n")
    found = shell_blocks(str(page))
    assert [(n, m) for n, m, _ in found] == [(2, "needs: moon"), (8, None), (13, "run-by: tests/test_docs.py::no_such_test"),
                                            (20, "run-by: tests/test_docs.py::flags_page")]
    problems = marker_problems([("page.md", n, m, code) for n, m, code in found])
    assert len(problems) == 2 and "moon" in problems[0] and "no_such_test" in problems[1]


def _help(parse, prog: str) -> str:
    """What a job's parse(["--help"]) prints before it exits, its usage line naming `prog`."""
    out, argv0 = io.StringIO(), sys.argv[0]
    sys.argv[0] = prog  # argparse's default prog
    try:
        with contextlib.redirect_stdout(out), contextlib.suppress(SystemExit):
            parse(["--help"])
    finally:
        sys.argv[0] = argv0
    return out.getvalue().rstrip()


def flags_page() -> str:
    """docs/flags.md: the --help of every command and job, as the code prints it."""
    old = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = HELP_COLUMNS
    sys.path.insert(0, ROOT)
    try:
        from doc2vec_dist.cli import make_parser

        parser = make_parser()
        commands = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction").choices
        parts = ["# Every flag", "",
                 "Generated from the code's `--help` (`PYTHONPATH=. python tests/test_docs.py` writes it again;",
                 "`tests/test_docs.py` fails while it differs). How the commands behave: [commands.md](commands.md).",
                 "", "## doc2vec-dist", "", "```text", parser.format_help().rstrip(), "```"]
        for name, sub in commands.items():
            parts += ["", f"## doc2vec-dist {name}", "", "```text", sub.format_help().rstrip(), "```"]
        for job in ("train", "refresh", "export", "index"):
            spec = importlib.util.spec_from_file_location(f"{job}_job_help", os.path.join(ROOT, "jobs", f"{job}.py"))
            module = importlib.util.module_from_spec(spec)
            sys.modules[spec.name] = module  # where its dataclasses look their annotations up
            spec.loader.exec_module(module)
            text = _help(module.parse, f"{job}.py")
            parts += ["", f"## jobs/{job}.py", "", "```text", text, "```"]
        parts += ["", "## jobs/tune.py", "", "`python jobs/tune.py ARGS` is `doc2vec-dist tune ARGS`, submitted as a Ray job."]
        return "\n".join(parts) + "\n"
    finally:
        if old is None:
            os.environ.pop("COLUMNS", None)
        else:
            os.environ["COLUMNS"] = old


def test_flags_page_matches_the_code():
    written = read(os.path.join(ROOT, "docs", "flags.md"))
    assert written == flags_page(), "docs/flags.md is stale: PYTHONPATH=. python tests/test_docs.py"


def test_mkdocs_builds_strict(tmp_path):
    """A broken link, a missing page or a page left out of the navigation fails the build."""
    mkdocs = shutil.which("mkdocs", path=os.path.dirname(sys.executable)) or shutil.which("mkdocs")
    assert mkdocs, "mkdocs is in the dev extras: pip install -e '.[dev]'"
    done = subprocess.run([mkdocs, "build", "--strict", "--site-dir", str(tmp_path / "site")], cwd=ROOT,
                          check=False, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert (tmp_path / "site" / "benchmarks" / "index.html").exists()


def test_mkdocs_strict_fails_on_a_broken_link(tmp_path):
    """The strict build is what catches a broken link (so the test above can fail)."""
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "index.md").write_text("# x\n\n[gone](gone.md)\n")
    (tmp_path / "mkdocs.yml").write_text("site_name: x\nnav:\n  - index.md\n")
    mkdocs = shutil.which("mkdocs", path=os.path.dirname(sys.executable)) or shutil.which("mkdocs")
    done = subprocess.run([mkdocs, "build", "--strict", "--site-dir", str(tmp_path / "site")], cwd=tmp_path,
                          check=False, capture_output=True, text=True, timeout=120)
    assert done.returncode != 0 and "gone.md" in done.stdout + done.stderr


def test_no_page_links_outside_the_repository():
    for path in doc_files():
        text = read(path)
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"[a-z]+://", target) or target.startswith("#"):
                continue
            resolved = os.path.normpath(os.path.join(os.path.dirname(path), target.split("#")[0]))
            assert resolved.startswith(ROOT + os.sep), f"{path}: {target} is outside the repository"
            assert os.path.exists(resolved), f"{path}: {target} does not exist"


def test_readme_stays_short():
    assert os.path.getsize(os.path.join(ROOT, "README.md")) <= 12 * 1024


def test_the_readme_picture_is_drawn_from_the_committed_figures(tmp_path):
    out = tmp_path / "q.png"
    done = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "plot.py"),
                           os.path.join(ROOT, "benchmarks", "results", "quality-2026-11-25.json"), "--out", str(out)],
                          check=False, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and "5 set(s)" in done.stdout
    empty = tmp_path / "workers.json"
    empty.write_text('{"results": [{"set": "lee", "differences": {}}]}')
    done = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "plot.py"), str(empty), "--out",
                           str(tmp_path / "x.png")], check=False, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and done.stderr.startswith("error: ") and len(done.stderr.splitlines()) == 1


# Dated measurements belong in docs/benchmarks.md, not in the code a reader opens to learn what a function
# does: a rate in millions of tokens (or rows, queries) per second, or a date.
MEASUREMENT = re.compile(r"\d ?M (?:tokens|rows|queries)/s|queries/s|\b20\d\d-\d\d-\d\d\b|measured on this|"
                         r"on this (?:project's |2-core )+machine", re.IGNORECASE)


def dated_measurements(source: str) -> list[tuple[int, str]]:
    return [(n, line.strip()) for n, line in enumerate(source.split("\n"), 1) if MEASUREMENT.search(line)]


def test_no_dated_measurement_in_library_code():
    found = [f"{os.path.relpath(p, ROOT)}:{n}: {line}"
             for p in sorted(glob.glob(os.path.join(ROOT, "doc2vec_dist", "*.py")))
             for n, line in dated_measurements(read(p))]
    assert not found, "dated measurements (move them to docs/benchmarks.md):\n" + "\n".join(found)


def test_the_measurement_check_catches_what_it_is_for():
    assert dated_measurements('"""2.07-2.84M tokens/s against 1.68-1.97M"""') != []
    assert dated_measurements("# measured on 2026-11-22: 1.2M tokens/s") != []
    assert dated_measurements("# Measured on this 2-core machine at load ~10: 28 s spinning, 4.4 s sleeping") != []
    assert dated_measurements("# 13.7k vs 13.6k queries/s") != []
    assert dated_measurements('"""One worker holding every row writes them alone, so its rounds only cost calls."""') == []
    assert dated_measurements("macro_batch: int = 262_144  # tokens per round") == []
    assert dated_measurements('help="auto: flat up to 1M rows, else ivfpq"') == []  # a size, not a rate


if __name__ == "__main__":
    with open(os.path.join(ROOT, "docs", "flags.md"), "w", encoding="utf-8") as fh:
        fh.write(flags_page())
    print("wrote docs/flags.md")
