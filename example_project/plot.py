"""Concurrency over time, one panel per semaphore, with its limit: a PNG (see :mod:`.png`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from .png import BLACK, GREY, RED, Canvas, Color

PALETTE: list[Color] = [(31, 119, 180), (255, 127, 14), (44, 160, 44), (148, 103, 189)]

WIDTH = 960
PANEL = 200
LEFT, RIGHT, TOP, BOTTOM = 56, 16, 30, 26


@dataclass
class Series:
    label: str
    #: (seconds since the start, value from then on), in time order
    steps: list[tuple[float, int]]
    color: Color = PALETTE[0]
    #: line thickness in pixels (a total drawn thick, under its parts)
    width: int = 2


@dataclass
class Panel:
    title: str
    limit: int
    series: list[Series] = field(default_factory=list)
    #: other horizontal lines: (label, value, color), e.g. a queue's cap
    marks: list[tuple[str, int, Color]] = field(default_factory=list)


def render(panels: list[Panel], duration: float, path: Path) -> None:
    """Draw ``panels`` over ``[0, duration]`` seconds and save them as a PNG at ``path``."""
    canvas = Canvas(WIDTH, PANEL * max(1, len(panels)))
    duration = max(duration, 1.0)
    for index, panel in enumerate(panels):
        _panel(canvas, panel, duration, index * PANEL)
    canvas.save(path)


def _panel(canvas: Canvas, panel: Panel, duration: float, top: int) -> None:
    x0, x1 = LEFT, WIDTH - RIGHT
    y0, y1 = top + TOP, top + PANEL - BOTTOM  # y1 is the axis (value 0)
    peak = max([panel.limit, *(v for s in panel.series for _, v in s.steps)])
    span = peak + 1

    def x_of(t: float) -> int:
        return x0 + round((x1 - x0) * min(max(t, 0.0), duration) / duration)

    def y_of(v: int) -> int:
        return y1 - round((y1 - y0) * v / span)

    canvas.text(x0, top + 8, panel.title)
    for v in range(span + 1):  # grid and value labels
        canvas.hline(x0, x1, y_of(v), GREY, dash=2)
        canvas.text(x0 - 8 - 8 * len(str(v)), y_of(v) - 5, str(v))
    step = 5 if duration > 15 else 2 if duration > 6 else 1
    for s in range(0, int(duration) + 1, step):  # time axis
        canvas.vline(x_of(s), y1, y1 + 3, BLACK)
        label = f"{s}s"
        canvas.text(x_of(s) - 4 * len(label), y1 + 6, label)
    canvas.hline(x0, x1, y1, BLACK)
    canvas.vline(x0, y0, y1, BLACK)
    legend_x = x0 + 16 + 8 * (len(panel.title) + 2)
    for label, value, color in [(f"limit {panel.limit}", panel.limit, RED), *panel.marks]:
        y = y_of(value)
        canvas.hline(x0, x1, y, color, dash=0 if color == RED else 6)
        canvas.hline(x0, x1, y - 1, color, dash=0 if color == RED else 6)
        legend_x = canvas.text(legend_x, top + 8, label, color) + 16
    for series in panel.series:
        _steps(canvas, series, x_of, y_of, duration, thickness=series.width)
        legend_x = canvas.text(legend_x, top + 8, series.label, series.color) + 16


def _steps(
    canvas: Canvas,
    series: Series,
    x_of: Callable[[float], int],
    y_of: Callable[[int], int],
    duration: float,
    thickness: int,
) -> None:
    value, at = 0, 0.0
    for t, v in [*series.steps, (duration, -1)]:
        t = max(t, at)
        xa, xb = x_of(at), x_of(t)
        for d in range(thickness):
            canvas.hline(xa, xb, y_of(value) - d + thickness // 2, series.color)
        if v >= 0:
            for d in range(thickness // 2):
                canvas.vline(xb + d, y_of(value), y_of(v), series.color)
            value = v
        at = t
