"""Charts drawn on the server as inline SVG: a run's oldest eligible age over time."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ...fleet.runs.run_ages import AgeSample
from ..cli_printing import iso_time

WIDTH = 640
HEIGHT = 180
#: Margins for the axis labels: left, right, top, bottom.
MARGIN = (56, 12, 12, 28)


@dataclass(frozen=True)
class LineChart:
    """A line chart's geometry in SVG user units, ready for the template."""

    width: int
    height: int
    #: The ``points`` attribute of the polyline ("x,y x,y ..."); empty without samples.
    points: str
    samples: int
    #: The highest value on the y axis, and the last value.
    top: float
    latest: float | None
    #: The first and last sample's times (ISO 8601 UTC).
    start: str | None
    end: str | None
    plot: tuple[int, int, int, int]  # left, top, right, bottom of the plot area


def age_chart(samples: Sequence[AgeSample]) -> LineChart:
    """The oldest eligible age (seconds) over time, oldest sample on the left."""
    left, right, top, bottom = MARGIN[0], WIDTH - MARGIN[1], MARGIN[2], HEIGHT - MARGIN[3]
    plot = (left, top, right, bottom)
    if not samples:
        return LineChart(WIDTH, HEIGHT, "", 0, 1.0, None, None, None, plot)
    ages = [s.oldest_eligible_age_seconds for s in samples]
    highest = max(max(ages), 1.0)
    first, last = samples[0].at_ms, samples[-1].at_ms
    span = max(last - first, 1)

    def x(at_ms: int) -> float:
        if len(samples) == 1:
            return (left + right) / 2
        return left + (at_ms - first) / span * (right - left)

    def y(age: float) -> float:
        return bottom - age / highest * (bottom - top)

    points = " ".join(f"{x(s.at_ms):.1f},{y(a):.1f}" for s, a in zip(samples, ages, strict=True))
    return LineChart(
        WIDTH,
        HEIGHT,
        points,
        len(samples),
        highest,
        ages[-1],
        iso_time(first),
        iso_time(last),
        plot,
    )
