"""Public names that do not move: each public class has one import path (``feedline.datasets.FolderSource``),
every ``_target_`` feedline's configs write is that path, and the module paths that moved still import for one
release, with a ``MovedWarning`` that names the new path."""

from __future__ import annotations

import ast
import importlib
import inspect
import json
import re
import subprocess
import sys
import warnings
from dataclasses import fields, is_dataclass

import pytest
from hydra._internal.utils import _locate

from feedline.moved import MOVED, REPLACED, MovedWarning
from feedline.public import PUBLIC, public_path
from tests.conftest import CONF, ROOT_DIR

TARGET = re.compile(r"_target_:\s*['\"]?([\w.]+)")
SCHEMAS = ("datasets.options", "datamodules.options", "writers.options", "diagnostics.options")
PUBLIC_NAMES = [(package, name) for package, names in PUBLIC.items() for name in names]


def conf_targets() -> list[tuple[str, str]]:
    """(where, target) of every feedline ``_target_`` in conf/ and in the typed option schemas."""
    found = [
        (str(path.relative_to(ROOT_DIR)), target)
        for path in sorted(CONF.rglob("*.yaml"))
        for target in TARGET.findall(path.read_text(encoding="utf-8"))
    ]
    for name in SCHEMAS:
        module = importlib.import_module(f"feedline.{name}")
        for _, schema in inspect.getmembers(module, is_dataclass):
            for f in fields(schema):
                if f.name == "_target_":
                    found.append((f"{name}.{schema.__name__}", f.default))
    return [(where, target) for where, target in found if target.startswith("feedline.")]


def test_the_configs_name_feedline_classes():
    assert len(conf_targets()) >= 20  # the walk finds the sources, stacks, collates, models, callbacks


@pytest.mark.parametrize(("where", "target"), conf_targets(), ids=lambda v: v)
def test_every_target_in_conf_is_a_public_path_that_imports_without_a_warning(where, target):
    with warnings.catch_warnings():
        warnings.simplefilter("error", MovedWarning)
        found = _locate(target)
    assert callable(found), f"{where}: {target}"
    if inspect.isclass(found):
        assert public_path(found) == target, (
            f"{where} names {target}; its public path is {public_path(found)}"
        )


@pytest.mark.parametrize(("package", "name"), PUBLIC_NAMES, ids=[f"{p}.{n}" for p, n in PUBLIC_NAMES])
def test_every_public_name_imports_from_its_package_as_the_class_its_module_defines(package, name):
    cls = getattr(importlib.import_module(package), name)
    assert cls.__module__ == PUBLIC[package][name] and cls.__name__ == name
    assert public_path(cls) == f"{package}.{name}"
    assert name in dir(importlib.import_module(package))


def test_an_unknown_name_is_an_attribute_error_naming_the_package():
    import feedline.datasets

    with pytest.raises(AttributeError, match="'feedline.datasets' has no attribute 'FoldrSource'"):
        feedline.datasets.FoldrSource  # noqa: B018


OLD_PATHS = """
import importlib, json, sys, warnings
from hydra._internal.utils import _locate
from feedline.moved import MOVED, REPLACED
from feedline.public import PUBLIC
out = {"modules": {}, "names": {}}
for old, new in MOVED.items():
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        alias = importlib.import_module(old)
    module = importlib.import_module(new)
    same = all(getattr(alias, k) is v for k, v in vars(module).items() if not k.startswith("_"))
    out["modules"][old] = [same, module.__spec__.name, [str(w.message) for w in said if w.category.__name__ == "MovedWarning"]]
for old, new in REPLACED.items():
    for name, where in PUBLIC["feedline.datasets"].items():
        if where == new:
            with warnings.catch_warnings(record=True) as said:
                warnings.simplefilter("always")
                found = _locate(f"{old}.{name}")
            out["names"][f"{old}.{name}"] = [
                f"{found.__module__}.{found.__name__}", [str(w.message) for w in said if w.category.__name__ == "MovedWarning"]
            ]
print(json.dumps(out))
"""


