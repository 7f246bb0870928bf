"""The command-line options a training script declares, read from its source, never run.

After the script's name an option belongs to the script whenever the script
declares it (args.split), so ddptop must know the script's options before it
takes any of its own from there. They are read from the syntax tree of the
script and of the modules beside it that it imports (a `config.py` with the
parser), as the launch style is read (style.py):

- argparse and click: the option strings given to `add_argument`, `option`,
  typer's `Option` and any other call (click's "--x/--no-x" as both), and
  those a script looks for in `sys.argv` itself;
- typer and fire: the parameters of the functions they run (`@app.command`,
  `typer.run(main)`, `fire.Fire(main)`), spelled as each spells them;
- HfArgumentParser, tyro and simple-parsing: the fields of the script's
  dataclasses, with dashes and with underscores.

What cannot be read this way (options built at run time, a parser in an
installed package) is not known, and ddptop takes its own options there.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

from ddptop.core.usage import UsageError

MAX_FILES = 32
"""Source files read at most: the script and the modules beside it that it imports."""

DATACLASS_PARSERS = frozenset({"HfArgumentParser", "tyro", "simple_parsing"})
"""Names that, imported, turn a script's dataclasses into its options (transformers' parser is
imported by name; tyro's and simple-parsing's by their module's)."""

COMMAND_DECORATORS = frozenset({"command", "callback"})
"""typer's (and click's) decorators of a function whose parameters are options."""

FUNCTION_RUNNERS = frozenset({"run", "Fire"})
"""typer.run(main) and fire.Fire(main): main's parameters are options."""


def module_file(name: str) -> Path:
    """The file `python -m name` would run, found as the ranks will find it (the working
    directory first, then this Python's path), without importing anything."""
    parts = name.split(".")
    if not all(part.isidentifier() for part in parts):
        raise UsageError(f"-m {name}: not a module name")
    for base in (Path.cwd(), *(Path(p) for p in sys.path[1:] if p)):
        where = base.joinpath(*parts)
        for file in (where.with_suffix(".py"), where / "__main__.py"):
            if file.is_file():
                return file
    raise UsageError(f"-m {name}: no such module in {Path.cwd()} or this Python's path")


def declared_by(script: str, module: bool) -> frozenset[str]:
    """The options the script (a path, or with module a module's name) declares; none where
    it cannot be found or read: the launch's own checks say why, in their place."""
    try:
        source = module_file(script) if module else Path(script)
        return declared(source)
    except (UsageError, OSError):
        return frozenset()


def declared(script: Path) -> frozenset[str]:
    """The option strings the script and the modules beside it that it imports declare."""
    found: set[str] = set()
    seen: set[Path] = set()
    todo = [script.resolve()]
    while todo and len(seen) < MAX_FILES:
        path = todo.pop(0)
        if path in seen:
            continue
        seen.add(path)
        try:
            tree = ast.parse(path.read_bytes(), str(path))
        except (OSError, SyntaxError, ValueError):
            continue
        found |= _options(tree)
        todo += [p for p in _local_imports(tree, path, script.resolve().parent) if p not in seen]
    return frozenset(found)


def _options(tree: ast.AST) -> set[str]:
    found: set[str] = set()
    runs: set[str] = set()
    commands: list[ast.FunctionDef | ast.AsyncFunctionDef] = []
    functions: dict[str, ast.FunctionDef | ast.AsyncFunctionDef] = {}
    dataclasses: list[ast.ClassDef] = []
    parsers = False
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            found |= {word for arg in node.args for word in _option_words(arg)}
            if _last_name(node.func) in FUNCTION_RUNNERS and node.args and isinstance(node.args[0], ast.Name):
                runs.add(node.args[0].id)
        elif isinstance(node, ast.Compare) and any(isinstance(op, (ast.In, ast.Eq)) for op in node.ops):
            found |= set(_option_words(node.left))  # `"--fast" in sys.argv`
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            functions[node.name] = node
            if any(_last_name(d.func if isinstance(d, ast.Call) else d) in COMMAND_DECORATORS for d in node.decorator_list):
                commands.append(node)
        elif isinstance(node, ast.ClassDef) and any("dataclass" in ast.unparse(d) for d in node.decorator_list):
            dataclasses.append(node)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names = {alias.name.split(".")[0] for alias in node.names}
            if isinstance(node, ast.ImportFrom) and node.module:
                names.add(node.module.split(".")[0])
            parsers |= bool(names & DATACLASS_PARSERS)
    commands += [functions[name] for name in runs if name in functions]
    for function in commands:
        arguments = function.args
        defaults = [None] * (len(arguments.args) - len(arguments.defaults)) + list(arguments.defaults)
        pairs = [*zip(arguments.args, defaults), *zip(arguments.kwonlyargs, arguments.kw_defaults)]
        for arg, default in pairs:
            if arg.arg not in ("self", "ctx"):
                found |= _spellings(arg.arg, _is_bool(arg.annotation, default))
    if parsers:
        for cls in dataclasses:
            for item in cls.body:
                if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                    found |= _spellings(item.target.id, _is_bool(item.annotation, item.value))
    return found


def _option_words(node: ast.AST) -> list[str]:
    """The option strings a constant gives: "--clip-grad", and click's "--x/--no-x" as both."""
    if not isinstance(node, ast.Constant) or not isinstance(node.value, str) or not node.value.startswith("-"):
        return []
    return [part.strip() for part in node.value.split("/") if part.strip().startswith("-")]


def _spellings(name: str, boolean: bool) -> set[str]:
    """How the parsers that make options of names spell one: with dashes (typer, tyro), as written
    (fire, HfArgumentParser), and a boolean's negation (typer's --no-x, HfArgumentParser's --no_x)."""
    words = {f"--{name}", f"--{name.replace('_', '-')}"}
    if boolean:
        words |= {f"--no_{name}", f"--no-{name.replace('_', '-')}"}
    return words


def _is_bool(annotation: ast.expr | None, default: ast.expr | None) -> bool:
    return (annotation is not None and "bool" in ast.unparse(annotation)) or (
        isinstance(default, ast.Constant) and isinstance(default.value, bool)
    )


def _last_name(node: ast.AST) -> str | None:
    if isinstance(node, ast.Attribute):
        return node.attr
    return node.id if isinstance(node, ast.Name) else None


def _local_imports(tree: ast.AST, path: Path, root: Path) -> list[Path]:
    """The files of the modules this one imports that lie beside the script (or below its folder)."""
    files: list[Path] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [(root, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = path.parent
            for _ in range(max(0, node.level - 1)):
                base = base.parent
            start = base if node.level else root
            names = [(start, f"{node.module}.{alias.name}" if node.module else alias.name) for alias in node.names]
            if node.module:
                names.append((start, node.module))
        else:
            continue
        for start, dotted in names:
            where = start.joinpath(*dotted.split("."))
            for file in (where.with_suffix(".py"), where / "__init__.py"):
                if file.is_file() and file.resolve().is_relative_to(root):
                    files.append(file.resolve())
    return files
