"""The house's rules, checked on the source: what each wing may import, no
import cycle, and a recorded rank's start-up free of pyarrow."""
import ast
import os
import subprocess
import sys

import pytest

from helpers import ROOT

PKG = os.path.join(ROOT, "commprof")
ANALYZERS = os.path.join(ROOT, "analyzers")


def _modules():
    """{module name: file} of commprof, analyzers mapped to commprof.analyzers."""
    out = {}
    for base, name in ((PKG, "commprof"), (ANALYZERS, "commprof.analyzers")):
        for folder, _dirs, files in os.walk(base):
            if "__pycache__" in folder:
                continue
            rel = os.path.relpath(folder, base)
            parts = [name] + ([] if rel == "." else rel.split(os.sep))
            for f in files:
                if f.endswith(".py"):
                    mod = ".".join(parts + ([] if f == "__init__.py" else [f[:-3]]))
                    out[mod] = os.path.join(folder, f)
    return out


MODULES = _modules()


def _imports(mod: str):
    """Every commprof module ``mod`` imports, at any depth in the file
    (function-level imports included)."""
    path = MODULES[mod]
    is_pkg = path.endswith("__init__.py")
    tree = ast.parse(open(path).read())
    package = mod if is_pkg else mod.rsplit(".", 1)[0]
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                prefix = ".".join(base + ([node.module] if node.module else []))
            else:
                prefix = node.module or ""
            names = [prefix] + [f"{prefix}.{a.name}" for a in node.names]
        else:
            continue
        for n in names:
            if n.startswith("commprof") or n.startswith("analyzers"):
                while n and n not in MODULES:
                    n = n.rpartition(".")[0]
                if n and n != mod:
                    found.add(n)
    return found


GRAPH = {m: _imports(m) for m in MODULES}


def test_the_source_is_found():
    assert "commprof.trace.schema" in MODULES and "commprof.analyzers.scaling" in MODULES
    assert "commprof.record.instruments.ddp" in MODULES and "commprof.convert.kineto" in MODULES


def test_trace_imports_nothing_else_of_commprof():
    bad = {m: sorted(i for i in deps if not i.startswith("commprof.trace"))
           for m, deps in GRAPH.items() if m.startswith("commprof.trace")}
    assert not {m: d for m, d in bad.items() if d and d != ["commprof"]}, bad
    # not even the top-level package's lazy attributes
    assert all("commprof" not in deps for m, deps in GRAPH.items() if m.startswith("commprof.trace"))


@pytest.mark.parametrize("wing, forbidden", [
    ("commprof.analyzers", ("commprof.record", "commprof.render", "commprof.convert", "commprof.api",
                            "commprof.cli", "commprof.assemble")),
    ("commprof.convert", ("commprof.record", "commprof.analyzers", "commprof.render", "commprof.api",
                          "commprof.cli", "commprof.assemble")),
    ("commprof.render", ("commprof.record", "commprof.convert", "commprof.analyzers", "commprof.api",
                         "commprof.cli", "commprof.assemble")),
    ("commprof.record.instruments", ("commprof.analyzers", "commprof.render", "commprof.convert",
                                     "commprof.api", "commprof.assemble")),
])
def test_wings_import_only_below_them(wing, forbidden):
    bad = {m: sorted(d for d in deps if d.startswith(forbidden))
           for m, deps in GRAPH.items() if m.startswith(wing)}
    assert not {m: d for m, d in bad.items() if d}


def test_analyzers_never_plot():
    for mod, path in MODULES.items():
        if mod.startswith("commprof.analyzers"):
            tree = ast.parse(open(path).read())
            names = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
            names |= {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
            assert not any(n.split(".")[0] in ("plotly", "matplotlib") for n in names), mod


def test_no_import_cycle():
    """No cycle among modules, counting function-level imports too; the
    package ``__init__``s that only re-export lazily are left out (a
    package is imported before any of its modules anyway)."""
    graph = {m: {d for d in deps if d != "commprof"} for m, deps in GRAPH.items() if m != "commprof"}
    state, stack = {}, []

    def visit(m):
        state[m] = "open"
        stack.append(m)
        for d in sorted(graph.get(m, ())):
            if state.get(d) == "open":
                raise AssertionError("import cycle: " + " -> ".join(stack[stack.index(d):] + [d]))
            if d not in state:
                visit(d)
        stack.pop()
        state[m] = "done"

    for m in sorted(graph):
        if m not in state:
            visit(m)


def _fresh(code):
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)


