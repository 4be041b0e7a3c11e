"""The README figure: PGA z by layer of the default model (CCR sweep), and by relative depth across zoo widths.

Reads the CSVs the two reports write and draws a static PNG (matplotlib, the
``docs`` extra: ``pip install -e ".[docs]"``); the interactive versions are the
plotly figures in ``report.html`` and ``zoo.html``.

Run:  make demo && geolens zoo report --out out/zoo && python docs/make_figure.py
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]


def main(pga_csv: Path, zoo_csv: Path, out: Path, zoo_ccr: int) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    pga = pd.read_csv(pga_csv)
    zoo = pd.read_csv(zoo_csv)
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4), dpi=130)
    for ax in (left, right):
        ax.axhspan(-1.96, 1.96, color="grey", alpha=0.15, lw=0)
        ax.axhline(0, color="grey", lw=0.8, ls=":")

    residual = pga[pga["site"] == "resid_post"]
    for ccr, part in residual.groupby("ccr"):
        part = part.sort_values("layer")
        left.plot(part["layer"], part["z"], marker="o", ms=3, label=f"CCR-{ccr}")
    left.set(title="SmolLM2-135M (d = 576): PGA z by layer", xlabel="layer (0 = embeddings)",
             ylabel="PGA z (readout vs random subspaces)")
    left.legend(frameon=False)

    z = zoo[(zoo["metric"] == "pga.z") & (zoo["site"] == "resid_post") & (zoo["ccr"] == zoo_ccr)]
    z = z[z["step"] == z.groupby("width")["step"].transform("max")]
    for width, part in z.groupby("width"):
        part = part.sort_values("relative_depth")
        right.plot(part["relative_depth"], part["value"], marker="o", ms=3, label=f"d = {width}")
    right.set(title=f"Zoo (GPT-NeoX, 6 layers, trained offline): CCR-{zoo_ccr}", xlabel="relative depth",
              ylabel="PGA z")
    right.legend(frameon=False, title="width")
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out)
    return out


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pga", type=Path, default=ROOT / "out" / "report" / "pga.csv")
    parser.add_argument("--zoo", type=Path, default=ROOT / "out" / "zoo" / "zoo.csv")
    parser.add_argument("--ccr", type=int, default=1, help="CCR of the zoo panel")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "figure.png")
    args = parser.parse_args()
    print(f"wrote {main(args.pga, args.zoo, args.out, args.ccr)}")
