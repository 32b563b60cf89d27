"""The configuration reference, generated from the typed option schemas each time the manual is built.

A page asks for a schema's table with an HTML comment, which this MkDocs hook replaces by the table:

    <!-- schema feedline.datamodules.options.DataConfig
    prefix: data
    conf: conf/data/default.yaml
    notes:
      num_workers: `auto`: CPUs per device minus one ...
    -->

Each row is one field of the dataclass (``dataclasses.fields``): its key, its type and default as the code
declares them, the value a YAML group of ``conf:`` sets instead (if any), and a description. The description
is the page's note for that key, else the comment written beside the field in the schema's source (read
with ``tokenize``: the trailing comment, and a comment block just above it; a ``noqa: CODE -`` prefix is
dropped). So a field added, removed, retyped or given another default changes the page without anyone
editing it; a field with no description at all, or a note for a key the schema does not have, fails the
build (a warning, which ``mkdocs build --strict`` turns into an error).
"""

from __future__ import annotations

import ast
import dataclasses
import enum
import importlib
import inspect
import io
import logging
import re
import tokenize
from pathlib import Path

import yaml
from mkdocs.exceptions import PluginError

log = logging.getLogger("mkdocs.hooks.reference")

ROOT = Path(__file__).resolve().parents[2]
MARKER = re.compile(r"<!-- schema (?P<target>[\w.]+)\n(?P<body>.*?)-->", re.S)
# Hydra's own keys mean the same in every schema.
GENERIC = {"_target_": "the class this config builds (Hydra's `_target_`)"}
NOQA = re.compile(r"^noqa:\s*[\w, ]+?(\s+-\s+|$)")


def on_page_markdown(markdown: str, page, **_) -> str:
    if "<!-- schema " not in markdown:
        return markdown
    return MARKER.sub(lambda m: render(m["target"], m["body"], page.file.src_uri), markdown)


def render(target: str, body: str, where: str = "?") -> str:
    """The Markdown table of the dataclass ``target`` (``module.Class``), as the marker's body asks."""
    spec = parse_body(body, f"{where}: schema {target}")
    cls = load(target)
    rows = schema_rows(cls, spec.get("notes", {}), spec.get("conf"), spec.get("conf_key"), target)
    prefix = spec.get("prefix", "")
    lines = ["| key | type | default | description |", "|---|---|---|---|"]
    for key, kind, default, description in rows:
        name = f"{prefix}.{key}" if prefix else key
        key = f"`{name}`{{.feedline-key}}"  # attr_list: a class that keeps the key on one line
        lines.append(f"| {key} | {cell(kind)} | {cell(default)} | {cell(description)} |")
    module, _, name = target.rpartition(".")
    source = Path(inspect.getsourcefile(cls)).resolve().relative_to(ROOT)
    intro = f"Schema: `{name}` in `{source}`"
    if spec.get("conf"):
        intro += ", extended by " + " and ".join(f"`{name}`" for name in spec["conf"].split())
    return intro + ".\n\n" + "\n".join(lines) + "\n"


def parse_body(body: str, where: str) -> dict:
    """``key: value`` lines, and ``notes:`` followed by indented ``key: text`` lines (continued when indented
    further)."""
    spec: dict = {}
    notes: dict[str, str] = {}
    current = None
    for raw in body.splitlines():
        if not raw.strip():
            continue
        indent = len(raw) - len(raw.lstrip())
        text = raw.strip()
        if indent == 0:
            key, sep, value = text.partition(":")
            if not sep:
                raise PluginError(f"{where}: '{text}' is not 'key: value'")
            if key != "notes":
                spec[key] = value.strip()
            current = None
        elif indent == 2:
            key, sep, value = text.partition(": ")
            if not sep:
                raise PluginError(f"{where}: note '{text}' is not 'key: text'")
            current = key
            notes[key] = value.strip()
        elif current is not None:
            notes[current] += " " + text
        else:
            raise PluginError(f"{where}: '{text}' is indented, but follows no note")
    spec["notes"] = notes
    return spec


def load(target: str) -> type:
    module, _, name = target.rpartition(".")
    try:
        cls = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as e:
        raise PluginError(f"schema {target}: cannot import it ({e})") from e
    if not dataclasses.is_dataclass(cls):
        raise PluginError(f"schema {target} is not a dataclass")
    return cls


