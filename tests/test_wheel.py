"""The wheel is the product: what `pip install` gives a user must run on its own, outside this checkout.

`test_the_wheel_runs_from_an_empty_directory` builds the wheel from a copy of the tree (no build folders left in
it), installs it with `--no-deps --no-index` into a fresh venv outside the checkout whose site-packages links every
distribution of this test's venv but the project (the dependencies as `make` installed them, from
constraints-cpu.txt: no network, and minutes less than installing them again), checks them with `pip check`
against the wheel's declared requirements, and runs `ctrpipe --version` and a one-day `ctrpipe demo` (on the session's
Prefect server) from an empty directory.
The packages must come from the venv (not the tree) with their package data: every file of the four packages
that is not Python (the attention kernel's C source) is in the wheel, and found beside the installed module.

`test_every_import_is_a_declared_dependency` reads the four packages' imports (their AST, function-local ones
too) and holds them to pyproject.toml: each third-party module's distribution is a dependency (or one a
dependency's extra brings: dask[distributed]), or one of a runtime extra (serve, onnx, s3) imported only where an
ImportError is caught or inside a function; and each dependency is imported somewhere.
"""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
import tomllib
import zipfile
from importlib.metadata import packages_distributions, requires
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from storage.io.version import VERSION

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("flows", "pipeline", "trainer", "storage")
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
RUNTIME_EXTRAS = ("serve", "onnx", "s3")
"""The extras a user installs to run something (`test` and `bench` are for this checkout)."""
EXTRA_MODULES = {"flows.serving.app": "serve"}
"""Modules that import an extra's distribution at module level, each imported only inside functions (the score
server's app, imported once `flows.serving.server` has checked that the `serve` extra is installed)."""


# ---- the wheel ----------------------------------------------------------------------------------
def _package_files() -> list[str]:
    """The files of the four packages that are not Python (nor caches): the package data the wheel must hold."""
    return sorted(
        str(p.relative_to(REPO))
        for pkg in PACKAGES
        for p in (REPO / pkg).rglob("*")
        if p.is_file() and p.suffix not in (".py", ".pyc") and "__pycache__" not in p.parts
    )


def _site_packages(venv: Path) -> Path:
    return venv / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"


