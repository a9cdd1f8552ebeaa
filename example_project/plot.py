"""The demo's plot: units in use and tasks waiting over time, one panel per semaphore, drawn
with matplotlib.

Each panel shows its series as steps (a value holds until the next change), the semaphore's
limit as a solid red line and any other level (a queue's cap) as a dashed line, each labelled
on the line and in the panel's legend; beside them, on a right-hand axis of its own, the tasks
waiting (per queue) as dotted steps: what fair sharing is about (a queue at its cap waits, the
other does not). Every entry of a legend has a colour of its own.

matplotlib is optional (the ``demo`` extra: ``pip install -e '.[demo]'``, which ``make demo``
does). It is imported only by :func:`figure` and :func:`render`, which raise
:class:`MatplotlibMissing` without it, so the demo still runs and prints its summary. The
figure is drawn with the Agg canvas: a file, never a window, with no display needed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from matplotlib.artist import Artist
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

INSTALL_HINT = "pip install -e '.[demo]'"
TITLE = "celery-semaphore demo: units in use and tasks waiting over time, per semaphore"
X_LABEL = "seconds since start"
Y_LABEL = "units in use"
#: the right-hand axis of a panel with waiting series
WAITING_LABEL = "tasks waiting (dotted)"

#: the colour of every limit line; no series or mark gets it
LIMIT_COLOR = "#d62728"
#: colours for series and marks (matplotlib's "tab10" less red), given out in order of first
#: use: a label keeps its colour from panel to panel, and no two entries of a panel share one
#: (up to 9 of them)
PALETTE = [
    "#1f77b4",  # blue
    "#ff7f0e",  # orange
    "#2ca02c",  # green
    "#9467bd",  # purple
    "#17becf",  # cyan
    "#e377c2",  # pink
    "#bcbd22",  # olive
    "#8c564b",  # brown (late: close to the limit's red)
    "#7f7f7f",  # grey
]
WIDTH_INCHES = 11.0
PANEL_INCHES = 2.6
DPI = 100


class MatplotlibMissing(ImportError):
    """The plot needs matplotlib, and it is not installed."""


@dataclass
class Series:
    label: str
    #: (seconds since the start, value from then on), in time order; the value is 0 before
    steps: list[tuple[float, int]]
    #: drawn as a shaded area under a thin line, beneath the other series (a total, under its
    #: parts): lines drawn over it keep their own colours
    filled: bool = False


@dataclass
class Mark:
    """A level drawn as a dashed horizontal line, e.g. a queue's cap."""

    label: str
    value: int


@dataclass
class Panel:
    title: str
    limit: int
    series: list[Series] = field(default_factory=list)
    marks: list[Mark] = field(default_factory=list)
    #: tasks waiting (sent, their body not started yet), e.g. per queue: dotted steps on a
    #: right-hand axis of their own (a count of tasks, not of units)
    waiting: list[Series] = field(default_factory=list)


def require_matplotlib() -> None:
    """Raise :class:`MatplotlibMissing`, with how to install it, when matplotlib is not
    importable."""
    try:
        import matplotlib  # noqa: F401
    except ImportError as exc:
        raise MatplotlibMissing(
            f"the plot needs matplotlib, which is not installed: {INSTALL_HINT} "
            "(or `make demo`, which installs it)"
        ) from exc


def figure(panels: list[Panel], duration: float) -> Figure:
    """The figure for ``panels`` over ``[0, duration]`` seconds: one axes per panel, top to
    bottom, sharing the time axis."""
    require_matplotlib()
    from matplotlib.figure import Figure

    duration = max(duration, 1.0)
    count = max(1, len(panels))
    fig = Figure(figsize=(WIDTH_INCHES, 0.9 + PANEL_INCHES * count), dpi=DPI, layout="constrained")
    fig.suptitle(TITLE, fontsize=13, fontweight="bold")
    axes = fig.subplots(count, 1, sharex=True, squeeze=False)[:, 0]
    colours: dict[str, str] = {}
    for ax, panel in zip(axes[: len(panels)], panels, strict=True):
        _panel(ax, panel, duration, colours)
    axes[-1].set_xlabel(X_LABEL)
    axes[-1].set_xlim(0.0, duration)
    return fig


