"""Checks of a built HTML site: internal links resolve, and no page loads anything from the network.

Sphinx's own ``linkcheck`` builder follows external links too, which needs the network; these two
checks read only the files.
"""

from __future__ import annotations

import html.parser
import re
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import unquote, urldefrag, urlsplit

#: Attributes whose URL the browser fetches while it renders the page (a link's href is only followed).
_LOADING = {("script", "src"), ("img", "src"), ("iframe", "src"), ("source", "src"), ("video", "src")}
_LOADING |= {("audio", "src"), ("embed", "src"), ("object", "data"), ("input", "src"), ("track", "src")}
#: ``<link rel=...>`` kinds that fetch their href.
_LOADING_RELS = {"stylesheet", "preload", "modulepreload", "icon", "shortcut", "prefetch", "manifest"}
_CSS_URL = re.compile(r"""url\(\s*['"]?([^'")\s]+)|@import\s+(?:url\()?\s*['"]([^'"]+)""")
_REMOTE = re.compile(r"^(?:[a-zA-Z][a-zA-Z0-9+.-]*:)?//")


@dataclass
class Page:
    """What one HTML file defines and refers to."""

    ids: set[str] = field(default_factory=set)
    links: list[str] = field(default_factory=list)  # href of <a> and <link>, src of what loads
    loads: list[str] = field(default_factory=list)  # URLs the browser fetches to render the page


class _Parser(html.parser.HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.page = Page()
        self._in_style = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        values = {name: value or "" for name, value in attrs}
        if "id" in values:
            self.page.ids.add(values["id"])
        if tag == "a" and "name" in values:
            self.page.ids.add(values["name"])
        if tag in ("a", "area") and "href" in values:
            self.page.links.append(values["href"])
        if tag == "link" and "href" in values:
            self.page.links.append(values["href"])
            if set(values.get("rel", "").lower().split()) & _LOADING_RELS:
                self.page.loads.append(values["href"])
        for attr, value in values.items():
            if (tag, attr) in _LOADING:
                self.page.links.append(value)
                self.page.loads.append(value)
            if attr == "srcset":
                self.page.loads += [part.split()[0] for part in value.split(",") if part.strip()]
            if attr == "style":
                self.page.loads += css_urls(value)
        self._in_style = tag == "style"

    def handle_endtag(self, tag: str) -> None:
        if tag == "style":
            self._in_style = False

    def handle_data(self, data: str) -> None:
        if self._in_style:
            self.page.loads += css_urls(data)


def css_urls(css: str) -> list[str]:
    """Every URL a stylesheet (or a ``style`` attribute) fetches: ``url(...)`` and ``@import``."""
    return [a or b for a, b in _CSS_URL.findall(css)]


def parse_page(text: str) -> Page:
    """The ids, links and loads of one HTML document."""
    parser = _Parser()
    parser.feed(text)
    parser.close()
    return parser.page


def is_remote(url: str) -> bool:
    """Whether fetching ``url`` leaves the machine (``http:``, ``https:``, protocol-relative ``//host``, ...)."""
    return bool(_REMOTE.match(url.strip()))


def pages(site: Path) -> list[Path]:
    """The site's HTML pages: every ``.html`` file except the theme's templates copied into ``_static/``."""
    return sorted(p for p in site.rglob("*.html") if "_static" not in p.relative_to(site).parts)


def remote_loads(site: Path) -> list[str]:
    """``file: url`` for every remote URL that a page or a stylesheet of the site would fetch."""
    problems = []
    for path in pages(site):
        page = parse_page(path.read_text(encoding="utf-8", errors="replace"))
        problems += [f"{path.relative_to(site)}: {url}" for url in page.loads if is_remote(url)]
    for path in sorted(site.rglob("*.css")):
        urls = css_urls(path.read_text(encoding="utf-8", errors="replace"))
        problems += [f"{path.relative_to(site)}: {url}" for url in urls if is_remote(url)]
    return problems


def broken_internal_links(site: Path) -> list[str]:
    """``page: link (why)`` for every relative link or load of the site that does not resolve.

    A link resolves when its file exists inside the site and, if it names a fragment on an HTML page,
    that page has an element with that id. Remote links are not followed (no network); ``file:`` URLs
    and links that leave the site count as broken.
    """
    site = site.resolve()
    parsed = {path: parse_page(path.read_text(encoding="utf-8", errors="replace")) for path in pages(site)}
    problems = []
    for path, page in parsed.items():
        for link in page.links:
            why = _why_broken(site, path, link, parsed)
            if why:
                problems.append(f"{path.relative_to(site)}: {link} ({why})")
    return problems


def _why_broken(site: Path, page: Path, link: str, pages: dict[Path, Page]) -> str | None:
    link = link.strip()
    scheme = urlsplit(link).scheme.lower()
    if scheme == "file":
        return "a file: URL"
    if is_remote(link) or scheme in ("mailto", "javascript", "data", "tel"):
        return None
    address, fragment = urldefrag(link)
    address = unquote(urlsplit(address).path)
    target = page if not address else (page.parent / address).resolve()
    if address.endswith("/") or target.is_dir():
        target = target / "index.html"
    if site not in target.parents and target != site:
        return "outside the site"
    if not target.is_file():
        return "no such file"
    fragment = unquote(fragment)
    if fragment and target in pages and fragment not in pages[target].ids:
        return f"no id {fragment!r} in {target.relative_to(site)}"
    return None
