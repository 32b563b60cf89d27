"""Reading a table of samples: CSV, TSV and Parquet through pyarrow, and ``path label`` lists (``.txt``).

    .csv            comma-separated, a header row naming the columns
    .tsv .tab       tab-separated, a header row
    .parquet .pq    Parquet (its own column names and types)
    .txt .lst       one sample a line, whitespace-separated: ``<path> <label>`` (ImageNet's validation
                    labels, DALI's ``file_list``); columns ``path`` and ``label``, no header

CSV and TSV cells are read as text, never guessed at (a column of ids stays as written); each field's kind says
how a cell is parsed (``columns.py``). Rows are counted from 1, the header not counted, as a spreadsheet user
counts data rows.
"""

from __future__ import annotations

import csv
import hashlib
import logging
import os

log = logging.getLogger(__name__)

FORMATS = {
    ".csv": "csv",
    ".tsv": "tsv",
    ".tab": "tsv",
    ".parquet": "parquet",
    ".pq": "parquet",
    ".txt": "list",
    ".lst": "list",
}
LIST_COLUMNS = ("path", "label")
ROWS = "rows count from 1, the header not counted"  # said wherever a row is named


class TableError(ValueError):
    """A table that cannot be read as samples: named by its path, and by row and column where there is one."""


def table_format(path: str, key: str = "source.path") -> str:
    ext = os.path.splitext(path)[1].lower()
    if ext not in FORMATS:
        raise TableError(
            f"{key}={path}: a table is one of {', '.join(sorted(FORMATS))} (by its extension), not {ext or 'none'}"
        )
    return FORMATS[ext]


def require_table(path: str, key: str) -> str:
    if not os.path.isfile(path):
        what = "is not a file" if os.path.exists(path) else "does not exist"
        raise FileNotFoundError(f"{key} '{path}' {what} (set {key}=<a .csv, .tsv, .parquet or .txt table>)")
    table_format(path, key)
    return path


def header(path: str) -> list[str]:
    """The column names, reading no more than the first row (Parquet: the schema)."""
    fmt = table_format(path)
    if fmt == "list":
        return list(LIST_COLUMNS)
    if fmt == "parquet":
        import pyarrow.parquet as pq

        return list(pq.read_schema(path).names)
    try:
        with open(path, newline="", encoding="utf-8-sig") as f:
            first = next(csv.reader(f, delimiter="\t" if fmt == "tsv" else ","), None)
    except UnicodeDecodeError as err:
        raise TableError(not_utf8(path, err)) from None
    if not first:
        raise TableError(f"{path} is empty: its first row must name the columns")
    if len(first) == 1 and any(sep in first[0] for sep in "\t;|"):
        sep = next(sep for sep in "\t;|" if sep in first[0])
        said = {"\t": "tabs: name the file .tsv", ";": "semicolons", "|": "bars"}[sep]
        log.warning(
            "%s's header is one column, %r, holding %s (feedline reads commas in a .csv)",
            path,
            first[0][:60],
            said,
        )
    return [c.strip() for c in first]


def not_utf8(path: str, err: UnicodeDecodeError) -> str:
    return f"{path} is not UTF-8 text (byte {err.start}: {err.reason}): save the table as UTF-8"


def content_digest(path: str) -> str:
    """16 hex digits of the table's bytes: what the cached index and a resume compare."""
    h = hashlib.blake2b(digest_size=8)
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            h.update(chunk)
    return h.hexdigest()


class Table:
    """A table read whole: ``columns`` (names, in order), ``rows`` (data rows) and ``column(name)``, its cells
    as Python values (text for CSV, TSV and lists; Parquet's own types)."""

    def __init__(self, path: str, columns: list[str], data: dict, rows: int):
        self.path, self.columns, self._data, self.rows = path, columns, data, rows

    def column(self, name: str) -> list:
        cells = self._data[name]
        return cells if isinstance(cells, list) else cells.to_pylist()

    def require(self, name: str, key: str) -> None:
        if name not in self.columns:
            raise TableError(
                f"{self.path} has no column {name!r} (named by {key}); its columns are: {', '.join(self.columns)}"
            )


def read_table(path: str, columns=None) -> Table:
    """The table at ``path`` (``columns``: the ones needed, where the format can leave the others unread)."""
    fmt = table_format(path)
    if fmt == "list":
        table = _read_list(path)
    elif fmt == "parquet":
        table = _read_parquet(path, columns)
    else:
        table = _read_csv(path, "\t" if fmt == "tsv" else ",")
    if not table.rows:
        raise TableError(
            f"{path} holds no samples: it has no data rows (columns: {', '.join(table.columns)})"
        )
    return table


def _read_csv(path: str, delimiter: str) -> Table:
    import pyarrow as pa
    import pyarrow.csv as pacsv

    names = header(path)
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise TableError(f"{path} names column(s) {', '.join(map(repr, twice))} more than once in its header")
    try:
        table = pacsv.read_csv(
            path,
            read_options=pacsv.ReadOptions(column_names=names, skip_rows=1),
            parse_options=pacsv.ParseOptions(delimiter=delimiter, newlines_in_values=True),  # captions
            convert_options=pacsv.ConvertOptions(
                column_types={n: pa.string() for n in names},
                strings_can_be_null=False,
                quoted_strings_can_be_null=False,
            ),
        )
    except UnicodeDecodeError as err:
        raise TableError(not_utf8(path, err)) from None
    except pa.ArrowInvalid as err:
        kind = "TSV" if delimiter == "\t" else "CSV"
        why = _ragged(path, delimiter, len(names)) or err
        raise TableError(f"{path} does not read as a {kind} table: {why}") from None
    return Table(path, names, {n: table.column(n) for n in names}, table.num_rows)


def _ragged(path: str, delimiter: str, width: int) -> str | None:
    """The first row whose cells the header does not count (pyarrow names the row's text, not its number)."""
    try:
        with open(path, newline="", encoding="utf-8-sig") as f:
            for row, cells in enumerate(csv.reader(f, delimiter=delimiter)):
                if row and len(cells) != width:
                    return f"row {row} ({ROWS}) has {len(cells)} cell(s), the header names {width} columns"
    except (OSError, UnicodeDecodeError, csv.Error):
        return None
    return None


def _read_parquet(path: str, columns) -> Table:
    import pyarrow as pa
    import pyarrow.parquet as pq

    names = header(path)
    wanted = [c for c in names if columns is None or c in columns]
    try:
        table = pq.read_table(path, columns=wanted)
    except (pa.ArrowInvalid, OSError) as err:
        raise TableError(f"{path} does not read as a Parquet table: {err}") from None
    return Table(path, names, {n: table.column(n) for n in wanted}, table.num_rows)


def _read_list(path: str) -> Table:
    paths, labels = [], []
    with open(path, encoding="utf-8-sig") as f:
        try:
            lines = f.readlines()
        except UnicodeDecodeError as err:
            raise TableError(not_utf8(path, err)) from None
        for number, line in enumerate(lines, 1):
            line = line.strip()
            if not line or line.startswith("#"):  # blank lines and comments
                continue
            parts = line.rsplit(None, 1)  # the label is the last word: a path may hold spaces
            if len(parts) != 2:
                raise TableError(
                    f"{path} line {number}: {line[:80]!r} is not '<path> <label>' (a path list holds a path and "
                    "a label per line, separated by whitespace)"
                )
            paths.append(parts[0])
            labels.append(parts[1])
    return Table(path, list(LIST_COLUMNS), {"path": paths, "label": labels}, len(paths))