def render(panels: list[Panel], duration: float, path: Path) -> Figure:
    """Draw ``panels`` over ``[0, duration]`` seconds and save them as a PNG at ``path``;
    return the figure (laid out as saved: its transforms map data to the file's pixels)."""
    fig = figure(panels, duration)
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    FigureCanvasAgg(fig)  # a file-only canvas: no GUI toolkit, no display
    fig.savefig(path, format="png", dpi=DPI)
    return fig


def _colour(colours: dict[str, str], label: str, taken: set[str]) -> str:
    """``label``'s colour: the one it had in an earlier panel, else the next of the palette;
    never one in ``taken`` (this panel's) while the palette has another."""
    colour = colours.get(label)
    if colour is None or colour in taken:
        start = len(colours)
        order = [PALETTE[(start + i) % len(PALETTE)] for i in range(len(PALETTE))]
        colour = next((c for c in order if c not in taken), order[0])
        colours.setdefault(label, colour)
    taken.add(colour)
    return colour


def _panel(ax: Axes, panel: Panel, duration: float, colours: dict[str, str]) -> None:
    from matplotlib.ticker import MaxNLocator

    peak = max([panel.limit, *(m.value for m in panel.marks)])
    peak = max([peak, *(v for s in panel.series for _, v in s.steps)])
    legend: list[Artist] = []  # in the order drawn: series, the limit, the marks, waiting
    taken = {LIMIT_COLOR}
    for series in panel.series:
        times = [0.0, *(t for t, _ in series.steps), duration]
        values = [0, *(v for _, v in series.steps)]
        values.append(values[-1])
        colour = _colour(colours, series.label, taken)
        (line,) = ax.plot(
            times,
            values,
            drawstyle="steps-post",
            color=colour,
            linewidth=0.8 if series.filled else 1.6,
            label=series.label,
            zorder=1.5 if series.filled else 2,
        )
        if series.filled:
            area = ax.fill_between(
                times, values, step="post", color=colour, alpha=0.3, linewidth=0, zorder=1
            )
            area.set_label(series.label)
            legend.append(area)
        else:
            legend.append(line)
    levels = [(f"limit {panel.limit}", panel.limit, LIMIT_COLOR, "-")]
    levels += [
        (f"{mark.label} {mark.value}", mark.value, _colour(colours, mark.label, taken), "--")
        for mark in panel.marks
    ]
    for label, value, colour, style in levels:
        # over the shaded total, under the series' lines: a series at its limit stays visible
        legend.append(
            ax.axhline(value, color=colour, linestyle=style, linewidth=1.4, label=label, zorder=1.8)
        )
        ax.annotate(
            label,
            xy=(1.0, value),
            xycoords=("axes fraction", "data"),
            xytext=(-4, 2),
            textcoords="offset points",
            ha="right",
            va="bottom",
            color=colour,
            fontsize=8,
        )
    legend += _waiting(ax, panel, duration, colours, taken)
    ax.set_title(panel.title, loc="left", fontsize=11)
    ax.set_ylabel(Y_LABEL)
    ax.set_ylim(0, peak + 1)
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    ax.grid(True, axis="y", color="#dddddd", linewidth=0.6)
    # beyond the right-hand axis's numbers and label, when there is one
    right = 1.1 if panel.waiting else 1.01
    ax.legend(
        handles=legend, loc="upper left", bbox_to_anchor=(right, 1.0), fontsize=8, frameon=False
    )


def _waiting(
    ax: Axes, panel: Panel, duration: float, colours: dict[str, str], taken: set[str]
) -> list[Artist]:
    """The panel's waiting series, dotted, on a right-hand axis (none: no axis); their lines,
    for the legend."""
    from matplotlib.ticker import MaxNLocator

    if not panel.waiting:
        return []
    right = ax.twinx()
    lines: list[Artist] = []
    for series in panel.waiting:
        times = [0.0, *(t for t, _ in series.steps), duration]
        values = [0, *(v for _, v in series.steps)]
        values.append(values[-1])
        (line,) = right.plot(
            times,
            values,
            drawstyle="steps-post",
            color=_colour(colours, series.label, taken),
            linestyle=":",
            linewidth=1.8,
            label=series.label,
        )
        lines.append(line)
    peak = max([1, *(v for s in panel.waiting for _, v in s.steps)])
    right.set_ylim(0, peak * 1.1 + 1)
    right.set_ylabel(WAITING_LABEL)
    right.yaxis.set_major_locator(MaxNLocator(integer=True))
    return lines
