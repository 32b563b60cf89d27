"""The architecture page's two tables, read from the code each time the manual is built: the public names
(``feedline.public.PUBLIC``, with each class's first docstring line) and the folders of the tree (each package's
docstring and how many modules it holds). Nothing is imported but ``feedline.public``; docstrings are read with
``ast``, so building the manual stays quick.

    <!-- public names -->
    <!-- moved paths -->
    <!-- tree datasets datasets/folder storage -->
"""

from __future__ import annotations

import ast
import importlib.util
import re
from pathlib import Path

from mkdocs.exceptions import PluginError

ROOT = Path(__file__).resolve().parents[2]
TREE = re.compile(r"<!-- tree ([\w/ ]+?) -->")


def on_page_markdown(markdown: str, **_) -> str:
    if "<!-- public names -->" in markdown:
        markdown = markdown.replace("<!-- public names -->", public_names())
    if "<!-- moved paths -->" in markdown:
        markdown = markdown.replace("<!-- moved paths -->", moved_paths())
    return TREE.sub(lambda m: tree(m[1].split()), markdown)


def public_names() -> str:
    from feedline.public import PUBLIC

    lines = ["| import path | what it is |", "|---|---|"]
    for package, names in PUBLIC.items():
        for name, module in names.items():
            key = f"`{package}.{name}`{{.feedline-key}}"
            lines.append(f"| {key} | {first_line(class_docstring(module, name))} |")
    return "\n".join(lines) + "\n"


def moved_paths() -> str:
    """feedline 0.1's module paths and where each is now (``feedline.moved``)."""
    from feedline.moved import MOVED, REPLACED, SPLIT

    lines = ["| feedline 0.1 | now |", "|---|---|"]
    for old in sorted({*MOVED, *REPLACED, *SPLIT}):
        now = [MOVED.get(old) or REPLACED.get(old) or (old if old not in MOVED else None)]
        now += [m for m in SPLIT.get(old, ()) if m not in now]
        shown = ", ".join(f"`{m}`" for m in now if m)
        lines.append(f"| `{old}`{{.feedline-key}} | {shown} |")
    return "\n".join(lines) + "\n"


def class_docstring(module: str, name: str) -> str:
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.origin:
        raise PluginError(f"public name {name}: module {module} not found")
    tree = ast.parse(Path(spec.origin).read_text(encoding="utf-8"))
    for node in tree.body:
        if isinstance(node, (ast.ClassDef, ast.FunctionDef)) and node.name == name:
            # a class without a docstring of its own: its module's says what it is
            return ast.get_docstring(node) or ast.get_docstring(tree) or ""
    raise PluginError(f"public name {name}: no class {name} in {spec.origin}")


def tree(folders: list[str]) -> str:
    lines = ["| folder | modules | its job |", "|---|---:|---|"]
    for folder in folders:
        path = ROOT / folder
        init = path / "__init__.py"
        if not init.is_file():
            raise PluginError(f"tree: {folder} is not a package of the repository")
        modules = [p for p in path.glob("*.py") if p.name != "__init__.py"]
        doc = ast.get_docstring(ast.parse(init.read_text(encoding="utf-8"))) or ""
        lines.append(f"| `{folder}/`{{.feedline-key}} | {len(modules)} | {first_line(doc)} |")
    return "\n".join(lines) + "\n"


def first_line(doc: str) -> str:
    """The first paragraph of a docstring, on one line, as a table cell."""
    text = " ".join(doc.strip().split("\n\n")[0].split())
    return text.replace("|", "\\|").replace("``", "`") or "—"
