"""A griffe extension for the API reference: geolens's docstrings as the site's Markdown needs them.

The docstrings in the code stay as they are; what the site renders is adjusted:

- reST cross-reference roles (``:func:`~geolens.lens.cached_tuned_lens```, ``:class:`TunedLens```)
  become links to the object's entry in the reference: the name is resolved as written, then
  beside the documented object (its class, its module, ``geolens``), then by a unique last name in
  the package. A name that resolves to nothing the site documents stays inline code (an optional
  cross-reference: no warning). The link text is the name, its last dotted part when the target
  starts with ``~``;
- a reference to a documentation page, ``docs/methods.md §A.4a``, becomes a link to that page and
  section (the section's anchor read from the page's headings);
- an ``Example:`` (or ``Example (on a tiny model):``) section header becomes ``Examples:``, the
  Google-style section whose ``>>>`` lines griffe renders as code (the singular form would be read as
  an admonition, and its doctest lines as Markdown).

Loaded by mkdocs.yml (``extensions:`` of the mkdocstrings Python handler).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

from griffe import Alias, Extension, Object
from markdown.extensions.toc import slugify

DOCS = Path(__file__).resolve().parent
_ROLE = re.compile(r":(?:py:)?(?:func|class|meth|mod|data|attr|obj|exc|const):`(~?)([^`<]+?)(?:\s*<([^>]+)>)?`")
_PAGE = re.compile(r"(``)?docs/([\w/-]+)\.md(?: §([A-Z](?:\.\d+[a-z]?)?))?(``)?")
_HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*$")


def plain(text: str, resolve: Callable[[str], str | None] = lambda name: None) -> str:
    """``:func:`~a.b.c``` -> a link to ``a.b.c`` titled ``c`` (inline code when ``resolve`` finds nothing).

    ``resolve`` returns the object's identifier, or the page (``"lens.md"``) of a module documented on one.

    Example:
        >>> plain("see :func:`~geolens.lens.evaluate` and :class:`TunedLens`")
        'see `evaluate` and `TunedLens`'
        >>> plain(":func:`~geolens.lens.evaluate`", lambda name: name)
        '<autoref identifier="geolens.lens.evaluate" optional><code>evaluate</code></autoref>'
    """

    def repl(match: re.Match) -> str:
        tilde, target = match.group(1), (match.group(3) or match.group(2)).strip()
        if match.group(3):  # :func:`title <target>`: keep the title
            title = match.group(2).strip()
        elif tilde:
            title = target.rsplit(".", 1)[-1]
        else:
            title = target
        identifier = resolve(target)
        if identifier is None:
            return f"`{title}`"
        if identifier.endswith(".md"):  # a module with its own page
            return f"[`{title}`]({identifier})"
        return f'<autoref identifier="{identifier}" optional><code>{title}</code></autoref>'

    return _ROLE.sub(repl, text)


def section_anchors(page: Path) -> dict[str, str]:
    """``{"A.4a": "a4a-approximate-pga-a-sample-of-pairs", "A": "a-subspace-pga", ...}`` of a page's headings."""
    anchors: dict[str, str] = {}
    in_code = False
    for line in page.read_text(encoding="utf-8").splitlines():
        if line.lstrip().startswith("```"):
            in_code = not in_code
        match = None if in_code else _HEADING.match(line)
        if match:
            title = re.sub(r"\{.*\}$", "", match.group(1)).strip()
            number = re.match(r"([A-Z](?:\.\d+[a-z]?)?)\.?\s", title)
            if number:
                anchors.setdefault(number.group(1), slugify(title.replace("`", ""), "-"))
    return anchors


def page_links(text: str, docs: Path = DOCS) -> str:
    """``docs/methods.md §A.4a`` -> a Markdown link to ``../methods.md#<anchor of A.4a>`` (from an API page).

    Example:
        >>> page_links("see docs/methods.md §A.4a.")
        'see [methods.md §A.4a](../methods.md#a4a-approximate-pga-a-sample-of-pairs).'
    """

    def repl(match: re.Match) -> str:
        page, section = match.group(2), match.group(3)
        path = docs / f"{page}.md"
        if not path.is_file():
            return match.group(0)
        url = f"../{page}.md"  # the site rewrites it (and checks the page and the anchor)
        title = f"{page}.md"
        if section:
            anchor = section_anchors(path).get(section)
            if anchor is None:
                raise ValueError(f"docs/{page}.md has no section {section} (a docstring refers to it)")
            url += f"#{anchor}"
            title += f" §{section}"
        return f"[{title}]({url})"

    return _PAGE.sub(repl, text)


_EXAMPLE = re.compile(r"^(\s*)Examples?\s*(\(.*\))?\s*:\s*$")


def example_sections(text: str) -> str:
    r"""``Example:`` / ``Example (note):`` headers -> ``Examples:`` (the note kept as the section's first line).

    Example:
        >>> example_sections("Run it.\n\nExample (tiny):\n    >>> 1 + 1\n    2")
        'Run it.\n\nExamples:\n    (tiny):\n\n    >>> 1 + 1\n    2'
    """
    lines = []
    for line in text.split("\n"):
        match = _EXAMPLE.match(line)
        if match:
            lines.append(f"{match.group(1)}Examples:")
            if match.group(2):
                lines += [f"{match.group(1)}    {match.group(2)}:", ""]
        else:
            lines.append(line)
    return "\n".join(lines)


def _walk(obj: Object):
    yield obj
    for member in obj.members.values():
        if not isinstance(member, Alias):
            yield from _walk(member)


class RestRoles(Extension):
    """Rewrite the reST roles and page references of every docstring of a loaded package."""

    def on_package(self, *, pkg, **kwargs) -> None:
        objects = list(_walk(pkg))
        by_name: dict[str, set[str]] = {}
        for obj in objects:
            if not any(part.startswith("_") for part in obj.path.split(".")[1:]):
                by_name.setdefault(obj.name, set()).add(obj.path)

        def lookup(path: str) -> str | None:
            if path == pkg.path:
                return "index.md"
            if not path.startswith(pkg.path + "."):
                return None
            try:
                found = pkg[path[len(pkg.path) + 1:]]
                canonical = found.canonical_path
            except Exception:  # not a member, or an alias that does not resolve
                return None
            page = DOCS / "api" / f"{canonical.split('.')[1]}.md"
            if found.is_module and canonical.count(".") == 1 and page.is_file():
                return page.name  # a subpackage's page (its heading is not an anchor)
            return canonical

        for obj in objects:
            if obj.docstring is None:
                continue
            scopes = [s.path for s in (obj, obj.parent, obj.module) if s is not None] + [pkg.path]

            def resolve(target: str, scopes=scopes) -> str | None:
                for candidate in [target] + [f"{scope}.{target}" for scope in scopes]:
                    found = lookup(candidate)
                    if found:
                        return found
                paths = by_name.get(target.rsplit(".", 1)[-1], set())
                return next(iter(paths)) if len(paths) == 1 else None

            obj.docstring.value = example_sections(page_links(plain(obj.docstring.value, resolve)))
