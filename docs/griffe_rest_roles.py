"""A griffe extension for the API reference: geolens's docstrings as the site's Markdown needs them.

The docstrings in the code stay as they are; what the site renders is adjusted:

- reST cross-reference roles (``:func:`~geolens.lens.cached_tuned_lens```, ``:class:`TunedLens```)
  become inline code of the name (its last dotted part when the target starts with ``~``);
- an ``Example:`` (or ``Example (on a tiny model):``) section header becomes ``Examples:``, the
  Google-style section whose ``>>>`` lines griffe renders as code (the singular form would be read as
  an admonition, and its doctest lines as Markdown).

Loaded by mkdocs.yml (``extensions:`` of the mkdocstrings Python handler).
"""

from __future__ import annotations

import re

from griffe import Extension, Object

_ROLE = re.compile(r":(?:py:)?(?:func|class|meth|mod|data|attr|obj|exc|const):`(~?)([^`<]+?)(?:\s*<([^>]+)>)?`")


def plain(text: str) -> str:
    """``:func:`~a.b.c``` -> ```c```; ``:class:`a.B``` -> ```a.B```.

    Example:
        >>> plain("see :func:`~geolens.lens.evaluate` and :class:`TunedLens`")
        'see `evaluate` and `TunedLens`'
    """

    def repl(match: re.Match) -> str:
        tilde, name = match.group(1), (match.group(3) or match.group(2)).strip()
        if match.group(3):  # :func:`title <target>`: keep the title
            name = match.group(2).strip()
        elif tilde:
            name = name.rsplit(".", 1)[-1]
        return f"`{name}`"

    return _ROLE.sub(repl, text)


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


class RestRoles(Extension):
    """Rewrite the reST roles of every docstring griffe loads."""

    def on_instance(self, *, obj: Object, **kwargs) -> None:
        if obj.docstring is not None:
            obj.docstring.value = example_sections(plain(obj.docstring.value))
