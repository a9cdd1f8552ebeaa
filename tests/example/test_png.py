"""The demo's stdlib PNG writer and plot: pixels land where they are drawn, and the file
decodes (checked with the same reader as the demo test)."""

from __future__ import annotations

from pathlib import Path

from example_project import plot
from example_project.png import RED, WHITE, Canvas

from .test_demo import png_pixels


def pixel(raw: bytes, width: int, x: int, y: int) -> tuple[int, int, int]:
    at = y * (1 + 3 * width) + 1 + 3 * x
    r, g, b = raw[at : at + 3]
    return r, g, b


def test_canvas_round_trips_through_png() -> None:
    canvas = Canvas(7, 5)
    canvas.rect(1, 1, 2, 3, RED)
    canvas.set(6, 4, (1, 2, 3))
    canvas.set(99, 99, RED)  # off the canvas: ignored
    width, height, raw = png_pixels(canvas.png())
    assert (width, height) == (7, 5)
    assert pixel(raw, width, 1, 1) == RED
    assert pixel(raw, width, 2, 3) == RED
    assert pixel(raw, width, 3, 3) == WHITE
    assert pixel(raw, width, 6, 4) == (1, 2, 3)


def test_plot_draws_the_limit_and_the_series(tmp_path: Path) -> None:
    path = tmp_path / "p.png"
    series = plot.Series("in use", [(0.0, 1), (1.0, 3), (2.0, 0)], plot.PALETTE[0])
    plot.render([plot.Panel("gpu", 3, [series])], 3.0, path)
    width, height, raw = png_pixels(path.read_bytes())
    assert (width, height) == (plot.WIDTH, plot.PANEL)
    colours = {pixel(raw, width, x, y) for x in range(width) for y in range(height)}
    assert RED in colours
    assert plot.PALETTE[0] in colours
    # the series reaches the limit line's row between t=1 and t=2, and not after t=2
    top, bottom = plot.TOP, plot.PANEL - plot.BOTTOM
    limit_row = bottom - round((bottom - top) * 3 / 4)  # span = peak + 1 = 4
    x_mid = plot.LEFT + round((width - plot.LEFT - plot.RIGHT) * 1.5 / 3.0)
    column = [pixel(raw, width, x_mid, y) for y in range(limit_row - 3, limit_row + 3)]
    assert plot.PALETTE[0] in column
    x_late = plot.LEFT + round((width - plot.LEFT - plot.RIGHT) * 2.5 / 3.0)
    column = [pixel(raw, width, x_late, y) for y in range(limit_row - 3, limit_row + 3)]
    assert plot.PALETTE[0] not in column
