"""Sphinx configuration for lockgate's API reference (``make docs-api``).

Builds offline: no intersphinx, no theme from the network (the default ``alabaster``).
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

project = "lockgate"
author = "lockgate contributors"
copyright = "lockgate contributors"
release = "0.1.0"

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "sphinx.ext.viewcode",
]

root_doc = "index"
exclude_patterns = ["_build"]
html_theme = "alabaster"
html_title = "lockgate API reference"
html_static_path: list[str] = []

# Google-style docstrings only.
napoleon_google_docstring = True
napoleon_numpy_docstring = False
napoleon_use_rtype = False
napoleon_attr_annotations = True

autodoc_member_order = "bysource"
autodoc_typehints = "signature"
autodoc_typehints_format = "short"
autodoc_preserve_defaults = True
autodoc_default_options = {"members": True}
add_module_names = False
nitpicky = True

# External types: the build is offline (no intersphinx), so the standard library and
# third-party types in signatures cannot be linked. Ignore exactly those, nothing else.
nitpick_ignore = [
    ("py:class", name)
    for name in (
        "collections.abc.Callable",
        "collections.abc.Iterable",
        "collections.abc.Iterator",
        "collections.abc.Mapping",
        "collections.abc.Sequence",
        "enum.StrEnum",
        "pathlib.Path",
        "types.FrameType",
        "typing.Any",
        "typing.Protocol",
        "typing.Generic",
        "pydantic_settings.main.BaseSettings",
        # pyspark (state.spark annotates with the bare names under TYPE_CHECKING)
        "DataFrame",
        "SparkSession",
    )
]
# Internal names that public signatures and docstrings mention; modules and names
# starting with ``_`` (and these) are deliberately left out of the reference.
nitpick_ignore += [
    ("py:class", "processors._ops.errors.OpsError"),
    ("py:class", "processors._task.time.TimeService"),
    ("py:class", "processors.windows.Assigner"),
    ("py:class", "processors.windows._Windowable"),
    ("py:class", "Assigner"),
    ("py:class", "state.cache.KeyCursor"),
    ("py:class", "state.cache.StoreCache"),
    ("py:meth", "state.cache.StoreCache.drain"),
    ("py:class", "state.memory.store.MemoryKeyGroupStore"),
    ("py:class", "state.rocksdb.store.RocksDBKeyGroupStore"),
    ("py:class", "state.rocksdb.memory.RocksDBMemory"),
    ("py:data", "NON_SETTINGS_ENV"),
    ("py:exc", "TimerRewind"),
    ("py:mod", "processors._spark.backfill_task"),
    ("py:class", "processors._checkpoint.savepoint_requests.SavepointRequests"),
    ("py:class", "processors._runtime.final_savepoint.FinalSavepoint"),
    ("py:class", "processors._ops.bounded_savepoint.BoundedSavepoint"),
    ("py:class", "processors._dsl.definition.Definition"),
]
# The type variables of generic signatures (``T``, ``A``, ``R``, ...) are not documented.
nitpick_ignore_regex = [
    ("py:(class|obj)", r"(processors|state)\.[\w.]+\.(T|A|R|M|V|S|T_in|R_out)"),
    # Sphinx splits some unions of subscripted standard-library generics mid-type
    # (``collections.abc.Mapping[str``): still the standard library, still unlinkable.
    ("py:class", r"collections\.abc\.\w+\[.*"),
]


def _public_target(app: Any, env: Any, node: Any, contnode: Any) -> Any:
    """Resolve references to the private module that defines a public object.

    Signatures name objects by their defining module (``processors._dsl.app.Stream``),
    which this reference documents under the public one (``processors.Stream``). A reference
    that Sphinx cannot find is retried by its dotted suffixes, longest first, and resolved
    to the one documented object of :mod:`processors` or :mod:`state` whose name ends
    with a suffix, when there is exactly one.
    """
    if node.get("refdomain") != "py":
        return None
    target: str = node["reftarget"]
    domain = env.get_domain("py")
    public = [
        name
        for name, entry in domain.objects.items()
        if name.startswith(("processors.", "state.")) and not entry.aliased
    ]
    parts = target.split(".")
    # The longest suffix first: ``state.base.store.KeyGroupStore.items`` is tried as
    # itself, ``base.store.KeyGroupStore.items``, ..., ``KeyGroupStore.items``, ``items``.
    for start in range(len(parts)):
        suffix = "." + ".".join(parts[start:])
        matches = [name for name in public if name.endswith(suffix)]
        if len(matches) == 1:
            break
    else:
        return None
    return domain.resolve_xref(
        env, node["refdoc"], app.builder, node["reftype"], matches[0], node, contnode
    )


_CODEC_REPR = re.compile(r"<state\.codecs\._(Json|Str|Bytes|Pickle) object>")


def _codec_defaults(
    app: Any, what: str, name: str, obj: Any, options: Any, signature: str | None, ret: str | None
) -> tuple[str | None, str | None]:
    """Show the built-in codecs in signatures by name (``JSON``), not by their repr."""
    if signature:
        signature = _CODEC_REPR.sub(lambda m: m.group(1).upper(), signature)
    return signature, ret


def setup(app: Any) -> None:
    """Register the reference fallback for private module paths and the codec names."""
    app.connect("missing-reference", _public_target)
    app.connect("autodoc-process-signature", _codec_defaults)
