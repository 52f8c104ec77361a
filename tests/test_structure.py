"""The project's shape: no module imports another that imports it back, at any depth.

Imports inside functions count too (they only defer the cycle); imports for type checking
alone do not (they never run).
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: package name -> the folder it lives in
PACKAGES = {"spark_jobs": ROOT / "spark_jobs", "streamops": ROOT / "plugins" / "streamops", "runner": ROOT / "runner"}
#: ...and what only this repository holds (no cycle there either)
REPOSITORY = PACKAGES | {"bench": ROOT / "bench", "tests": ROOT / "tests"}


def modules(packages: dict[str, Path] = PACKAGES) -> dict[str, Path]:
    found = {}
    for package, folder in packages.items():
        for path in folder.rglob("*.py"):
            parts = [package, *path.relative_to(folder).with_suffix("").parts]
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


def _type_checking_only(node: ast.AST) -> bool:
    return isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)


def imports(path: Path, name: str, known: set[str]) -> set[str]:
    """The project's modules ``path`` imports, wherever in the file (but for TYPE_CHECKING blocks)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    skipped = {id(n) for block in ast.walk(tree) if _type_checking_only(block) for s in block.body for n in ast.walk(s)}
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else []))
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
        else:
            continue
        found |= {t for t in targets if t in known and t != name}
    return found


def test_no_import_cycles() -> None:
    known = modules(REPOSITORY)
    graph = {name: imports(path, name, set(known)) for name, path in known.items()}
    cycles, state = [], {}

    def visit(node: str, trail: list[str]) -> None:
        state[node] = "open"
        for nxt in sorted(graph[node]):
            if state.get(nxt) == "open":
                cycles.append(" -> ".join([*trail[trail.index(nxt):], nxt]))
            elif nxt not in state:
                visit(nxt, [*trail, nxt])
        state[node] = "done"

    for name in sorted(graph):
        if name not in state:
            visit(name, [name])
    assert cycles == []


def test_every_package_installs() -> None:
    """A folder of modules missing from ``[tool.setuptools] packages`` would work here (the
    project is installed editable) and be missing from a real install (the image)."""
    import tomllib

    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["setuptools"]["packages"])
    found = {name for name, path in modules().items() if path.name == "__init__.py"}
    found |= {name.rpartition(".")[0] for name, path in modules().items() if path.name != "__init__.py"}
    assert found - listed == set()


def test_the_image_makes_every_package_folder_before_its_editable_install() -> None:
    import re
    import tomllib

    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["setuptools"]
    mapped = setuptools.get("package-dir", {})

    def folder(package: str) -> str:
        top, _, rest = package.partition(".")
        return "/".join(filter(None, [mapped.get(top, top), rest.replace(".", "/")]))

    made = set(re.search(r"RUN mkdir -p ([^&]+)&&", (ROOT / "Dockerfile").read_text(encoding="utf-8")).group(1)
               .replace("\\", " ").split())
    needed = {folder(p) for p in setuptools["packages"]}
    # a folder is made with its parents
    assert {f for f in needed if not any(m == f or m.startswith(f + "/") for m in made)} == set()


#: where a stream's spec and its layout meet: the spec's own package, the plan's compilation
#: (``plan``, and ``analysis``, which completes it with what only Spark knows), and the driver's
#: one call of it; everything else works from the compiled plan
COMPILATION = ("spark_jobs/stream_spec/", "spark_jobs/plan.py", "spark_jobs/analysis.py")
COMPILES = {("spark_jobs/stream_job.py", "_run")}


def test_only_the_plan_s_compilation_takes_a_spec_and_a_layout_together() -> None:
    found = []
    for name, path in modules(REPOSITORY).items():
        where = str(path.relative_to(ROOT))
        if where.startswith(COMPILATION) or name.startswith("tests."):
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and (where, node.name) not in COMPILES:
                args = {a.arg for a in node.args.args + node.args.kwonlyargs}
                if {"spec", "layout"} <= args:
                    found.append(f"{where}:{node.lineno} {node.name}")
    assert found == []
