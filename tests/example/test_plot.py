"""The demo's plot (matplotlib): a real PNG, one panel per semaphore with its title, axis
labels, a legend whose entries each have a colour of their own, the limit and the caps as
horizontal lines; the pixels land where the data says; and without matplotlib it says how to
get it instead of failing."""

from __future__ import annotations

import struct
import sys
import zlib
from pathlib import Path

import numpy as np
import pytest
import redis
from matplotlib.colors import to_rgb
from matplotlib.image import imread
from matplotlib.lines import Line2D

from example_project import plot
from example_project.demo import (
    DEFAULT_PNG,
    Limit,
    Run,
    Sent,
    _panels,
    argument_parser,
    write_plot,
)
from example_project.meter import Event
from example_project.waits import waiting_steps


def png_chunks(data: bytes) -> list[tuple[bytes, bytes]]:
    """A PNG's chunks, checked: the signature, every CRC, IHDR first and IEND last."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n", data[:8]
    pos, chunks = 8, []
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos : pos + 4])
        kind, body = data[pos + 4 : pos + 8], data[pos + 8 : pos + 8 + length]
        (crc,) = struct.unpack(">I", data[pos + 8 + length : pos + 12 + length])
        assert crc == zlib.crc32(kind + body), f"bad CRC in {kind!r}"
        chunks.append((kind, body))
        pos += 12 + length
    assert chunks[0][0] == b"IHDR"
    assert chunks[-1][0] == b"IEND"
    return chunks


def check_matplotlib_png(path: Path) -> tuple[int, int]:
    """``path`` is a well-formed PNG that matplotlib wrote; its width and height."""
    chunks = png_chunks(path.read_bytes())
    width, height = struct.unpack(">II", chunks[0][1][:8])
    text = dict(body.split(b"\0", 1) for kind, body in chunks if kind == b"tEXt")
    assert text.get(b"Software", b"").startswith(b"Matplotlib"), text
    return width, height


def gateway(series: list[tuple[str, list[tuple[float, int]]]]) -> plot.Panel:
    return plot.Panel(
        "payment-gateway",
        3,
        [plot.Series(label, steps, filled=label == "in use") for label, steps in series],
        [plot.Mark("bulk cap", 2)],
    )


def legend(ax: object) -> dict[str, tuple[float, float, float]]:
    """An axes' legend: label -> colour, in order."""
    found = ax.get_legend()  # type: ignore[attr-defined]
    assert found is not None
    out = {}
    for text, handle in zip(found.get_texts(), found.legend_handles, strict=True):
        colour = handle.get_color() if isinstance(handle, Line2D) else handle.get_facecolor()
        out[text.get_text()] = to_rgb(colour)
    return out


def test_one_panel_per_semaphore_with_labels_legend_and_levels(tmp_path: Path) -> None:
    panels = [
        gateway(
            [
                ("in use", [(0.5, 3), (4.0, 1)]),
                ("interactive", [(0.5, 1), (4.0, 0)]),
                ("bulk", [(0.5, 2), (4.0, 1)]),
            ]
        ),
        plot.Panel("gpu", 4, [plot.Series("bulk", [(1.0, 4)]), plot.Series("interactive", [])]),
    ]
    path = tmp_path / "out" / "plot.png"
    path.parent.mkdir()
    fig = plot.render(panels, 5.0, path)
    width, height = check_matplotlib_png(path)
    assert (width, height) == (
        round(plot.WIDTH_INCHES * plot.DPI),
        round((0.9 + plot.PANEL_INCHES * 2) * plot.DPI),
    )
    assert fig.get_suptitle() == plot.TITLE
    axes = fig.axes
    assert [ax.get_title(loc="left") for ax in axes] == ["payment-gateway", "gpu"]
    assert [ax.get_ylabel() for ax in axes] == [plot.Y_LABEL] * 2
    assert axes[-1].get_xlabel() == "seconds since start"
    assert axes[0].get_xlim() == (0.0, 5.0)
    first, second = legend(axes[0]), legend(axes[1])
    assert list(first) == ["in use", "interactive", "bulk", "limit 3", "bulk cap 2"]
    assert list(second) == ["bulk", "interactive", "limit 4"]
    for entries in (first, second):
        assert len(set(entries.values())) == len(entries), entries  # every colour its own
        red = [label for label, rgb in entries.items() if rgb == to_rgb(plot.LIMIT_COLOR)]
        assert red == [next(label for label in entries if label.startswith("limit"))], entries
    assert second["bulk"] == first["bulk"]  # a queue keeps its colour from panel to panel
    # the limit and the cap are horizontal lines at their values, labelled on the line too
    levels = {
        line.get_label(): (np.asarray(line.get_ydata(), dtype=float).tolist(), line.get_linestyle())
        for line in axes[0].get_lines()
        if line.get_label() in ("limit 3", "bulk cap 2")
    }
    assert levels == {"limit 3": ([3.0, 3.0], "-"), "bulk cap 2": ([2.0, 2.0], "--")}
    notes = {text.get_text() for text in axes[0].texts}
    assert {"limit 3", "bulk cap 2"} <= notes