def _clean_venv(venv: Path) -> Path:
    """A venv whose site-packages links every entry of this interpreter's but the project's own (its editable
    install's finder and metadata) and the `.pth` files (none of them is a dependency)."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    ours = Path(next(p for p in sys.path if p.endswith("site-packages") and Path(p, "torch").exists()))
    site = _site_packages(venv)
    for entry in ours.iterdir():
        name = entry.name
        if (
            name.startswith(("__editable__", "ctr_pipeline"))
            or name.endswith(".pth")
            or name in (*PACKAGES, "__pycache__")
        ):
            continue
        (site / name).symlink_to(entry)
    return venv


@pytest.mark.slow
@pytest.mark.subprocess
def test_the_wheel_runs_from_an_empty_directory(tmp_path, prefect_api):
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(REPO / name, src / name)
    for pkg in PACKAGES:
        shutil.copytree(REPO / pkg, src / pkg, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    pip = [sys.executable, "-m", "pip"]
    built = subprocess.run(
        [
            *pip,
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "--no-index",
            "-q",
            "-w",
            str(tmp_path / "dist"),
            str(src),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert built.returncode == 0, built.stderr[-3000:]
    (wheel,) = (tmp_path / "dist").glob("*.whl")
    assert wheel.name == f"ctr_pipeline-{VERSION}-py3-none-any.whl"
    held = set(zipfile.ZipFile(wheel).namelist())
    data = _package_files()
    assert "trainer/models/attention_native.c" in data
    assert not [f for f in data if f not in held], "package data missing from the wheel: see [tool.setuptools]"

    venv = _clean_venv(tmp_path / "venv")
    python = str(venv / "bin" / "python")
    for step in (["install", "--no-deps", "--no-index", "-q", str(wheel)], ["check"]):
        done = subprocess.run([python, "-m", "pip", *step], capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, (step, done.stdout[-2000:], done.stderr[-2000:])

    empty = tmp_path / "empty"
    empty.mkdir()
    # a user's shell: none of the suite's logging, CTRPIPE or Dask settings, not this checkout; the session's Prefect
    # server (a temporary one is the CLI's own part, started by tests/flows/cli/test_main.py's demo)
    drop = ("CTRPIPE_", "PREFECT_LOGGING_", "DASK_", "PREFECT_API_URL", "PYTHONPATH", "VIRTUAL_ENV")
    env = {k: v for k, v in os.environ.items() if not k.startswith(drop)}
    env.update(
        PATH=f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}",
        HOME=str(tmp_path / "home"),
        PREFECT_HOME=str(tmp_path / "prefect"),
        PREFECT_API_URL=prefect_api,
    )

    def here(*args: str, timeout: int = 60) -> subprocess.CompletedProcess[str]:
        return subprocess.run(args, cwd=empty, env=env, capture_output=True, text=True, timeout=timeout)

    version = here("ctrpipe", "--version")
    assert version.returncode == 0 and version.stdout.strip() == f"ctrpipe {VERSION}", version
    where = here("python", "-c", "import flows, trainer.models.attention_native as a; print(flows.__file__, a.SOURCE)")
    files = [Path(p) for p in where.stdout.split()]
    site = _site_packages(venv)
    assert len(files) == 2 and all(p.is_relative_to(site) for p in files), (where.stdout, where.stderr)
    assert files[1].is_file(), "the attention kernel's C source is not installed beside its module"
    # one day: every stage of the installed packages runs (a warm second day: tests/flows/cli/test_main.py's demo)
    demo = here("ctrpipe", "demo", "--days", "1", "--rows-per-day", "2000", timeout=600)
    assert demo.returncode == 0, demo.stdout[-2000:] + demo.stderr[-3000:]
    assert "publish: v00001 is now LATEST" in demo.stderr, demo.stderr[-3000:]
    assert (empty / "demo-data" / "models" / "ctr" / "v00001").is_dir()


# ---- the imports -------------------------------------------------------------------------------
def _imports() -> dict[str, set[tuple[str, bool]]]:
    """Third-party top-level module -> {(the importing module, guarded)}: guarded when it is imported inside a
    function or a `try` that catches ImportError."""
    found: dict[str, set[tuple[str, bool]]] = {}

    def visit(node: ast.AST, module: str, guarded: bool) -> None:
        if isinstance(node, ast.Import | ast.ImportFrom):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
            if isinstance(node, ast.ImportFrom) and node.level:
                names = []
            for name in names:
                top = name.split(".")[0]
                if top and top not in sys.stdlib_module_names and top not in PACKAGES and top != "__future__":
                    found.setdefault(top, set()).add((module, guarded))
        inner = guarded or isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        if isinstance(node, ast.Try):
            caught = " ".join(ast.unparse(h.type) for h in node.handlers if h.type is not None)
            catches = "ImportError" in caught or "ModuleNotFoundError" in caught
            for child in node.body:
                visit(child, module, inner or catches)
            for child in (*node.handlers, *node.orelse, *node.finalbody):
                visit(child, module, inner)
            return
        for child in ast.iter_child_nodes(node):
            visit(child, module, inner)

    for pkg in PACKAGES:
        for path in sorted((REPO / pkg).rglob("*.py")):
            module = ".".join(path.relative_to(REPO).with_suffix("").parts).removesuffix(".__init__")
            visit(ast.parse(path.read_text()), module, False)
    return found


def _distributions(requirements: list[str]) -> set[str]:
    """The distributions `requirements` name, with those their extras bring (`dask[distributed]`: distributed)."""
    names = set()
    for text in requirements:
        req = Requirement(text)
        names.add(canonicalize_name(req.name))
        for extra in req.extras:
            for sub in requires(req.name) or []:
                dep = Requirement(sub)
                if dep.marker is not None and dep.marker.evaluate({"extra": extra}):
                    names.add(canonicalize_name(dep.name))
    return names


def test_every_import_is_a_declared_dependency():
    project = PYPROJECT["project"]
    core = _distributions(project["dependencies"])
    extras = {e: _distributions(project["optional-dependencies"][e]) for e in RUNTIME_EXTRAS}
    of = packages_distributions()
    imports = _imports()
    problems, used = [], set()
    for top, where in sorted(imports.items()):
        dists = {canonicalize_name(d) for d in of.get(top, [top])}
        used |= dists
        if dists & core:
            continue
        extra = [e for e, names in extras.items() if dists & names]
        if not extra:
            problems.append(
                f"{top} (distribution {sorted(dists)}) is imported by {sorted(m for m, _ in where)}, "
                "declared nowhere in pyproject.toml"
            )
            continue
        bare = sorted(m for m, guarded in where if not guarded and EXTRA_MODULES.get(m) not in extra)
        if bare:
            problems.append(f"{top} (extra {extra[0]}) is imported unguarded at module level by {bare}")
    problems += _module_level_importers(set(EXTRA_MODULES))  # imported only inside functions
    unused = sorted(core - used - _brought_by_extras(project["dependencies"]))
    assert not unused, f"dependencies no module imports: {unused}"
    assert not problems, "\n".join(problems)


def _brought_by_extras(requirements: list[str]) -> set[str]:
    """What a dependency's extras bring besides the distributions the code imports (dask[dataframe]'s pandas and
    pyarrow are imported; its others are dask's business)."""
    return _distributions(requirements) - {canonicalize_name(Requirement(r).name) for r in requirements}


def _module_level_importers(modules: set[str]) -> list[str]:
    """`module imports X at module level` for each module of the packages that imports one of `modules` outside
    a function."""
    out = []
    for pkg in PACKAGES:
        for path in sorted((REPO / pkg).rglob("*.py")):
            importer = ".".join(path.relative_to(REPO).with_suffix("").parts).removesuffix(".__init__")
            for node in ast.parse(path.read_text()).body:
                if isinstance(node, ast.ImportFrom) and node.module in modules:
                    out.append(f"{importer} imports {node.module} at module level (import it inside the function)")
    return out
