"""Sphinx configuration of the countvae documentation.

Build: ``python -m sphinx -W --keep-going -b html docs docs/_build/html`` (or ``bash scripts/docs.sh``).
Notebooks are rendered with the outputs stored in ``tutorials/*.ipynb``; nothing is executed here.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

DOCS = Path(__file__).resolve().parent
ROOT = DOCS.parent
sys.path[:0] = [str(ROOT), str(DOCS / "_ext")]

from api_pages import NAMESPACES, write_api_pages  # noqa: E402

import countvae  # noqa: E402

project = "countvae"
author = "The countvae developers"
copyright = "2026, the countvae developers"
release = version = countvae.__version__

extensions = [
    "myst_nb",
    "sphinx.ext.autodoc",
    "sphinx.ext.autosummary",
    "sphinx.ext.napoleon",
    "sphinx_copybutton",
    "cli_help",
    "refs",
]
templates_path = ["_templates"]
exclude_patterns = ["_build", "**.ipynb_checkpoints", "jupyter_execute"]
source_suffix = {".rst": "restructuredtext", ".md": "myst-nb", ".ipynb": "myst-nb"}

# ----- the generated parts: API namespace pages and the tutorials (copied from tutorials/) -----------
write_api_pages(NAMESPACES, DOCS / "api")


def _copy_tutorials() -> None:
    target = DOCS / "tutorials"
    target.mkdir(exist_ok=True)
    wanted = {p.name: p for p in sorted((ROOT / "tutorials").glob("*.ipynb"))}
    for stale in set(p.name for p in target.glob("*.ipynb")) - set(wanted):
        (target / stale).unlink()
    for name, source in wanted.items():
        copy = target / name
        if not copy.exists() or copy.read_bytes() != source.read_bytes():  # unchanged copies keep builds incremental
            shutil.copyfile(source, copy)


_copy_tutorials()

# ----- API reference ----------------------------------------------------------------------------------
autosummary_generate = True
autosummary_imported_members = True
autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_typehints_format = "short"
napoleon_google_docstring = False
napoleon_numpy_docstring = True
napoleon_use_rtype = False
napoleon_use_ivar = False

# Docstrings write an absolute value as |correlation| (plain text in a terminal); in reST that is a
# substitution, so define each one to print as written.
rst_prolog = "\n".join(f".. |{name}| replace:: \\|{name}\\|" for name in ("correlation", "corr", "log p(x)"))


def _skip_foreign_members(app, what, name, obj, skip, options):
    """Document only what countvae defines: not scikit-learn's methods that its estimators inherit.

    Nor a class held by a class attribute (``FitSeedsSettings.model_cls``): its field is already in "Attributes".
    """
    module = getattr(obj, "__module__", None) or ""
    if what == "class" and callable(obj) and not module.startswith("countvae"):
        return True
    if what == "class" and isinstance(obj, type) and obj.__name__ != name:
        return True  # an attribute holding a class under another name (e.g. a settings field's default)
    return None


def setup(app):
    """Project-specific hooks."""
    app.connect("autodoc-skip-member", _skip_foreign_members)


# Cross-references must resolve (nitpicky), except into packages whose inventories would have to be
# downloaded (intersphinx needs the network, and the build must run offline).
nitpicky = True
_EXTERNAL = (
    r"(np|numpy|pd|pandas|ad|anndata|torch|pyro|scipy|sklearn|matplotlib|arviz|az|scvi|joblib|ray|nn|"
    r"threadpoolctl|picard|collections|typing|pathlib|os|enum|argparse|abc|dataclasses|builtins)(\..*)?"
)
# References into private modules below the public namespaces are not documented (they are not API).
_INTERNAL = r"countvae\.(model|module|cli)(\..*)?|countvae\.(data|diagnostics|invariance)\.[a-z_]+\..+"
nitpick_ignore_regex = [(r"py:.*", _EXTERNAL), (r"py:.*", _INTERNAL), (r"py:mod", r"countvae\..*")]
# Module-level type aliases (``Literal[...]``, unions) that annotations name; the parameter text spells out the values.
nitpick_ignore_regex += [(r"py:class", r"Algorithm|CorrelationMethod|CellSelection")]

# ----- notebooks and MyST -------------------------------------------------------------------------------
nb_execution_mode = "off"  # tutorials are stored executed; tests/tutorials/test_tutorials.py checks they are current
myst_enable_extensions = ["colon_fence", "deflist"]
myst_heading_anchors = 3

# ----- HTML ---------------------------------------------------------------------------------------------
html_theme = "sphinx_book_theme"
html_title = f"countvae {release}"
html_theme_options = {
    # the sidebar shows the current page's branch only: with a page per API object, expanding every
    # branch on every page was a third of the build time
    "collapse_navbar": True,
    "max_navbar_depth": 3,
    "show_toc_level": 2,
    "use_download_button": False,
    "use_fullscreen_button": False,
}
html_last_updated_fmt = None
html_show_sourcelink = False
