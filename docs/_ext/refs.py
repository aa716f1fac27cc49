"""Resolve short Python cross-references (``:class:`InvalidArgumentError```) to the one public object of that name.

Docstrings name objects as their module sees them; the reference documents them under their public
namespace (``countvae.errors.InvalidArgumentError``). When Sphinx finds no exact target, the reference
is retried as a suffix search (Sphinx's own ``:class:`.Name``` mode), which succeeds only when one
documented object has that name. Anything still unresolved stays a warning (the build is nitpicky).
"""

from __future__ import annotations

from docutils import nodes
from sphinx.addnodes import pending_xref
from sphinx.application import Sphinx
from sphinx.environment import BuildEnvironment


def resolve_by_suffix(
    app: Sphinx, env: BuildEnvironment, node: pending_xref, contnode: nodes.TextElement
) -> nodes.reference | None:
    """Retry an unresolved ``py`` reference as a suffix search; ``None`` if not exactly one object matches."""
    if node.get("refdomain") != "py" or node.get("refspecific") or node.get("countvae_retried"):
        return None
    target = node["reftarget"]
    domain = env.get_domain("py")
    matches = domain.find_obj(env, None, None, target, node["reftype"], searchmode=1)
    if len(matches) != 1:
        return None
    retry = node.deepcopy()
    retry["refspecific"] = True
    retry["countvae_retried"] = True
    return domain.resolve_xref(env, node["refdoc"], app.builder, node["reftype"], target, retry, contnode)


def setup(app: Sphinx) -> dict[str, bool]:
    """Register the fallback."""
    app.connect("missing-reference", resolve_by_suffix)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