def schema_rows(cls, notes: dict, conf: str | None, conf_key: str | None, target: str) -> list[tuple]:
    """(key, type, default, description) for every field of ``cls``, in declaration order."""
    fields = dataclasses.fields(cls)
    names = {f.name for f in fields}
    unknown = sorted(set(notes) - names)
    if unknown:
        raise PluginError(f"schema {target}: notes for keys it does not have: {', '.join(unknown)}")
    comments = field_comments(cls)
    set_by_conf = conf_values(conf, conf_key, names, target) if conf else {}
    rows = []
    for f in fields:
        description = notes.get(f.name) or plain(comments.get(f.name, "")) or GENERIC.get(f.name, "")
        if not description:
            log.warning(
                f"schema {target}: field '{f.name}' has no description: write a comment beside it in "
                f"{inspect.getsourcefile(cls)}, or a note under the page's marker"
            )
        default = default_text(f)
        if f.name in set_by_conf:
            default = f"{code(set_by_conf[f.name])} (set by the YAML; the schema's: {default})"
        rows.append((f.name, type_text(f, cls), default, description))
    return rows


def field_comments(cls) -> dict[str, str]:
    """Each field's comment in the source of the class that declares it (the nearest in the MRO)."""
    found: dict[str, str] = {}
    for klass in reversed([k for k in cls.__mro__ if dataclasses.is_dataclass(k)]):
        found.update(_declared_comments(klass))
    return found


def _declared_comments(klass) -> dict[str, str]:
    source = inspect.getsource(inspect.getmodule(klass))
    comments = {}
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            comments[token.start[0]] = token.string.lstrip("#").strip()
    lines = source.splitlines()
    tree = ast.parse(source)
    node = next(n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == klass.__name__)
    result = {}
    for stmt in node.body:
        if not (isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name)):
            continue
        above = []
        line = stmt.lineno - 1
        while line >= 1 and lines[line - 1].strip().startswith("#"):
            above.insert(0, comments[line])
            line -= 1
        beside = [comments[k] for k in range(stmt.lineno, stmt.end_lineno + 1) if k in comments]
        parts = [_clean(text) for text in above + beside]
        result[stmt.target.id] = " ".join(p for p in parts if p)
    return result


def _clean(comment: str) -> str:
    return NOQA.sub("", comment).strip()


def type_text(f: dataclasses.Field, cls) -> str:
    """The declared type, in the words of a config: ``str or null``, ``list of str``, ``skip | raise``."""
    annotation = f.type if isinstance(f.type, str) else getattr(f.type, "__name__", str(f.type))
    namespace = vars(inspect.getmodule(cls))
    return _type_words(ast.parse(annotation, mode="eval").body, namespace)


def _type_words(node: ast.expr, namespace: dict) -> str:
    if isinstance(node, ast.Subscript):
        outer = ast.unparse(node.value).rsplit(".", 1)[-1]
        inner = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
        words = [_type_words(n, namespace) for n in inner]
        if outer == "Optional":
            return f"{words[0]} or null"
        if outer in ("List", "list"):
            return f"list of {words[0]}"
        if outer in ("Dict", "dict"):
            return "mapping"
        return ast.unparse(node)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):  # X | None
        left, right = _type_words(node.left, namespace), _type_words(node.right, namespace)
        return f"{left} or null" if right == "None" else f"{left} or {right}"
    name = ast.unparse(node)
    kind = namespace.get(name)
    if isinstance(kind, type) and issubclass(kind, enum.Enum):
        return " | ".join(str(member.value) for member in kind)
    return {"Any": "any", "None": "None"}.get(name, name)


def default_text(f: dataclasses.Field) -> str:
    if f.default is not dataclasses.MISSING:
        value = f.default
    elif f.default_factory is not dataclasses.MISSING:
        value = f.default_factory()
    else:
        return "required"
    if value == "???":
        return "required"
    return code(value)


def code(value) -> str:
    if isinstance(value, enum.Enum):
        value = value.value
    if value is None:
        text = "null"
    elif isinstance(value, bool):
        text = str(value).lower()
    elif isinstance(value, (list, tuple)):
        text = "[" + ", ".join(str(v) for v in value) + "]"
    elif isinstance(value, dict):
        text = "{" + ", ".join(f"{k}: {v}" for k, v in value.items()) + "}"
    else:
        text = str(value)
    return f"`{text}`"


def conf_values(conf: str, conf_key: str | None, names: set, target: str) -> dict:
    """The values the YAML groups ``conf`` (space-separated, later ones win) set for the schema's keys (under
    ``conf_key``, if given)."""
    values = {}
    for name in conf.split():
        path = ROOT / name
        if not path.is_file():
            raise PluginError(f"schema {target}: conf: {name} does not exist")
        node = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
        for part in conf_key.split(".") if conf_key else []:
            node = node.get(part) or {}
        values.update({key: value for key, value in node.items() if key in names})
    return values


def plain(text: str) -> str:
    """A source comment (plain text) as Markdown: ``<class>`` and ``**`` stay as written."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace("*", "\\*")


def cell(text: str) -> str:
    """A table cell: pipes outside code spans escaped, so the table keeps its columns."""
    parts = str(text).replace("\n", " ").split("`")
    return "`".join(p if i % 2 else p.replace("|", "\\|") for i, p in enumerate(parts))