def test_pixels_land_where_the_data_says(tmp_path: Path) -> None:
    """The series is at its limit 3 until t=1, at 2 until t=2, at 0 after: its colour is on
    the limit's row at t=0.5 (drawn over the limit line), on row 2 at t=1.5 and not at t=2.5;
    the limit's red is on its row where the series is not."""
    path = tmp_path / "p.png"
    panel = plot.Panel("gpu", 3, [plot.Series("bulk", [(0.0, 3), (1.0, 2), (2.0, 0)])])
    fig = plot.render([panel], 3.0, path)
    image = imread(str(path))
    ax = fig.axes[0]
    colour = legend(ax)["bulk"]

    def near(t: float, value: float, rgb: tuple[float, float, float]) -> bool:
        x, y = ax.transData.transform((t, value))
        row, column = round(image.shape[0] - y), round(x)
        return any(
            max(abs(float(a) - b) for a, b in zip(image[r, column, :3], rgb, strict=True)) < 0.1
            for r in range(row - 2, row + 3)
        )

    assert near(0.5, 3, colour)
    assert near(1.5, 2, colour)
    assert not near(2.5, 2, colour)
    assert near(2.5, 3, to_rgb(plot.LIMIT_COLOR))
    assert not near(2.5, 3, colour)


def test_the_demo_draws_a_panel_per_semaphore_and_one_per_name_template() -> None:
    limits = [
        Limit("payment-gateway", 3, {"bulk": 2}),
        Limit("llm:acme", 2, template="llm:{customer_id}"),
        Limit("llm:globex", 2, template="llm:{customer_id}"),
        Limit("gpu", 4),
    ]
    run = Run(redis.Redis(), "prefix", limits, started=100.0)
    run.record(
        [
            Event(100.5, "payment-gateway", "bulk", "charge", "a", 1, 1, 1),
            Event(100.75, "payment-gateway", "interactive", "charge", "b", 1, 2, 1),
            Event(101.0, "llm:acme", "interactive", "summarize", "c", 1, 1, 1),
            Event(101.2, "gpu", "bulk", "transcode", "d", 2, 2, 2),
        ]
    )
    panels = _panels(run)
    assert [p.title for p in panels] == [
        "payment-gateway",
        "llm:{customer_id} (one semaphore each)",
        "gpu",
    ]
    assert [s.label for s in panels[0].series] == ["in use", "interactive", "bulk"]
    assert [(m.label, m.value) for m in panels[0].marks] == [("bulk cap", 2)]
    assert [s.label for s in panels[1].series] == ["llm:acme", "llm:globex"]
    assert panels[0].series[0].steps == [(0.5, 1), (0.75, 2)]  # seconds since the start
    fig = plot.figure(panels, 2.0)
    assert len(fig.axes) == 3