def test_a_recorded_rank_starts_without_pyarrow_numpy_pandas():
    """What the bootstrap imports in every rank (session, instruments, the
    schema and journal modules) pulls in none of the heavy libraries."""
    proc = _fresh("import sys, commprof.record.session, commprof.record.instruments, "
                  "commprof.trace.schema, commprof.trace.journal, commprof.record.launcher\n"
                  "heavy = [m for m in ('pyarrow', 'numpy', 'pandas') if m in sys.modules]\n"
                  "print(','.join(heavy))")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == ""


def test_trace_alone_and_the_cli_parser_are_light():
    """The parser imports no analyzer and no recorder module but the
    recorder's option declarations (commprof/record/config.py), and neither
    pyarrow nor pandas."""
    proc = _fresh("import sys, commprof.trace.schema as s, commprof.cli as c\n"
                  "c.build_parser()\n"
                  "print([m for m in sys.modules if m.startswith('commprof.') and not m.startswith("
                  "('commprof.trace', 'commprof.cli', 'commprof.errors', 'commprof.render'))"
                  " and m not in ('commprof.record', 'commprof.record.config')])\n"
                  "print('pyarrow' in sys.modules, 'pandas' in sys.modules)")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split("\n")[:2] == ["[]", "False False"]


def test_category_codes_come_from_the_schema():
    from commprof.analyzers import events
    from commprof.trace import schema

    assert events.CAT_CODES is schema.CAT
    assert [schema.CAT[c] for c in schema.CATEGORIES] == list(range(len(schema.CATEGORIES)))
    for mod, path in MODULES.items():
        if mod.startswith("commprof.analyzers"):
            assert ".cat == " not in open(path).read().replace('.cat == CAT[', ''), mod


def test_a_checkout_runs_without_installing():
    """``PYTHONPATH=checkout python -m commprof`` with nothing installed
    (no editable install's finder): the analyzers
    resolve as ``commprof.analyzers`` from the checkout's analyzers/, as
    setup.cfg installs them (a GPU machine where nothing can be installed
    ran the report so; it failed with ModuleNotFoundError before)."""
    import sysconfig

    # site-packages as a plain folder: its .pth files (an editable install's
    # finder) are not processed
    code = (f"import sys; sys.path[:0] = [{ROOT!r}, {sysconfig.get_paths()['purelib']!r}]\n"
            "import commprof.analyzers.codes as c, commprof.analyzers as a\n"
            "print(a.__file__); print(c.__name__)")
    proc = subprocess.run([sys.executable, "-S", "-c", code], capture_output=True, text=True, cwd="/", timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == [os.path.join(ANALYZERS, "__init__.py"), "commprof.analyzers.codes"]


def test_a_checkout_uses_its_own_analyzers_beside_another_checkouts_install(tmp_path):
    """An editable install of another checkout (a finder mapping
    commprof.analyzers elsewhere) does not hand this checkout's commprof
    the other tree's analyzers."""
    import sysconfig

    other = tmp_path / "other" / "analyzers"
    other.mkdir(parents=True)
    (other / "__init__.py").write_text("")
    code = (f"import sys, importlib.util; sys.path[:0] = [{ROOT!r}, {sysconfig.get_paths()['purelib']!r}]\n"
            "class Other:\n"
            "    @staticmethod\n"
            "    def find_spec(name, path=None, target=None):\n"
            "        if name == 'commprof.analyzers':\n"
            f"            return importlib.util.spec_from_file_location(name, {str(other / '__init__.py')!r},\n"
            f"                submodule_search_locations=[{str(other)!r}])\n"
            "sys.meta_path.append(Other)\n"
            "import commprof.analyzers as a\n"
            "print(a.__file__)")
    proc = subprocess.run([sys.executable, "-S", "-c", code], capture_output=True, text=True, cwd="/", timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == [os.path.join(ANALYZERS, "__init__.py")]
