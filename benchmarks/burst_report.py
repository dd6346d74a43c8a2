"""The burst's outputs: the Markdown table, the summary, the JSON object and the plot."""

from __future__ import annotations

import os
import platform
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import redis
import rq

from benchmarks.burst_model import Scenario, Trial
from benchmarks.burst_planner import Answer


def table(trials: Sequence[Trial], slo: float, predicted: dict[str, float]) -> str:
    """The trials as a Markdown table (the planner's predicted peak alongside)."""
    head = (
        "| trial | consumers | peak oldest eligible age (s) | planner's peak (s) | SLO (s) "
        "| holds | burst done after (s) | attempts/item | retries | longest stalled job (s) "
        "| run |"
    )
    rows = [head, "|" + "---|" * 11]
    for trial in trials:
        survivors = trial.workers - 1 if trial.drained else trial.workers
        model = predicted.get(str(survivors))
        model_text = "" if model is None else f"{model:.2f}"
        if trial.drained and model is not None:
            model_text += f" (for {survivors})"
        after = f"{trial.seconds:.1f}" + (" (timed out)" if trial.timed_out else "")
        if trial.drained and trial.drained_at is not None:
            who = f"{trial.workers}, 1 drained at {trial.drained_at:.1f}s"
        else:
            who = str(trial.workers)
        rows.append(
            f"| {'drained' if trial.drained else 'search'} | {who} | {trial.peak:.2f} "
            f"| {model_text} | {slo:g} "
            f"| {'yes' if trial.holds(slo) else 'no'} | {after} "
            f"| {trial.attempts_per_item():.3f} | {trial.retries} "
            f"| {trial.stalled_job_seconds:.1f} | {trial.state} |"
        )
    return "\n".join(rows)


def summary(answers: Sequence[Answer]) -> str:
    """One line per question: the planner's count, the measured one, agreement."""
    lines = []
    for answer in answers:
        measured = "none held" if answer.measured is None else str(answer.measured)
        lines.append(
            f"{answer.question}: planner {answer.planner}, measured {measured}: "
            f"{'agree within one worker' if answer.agrees else 'DISAGREE'}"
        )
    return "\n".join(lines)


def report(
    scenario: Scenario,
    planner: dict[str, Any],
    searched: Sequence[Trial],
    drained: Sequence[Trial],
    answers: Sequence[Answer],
    context: dict[str, Any],
) -> dict[str, Any]:
    """Everything measured, as one JSON-ready object."""
    slo = scenario.slo
    return {
        "scenario": scenario.to_dict(),
        "planner": planner,
        "search": [t.to_dict(slo) for t in searched],
        "drained": [t.to_dict(slo) for t in drained],
        "answers": [a.to_dict() for a in answers],
        "agree": all(a.agrees for a in answers),
        **context,
    }


def plot(
    searched: Sequence[Trial], drained: Sequence[Trial], scenario: Scenario, path: Path
) -> Path:
    """Writes the oldest eligible age over time (one line per K, the SLO drawn) as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(1, 2, figsize=(12, 4.5), sharey=True)
    panels = (
        (axes[0], searched, "search: K consumers"),
        (axes[1], drained, "one consumer drained at W/2"),
    )
    for ax, trials, title in panels:
        for trial in trials:
            times = [t for t, _ in trial.samples]
            ages = [age for _, age in trial.samples]
            verdict = "holds" if trial.holds(scenario.slo) else "over"
            ax.plot(times, ages, label=f"{trial.label} (peak {trial.peak:.1f}s, {verdict})")
        ax.axhline(scenario.slo, color="red", linestyle="--", label=f"SLO {scenario.slo:g}s")
        ax.axvline(scenario.window, color="grey", linestyle=":", label="last item eligible")
        if trials is drained and drained:
            ax.axvline(scenario.window / 2, color="black", linestyle="-.", label="drain")
        ax.set_title(title)
        ax.set_xlabel("seconds since the burst began")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    axes[0].set_ylabel("oldest eligible age (s)")
    figure.suptitle(
        f"{scenario.eligible:,} items over {scenario.window:g}s, {scenario.per_worker:g}/s per "
        f"consumer, {scenario.retry_rate:.0%} of attempts retried "
        f"(the seed's burst x {scenario.scale:g})"
    )
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return path


def machine(client: redis.Redis) -> dict[str, Any]:
    """What the figures were measured on."""
    return {
        "nproc": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "redis_server": client.info("server").get("redis_version"),
        "redis_py": redis.__version__,
        "rq": rq.__version__,
    }


def load_average() -> float:
    """The 1-minute load average."""
    return round(os.getloadavg()[0], 2)
