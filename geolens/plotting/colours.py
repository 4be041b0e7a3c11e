"""One fixed colour per series in every figure: a CCR value, a named series (a measure, a lens, a matrix,
a model) keeps its colour wherever it appears.

Example:
    >>> ccr_colour(1) == ccr_colour(1.0) != ccr_colour(5), series_colour("tuned")
    (True, '#0072B2')
"""

from __future__ import annotations

import zlib
from typing import Sequence

__all__ = ["CCR_COLOURS", "PALETTE", "SERIES_COLOURS", "ccr_colour", "distinct_colours", "rgba", "series_colour"]

# Colour-blind-safe (Okabe & Ito) colours first, then darker extras that print well on white.
PALETTE: tuple[str, ...] = ("#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#8C564B", "#000000",
                            "#7F7F7F", "#6A3D9A")

# A CCR value has the same colour in every figure (PGA, probes, studies).
CCR_COLOURS: dict[int, str] = {0: "#000000", 1: "#0072B2", 2: "#E69F00", 3: "#56B4E9", 5: "#D55E00", 10: "#009E73",
                               20: "#CC79A7", 50: "#8C564B"}

# Named series with a fixed colour wherever they appear.
SERIES_COLOURS: dict[str, str] = {
    "full space": "#0072B2", "readout subspaces": "#D55E00", "random subspaces": "#7F7F7F",
    "clean": "#0072B2", "ablated": "#D55E00",
    "tuned": "#0072B2", "logit": "#D55E00",
    "held_out": "#0072B2", "train": "#D55E00",
    "W_U raw": "#0072B2", "W_U folded": "#56B4E9", "W_E": "#D55E00",
    "probe accuracy": "#009E73", "chance": "#7F7F7F",
    "pga_z": "#000000", "pga.z": "#000000",
    "effective_rank": "#0072B2", "rankme": "#56B4E9", "alpha_req": "#D55E00", "log_isotropy": "#CC79A7",
    "mean_cosine": "#009E73", "cosine_std": "#E69F00", "condition_number": "#8C564B", "isotropy": "#6A3D9A",
    "I": "#0072B2", "II": "#009E73", "III": "#D55E00",
}


def ccr_colour(ccr: object) -> str:
    """The colour of a CCR value, the same in every figure.

    Example:
        >>> ccr_colour(1) == ccr_colour(1.0) != ccr_colour(5)
        True
    """
    value = int(float(ccr))
    return CCR_COLOURS.get(value, PALETTE[value % len(PALETTE)])


def series_colour(key: object) -> str:
    """The colour of a named series (a measure, a lens, a matrix, a model): fixed, from its name alone."""
    text = str(key)
    return SERIES_COLOURS.get(text) or PALETTE[zlib.crc32(text.encode()) % len(PALETTE)]


def distinct_colours(keys: Sequence[object]) -> dict[object, str]:
    """Each key's fixed colour; keys whose colour is taken in this figure get the next free one.

    Example:
        >>> list(distinct_colours(["tuned", "logit"]).values())
        ['#0072B2', '#D55E00']
    """
    out: dict[object, str] = {}
    for key in keys:
        colour = series_colour(key)
        if colour in out.values() and str(key) not in SERIES_COLOURS:
            free = [c for c in PALETTE if c not in out.values()]
            start = PALETTE.index(colour) if colour in PALETTE else 0
            colour = next((c for c in PALETTE[start:] + PALETTE[:start] if c in free), colour)
        out[key] = colour
    return out


def rgba(colour: str, alpha: float) -> str:
    """A ``#rrggbb`` colour with transparency ``alpha`` (a band under its line).

    Example:
        >>> rgba("#0072B2", 0.2)
        'rgba(0,114,178,0.2)'
    """
    colour = colour.lstrip("#")
    r, g, b = (int(colour[i:i + 2], 16) for i in (0, 2, 4))
    return f"rgba({r},{g},{b},{alpha})"
