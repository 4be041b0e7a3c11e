"""Figures as static files (PNG, SVG, PDF) through kaleido and Chromium.

Example:
    >>> STATIC_FORMATS
    ('png', 'svg', 'pdf')
    >>> write_figures([], [])  # nothing to write: no browser needed
    []
"""

from __future__ import annotations

import contextlib
import os
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

from geolens._io import atomic_file
from geolens.plotting.style import print_size

if TYPE_CHECKING:
    import plotly.graph_objects as go

__all__ = ["NO_BROWSER", "STATIC_FORMATS", "browser_path", "write_figures"]


STATIC_FORMATS = ("png", "svg", "pdf")


NO_BROWSER = ("writing static figures needs Chromium (apt-get install chromium) or BROWSER_PATH set to a "
              "Chrome/Chromium binary")


def browser_path() -> str | None:
    """Chromium for kaleido: ``BROWSER_PATH`` if set, else a ``chromium``/``google-chrome`` on the PATH."""
    found = os.environ.get("BROWSER_PATH")
    for name in ("chromium", "chromium-browser", "google-chrome", "chrome"):
        found = found or shutil.which(name)
    return found


def write_figures(figures: Sequence[go.Figure], paths: Sequence[str | Path], *, scale: float = 2.0) -> list[Path]:
    """Write figures as static files (PNG, SVG or PDF, from each path's suffix) through kaleido and Chromium.

    Figures keep their page size (:func:`print_size`: the width they were styled for); PNGs are
    drawn at ``scale`` (2: sharp in print). One browser serves every figure of the call. Each file is
    written beside its path and renamed into place, as the report's other files are: a symbolic link
    at a path is replaced, never written through.

    Example:
        >>> write_figures([go.Figure()], ["out/fig.png"])   # needs Chromium  # doctest: +SKIP
    """
    paths = [Path(p) for p in paths]
    if len(paths) != len(figures):
        raise ValueError(f"paths must give one path per figure: {len(figures)} figures, {len(paths)} paths")
    bad = [str(p) for p in paths if p.suffix.lstrip(".").lower() not in STATIC_FORMATS]
    if bad:
        raise ValueError(f"paths must end in one of {['.' + f for f in STATIC_FORMATS]}; got {bad}")
    if not figures:
        return []
    browser = browser_path()
    if browser is None:
        raise RuntimeError(NO_BROWSER)
    os.environ.setdefault("BROWSER_PATH", browser)  # kaleido's choreographer reads it
    import plotly.io as pio

    with contextlib.ExitStack() as stack:
        temporary = [stack.enter_context(atomic_file(path)) for path in paths]  # renamed onto paths at the end
        pio.write_images(list(figures), [str(p) for p in temporary],
                         format=[p.suffix.lstrip(".").lower() for p in paths],
                         width=[print_size(f)[0] for f in figures],
                         height=[print_size(f)[1] for f in figures], scale=scale)
    return paths