def test_by_default_the_plot_goes_to_the_current_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert argument_parser().parse_args([]).png == DEFAULT_PNG
    assert argument_parser().parse_args(["--png", "x/y.png"]).png == Path("x/y.png")
    monkeypatch.chdir(tmp_path)
    written, line = write_plot([plot.Panel("gpu", 4)], 1.0, DEFAULT_PNG)
    assert written == str(tmp_path / "celery-semaphore-demo.png")  # absolute, when printed
    assert line == f"plot of units in use and tasks waiting over time: {written}"
    check_matplotlib_png(Path(written))


def test_an_unwritable_path_costs_the_plot_only(tmp_path: Path) -> None:
    path = tmp_path / "no such directory" / "p.png"
    written, line = write_plot([plot.Panel("gpu", 4)], 1.0, path)
    assert written is None
    assert line.startswith(f"no plot: could not write {path}: ")


def test_without_matplotlib_it_says_how_to_get_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # `import matplotlib` fails
    path = tmp_path / "p.png"
    with pytest.raises(plot.MatplotlibMissing, match=r"pip install -e '\.\[demo\]'"):
        plot.render([plot.Panel("gpu", 4)], 1.0, path)
    written, line = write_plot([plot.Panel("gpu", 4)], 1.0, path)
    assert written is None
    assert line == (
        "no plot: the plot needs matplotlib, which is not installed: "
        "pip install -e '.[demo]' (or `make demo`, which installs it)"
    )
    assert not path.exists()


def test_tasks_waiting_per_queue_come_from_the_sends_and_the_body_starts() -> None:
    """A task waits from its send to its body's start, on its queue, for the semaphore whose
    service it calls; one that never started is not drawn."""
    sent = {
        "a": Sent("charge", "bulk", 100.0),
        "b": Sent("charge", "bulk", 100.0),
        "c": Sent("charge", "interactive", 101.0),
        "d": Sent("transcode", "bulk", 100.5),
        "never": Sent("charge", "bulk", 100.0),
    }
    events = [
        Event(100.5, "payment-gateway", "bulk", "charge", "a", 1, 1, 1),
        Event(101.0, "payment-gateway", "interactive", "charge", "c", 1, 2, 1),
        Event(101.5, "gpu", "bulk", "transcode", "d", 2, 2, 2),
        Event(102.0, "payment-gateway", "bulk", "charge", "a", -1, 1, 0),
        Event(103.0, "payment-gateway", "bulk", "charge", "b", 1, 2, 1),
    ]
    steps = waiting_steps(sent, events, 100.0)
    assert steps == {
        ("payment-gateway", "bulk"): [(0.0, 2), (0.5, 1), (3.0, 0)],
        # sent and started at the same instant: it never waited
        ("payment-gateway", "interactive"): [(1.0, 0)],
        ("gpu", "bulk"): [(0.5, 1), (1.5, 0)],
    }

    run = Run(redis.Redis(), "prefix", [Limit("payment-gateway", 3, {"bulk": 2})], started=100.0)
    run.sent.update(sent)
    run.record(events)
    [panel] = _panels(run)
    assert [(s.label, s.steps) for s in panel.waiting] == [
        ("interactive waiting", [(1.0, 0)]),
        ("bulk waiting", [(0.0, 2), (0.5, 1), (3.0, 0)]),
    ]
    fig = plot.figure([panel], 4.0)
    left, right = fig.axes  # the units on the left, the tasks waiting on the right
    assert (left.get_ylabel(), right.get_ylabel()) == (plot.Y_LABEL, plot.WAITING_LABEL)
    entries = legend(left)
    assert list(entries)[-2:] == ["interactive waiting", "bulk waiting"]
    assert len(set(entries.values())) == len(entries), entries
    [bulk] = [line for line in right.get_lines() if line.get_label() == "bulk waiting"]
    assert bulk.get_linestyle() == ":"
    assert np.asarray(bulk.get_ydata(), dtype=float).tolist() == [0, 2, 1, 0, 0]
