"""``%gpuwatch chart``: a cell's timeline as an inline SVG.

Allocated and reserved bytes as the allocator reported them (CUDA), the predicted line
(green, dashed), the cell's peak as a red dashed line (dotted where it is the
prediction), and the phases inside the cell as a band underneath, named where they are
wide enough. On the CPU there are no allocator figures: the prediction is drawn.
"""

from __future__ import annotations

import html

from ..fmt import fmt_bytes
from ._line import CellReport
from ._tap import Ended

WIDTH, HEIGHT, BAND = 640, 120, 18
COLOURS = {
    "forward": "#4e79a7",
    "eval": "#76b7b2",
    "backward": "#f28e2b",
    "optimizer.step": "#e15759",
    "zero_grad": "#59a14f",
    "data": "#bab0ac",
}


def svg(rep: CellReport, inside: list[Ended], samples: list[tuple[int, int, int]]) -> str:
    """The chart of one cell, or "" when it lasted no time."""
    cell = rep.cell
    span = cell.t1 - cell.t0
    if span <= 0:
        return ""
    top = max([rep.peak or 0, *(s[2] for s in samples), *(v for _, v in rep.curve), 1])

    def x(t: int) -> float:
        return round((t - cell.t0) / span * WIDTH, 1)

    def y(v: int) -> float:
        return round(HEIGHT - v / top * (HEIGHT - 10), 1)

    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT + BAND + 4}"'
        ' font-family="monospace" font-size="10">'
    ]
    for column, colour in ((2, "#9c9c9c"), (1, "#1f77b4")):  # reserved, then allocated
        pts = " ".join(f"{x(s[0])},{y(s[column])}" for s in samples)
        if pts:
            out.append(f'<polyline fill="none" stroke="{colour}" points="{pts}"/>')
    pts = " ".join(f"{x(min(t, cell.t1))},{y(v)}" for t, v in rep.curve)
    if pts:  # the predicted line, as the dashboard draws it
        out.append(
            f'<polyline fill="none" stroke="#2ca02c" stroke-dasharray="4,2" points="{pts}"/>'
        )
    if rep.peak:
        dash = "5,3" if rep.measured else "2,3"  # a prediction is dotted
        out.append(
            f'<line x1="0" x2="{WIDTH}" y1="{y(rep.peak)}" y2="{y(rep.peak)}" stroke="#d62728"'
            f' stroke-dasharray="{dash}"/>'
            f'<text x="2" y="{y(rep.peak) - 2}" fill="#d62728">'
            f"{html.escape(fmt_bytes(rep.peak))}</text>"
        )
    for s in inside:
        x0, x1 = x(s.t0), x(s.t1)
        colour = COLOURS.get(s.name, "#cccccc")
        out.append(
            f'<rect x="{x0}" y="{HEIGHT + 2 + 4 * s.depth}" width="{max(1.0, x1 - x0)}"'
            f' height="{BAND - 4 * s.depth}" fill="{colour}"><title>{html.escape(s.name)}'
            "</title></rect>"
        )
        if x1 - x0 > 8 * len(s.name):
            out.append(
                f'<text x="{x0 + 2}" y="{HEIGHT + BAND - 4}" fill="white">'
                f"{html.escape(s.name)}</text>"
            )
    out.append("</svg>")
    return "".join(out)