@pytest.mark.slow
def test_every_old_path_still_imports_the_new_module_with_a_warning_naming_it():
    """In a fresh interpreter, so that no module is imported yet under either name."""
    run = subprocess.run([sys.executable, "-c", OLD_PATHS], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    out = json.loads(run.stdout)
    assert set(out["modules"]) == set(MOVED)
    for old, (same, spec_name, said) in out["modules"].items():
        assert same, f"{old} does not read every name of {MOVED[old]}"
        assert spec_name == MOVED[old], f"importing {old} changed {MOVED[old]}'s own spec"
        assert len(said) == 1 and old in said[0] and f"moved to {MOVED[old]}" in said[0], (old, said)
    assert len(out["names"]) == len(REPLACED)  # each family's source class, by its old module path
    for old, (found, said) in out["names"].items():
        name = old.rpartition(".")[2]
        assert found == f"{PUBLIC['feedline.datasets'][name]}.{name}", old
        assert len(said) == 1 and f"moved to feedline.datasets.{name}" in said[0], (old, said)


NAMES_0_1 = [
    line
    for line in (ROOT_DIR / "tests" / "data" / "names_0_1.txt").read_text().splitlines()
    if line[:1] != "#"
]


def test_every_public_name_of_the_previous_release_still_resolves_by_its_old_path():
    """Classes, functions and constants of feedline 0.1's modules, however far they moved (a pickle names its
    classes by module path; a user's code imports a constant such as ``IMG_EXTENSIONS``)."""
    missing = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", MovedWarning)
        for name in NAMES_0_1:
            try:
                _locate(name)
            except ImportError:
                missing.append(name)
    assert len(NAMES_0_1) > 400 and not missing, "\n".join(missing)


def test_a_name_that_left_its_module_warns_naming_where_it_is_now():
    import feedline.datasets.records as records
    from feedline.datasets.arrays import CacheReplacedError

    with pytest.warns(
        MovedWarning, match=r"records\.CacheReplacedError moved to feedline\.datasets\.arrays\."
    ):
        assert records.CacheReplacedError is CacheReplacedError
    with pytest.raises(AttributeError, match="has no attribute 'Nothing'"):
        records.Nothing  # noqa: B018


def test_records_pickled_by_the_previous_release_load_and_read_the_same_samples(tree, tmp_path):
    """A 0.1 pickle names ``feedline.datasets.records.LazyArray`` and ``feedline.datasets.folder.FolderRecords``
    (protocol 0 spells each class as ``c<module>\\n<name>``, so the old names can be written in)."""
    import pickle

    from feedline.datasets import FolderSource

    records = FolderSource(tree, cache_dir=tmp_path / "c").split("train")
    new = pickle.dumps(records, protocol=0)
    old = new.replace(b"feedline.datasets.arrays\nLazyArray", b"feedline.datasets.records\nLazyArray")
    old = old.replace(
        b"feedline.datasets.folder.source\nFolderRecords", b"feedline.datasets.folder\nFolderRecords"
    )
    assert old.count(b"feedline.datasets.records\nLazyArray") >= 1 and b"folder.source" not in old
    with pytest.warns(MovedWarning):
        loaded = pickle.loads(old)
    assert (
        len(loaded) == len(records)
        and loaded[0][1] == records[0][1]
        and loaded.describe(0) == records.describe(0)
    )


@pytest.mark.parametrize("package", list(PUBLIC))
def test_each_public_package_lists_its_names_for_editors_and_star_imports(package):
    """``__all__`` and the ``if TYPE_CHECKING:`` imports (what editors and type checkers read) are PUBLIC's."""
    module = importlib.import_module(package)
    assert module.__all__ == list(PUBLIC[package])
    tree = ast.parse(inspect.getsource(module))
    checked = {
        alias.name: node.module
        for block in tree.body
        if isinstance(block, ast.If) and getattr(block.test, "id", "") == "TYPE_CHECKING"
        for node in block.body
        for alias in node.names
    }
    assert checked == PUBLIC[package]
    namespace = {}
    exec(f"from {package} import *", namespace)
    assert set(namespace) - {"__builtins__"} == set(PUBLIC[package])


def test_a_submodule_of_a_family_is_never_mistaken_for_a_name_of_its_old_module():
    """``from feedline.datasets.folder import scan`` is the folder family's scan module, even where the old
    module (now ``folder/source.py``) had a name ``scan`` of its own."""
    from feedline.datasets.folder import index, scan

    assert (
        scan.__name__ == "feedline.datasets.folder.scan"
        and index.__name__ == "feedline.datasets.folder.index"
    )


def test_a_checkpoint_config_written_with_an_old_path_still_builds(make_cfg, tree):
    """A config recorded before the move (a checkpoint's, a user's YAML) names the old module path."""
    from feedline.cli.instantiate import instantiate

    cfg = make_cfg("source=folder", f"source.root={tree}")
    cfg.data.source._target_ = "feedline.datasets.folder.FolderSource"
    with pytest.warns(MovedWarning, match=r"moved to feedline\.datasets\.FolderSource"):
        datamodule = instantiate(cfg.data, "data")
    assert type(datamodule.source).__name__ == "FolderSource" and datamodule.classes == ["cat", "dog", "eel"]
    # what it records (and a checkpoint saved from it holds) is the path that lasts past the old one
    assert datamodule.hparams["source"]["_target_"] == "feedline.datasets.FolderSource"


def test_a_rebuilt_config_names_the_public_path(tree):
    from feedline.datasets import FolderSource
    from feedline.transforms import Uint8Collate

    assert FolderSource(tree).rebuild_config()["_target_"] == "feedline.datasets.FolderSource"
    assert Uint8Collate().rebuild_config()["_target_"] == "feedline.transforms.Uint8Collate"


# as a config names it: imported by Hydra, not by __main__ (where Python shows a DeprecationWarning anyway)
WARNED = "from hydra.utils import get_class; get_class('feedline.datasets.stores.S3Store')"


@pytest.mark.parametrize(
    ("options", "returncode", "shown"),
    [
        # nothing set: shown, although Python hides a DeprecationWarning outside __main__, and although torch and
        # Lightning (imported first, as train.py does) add filters for messages of their own
        (["lightning"], 0, True),
        (["-W", "error::DeprecationWarning"], 1, True),  # a CI that hunts deprecations before a release
        (["-W", "ignore::DeprecationWarning"], 0, False),
        (["-W", "error::UserWarning"], 0, True),  # a filter for something else leaves the default
        (["-W", "ignore::DeprecationWarning:somepkg"], 0, True),  # and so does one for another package
    ],
    ids=["default", "error", "ignore", "other", "another-package"],
)
def test_a_moved_path_warns_by_default_and_the_users_own_filter_decides(options, returncode, shown):
    code = f"import lightning; {WARNED}" if options == ["lightning"] else WARNED
    options = [] if options == ["lightning"] else options
    run = subprocess.run([sys.executable, *options, "-c", code], capture_output=True, text=True, timeout=120)
    assert run.returncode == returncode, run.stderr[-2000:]
    assert ("feedline.datasets.stores moved to feedline.storage.stores" in run.stderr) == shown, run.stderr


def test_a_filter_set_before_feedline_is_imported_keeps_deciding():
    """As pytest's ``filterwarnings = error`` does for a test that imports feedline for the first time."""
    import feedline.moved

    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        before = list(warnings.filters)
        feedline.moved._shown_unless_filtered()
        assert warnings.filters == before
    with warnings.catch_warnings():
        warnings.resetwarnings()
        warnings.filterwarnings("ignore", category=DeprecationWarning)  # Python's own default
        feedline.moved._shown_unless_filtered()
        assert warnings.filters[0][:3] == ("default", None, MovedWarning)
