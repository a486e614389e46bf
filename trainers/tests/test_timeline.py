"""Timeline summary: step-time-weighted means of the busy/idle fractions and the total wait."""

from __future__ import annotations

from agentrl_trainers.timeline import plot_timeline, summary


def step(n: int, seconds: float, wait: float, train: float, engine: float | None) -> dict:
    record = {
        "step": n,
        "step_seconds": seconds,
        "timeline/rollout_wait_s": wait,
        "timeline/train_s": train,
        "timeline/weight_sync_s": seconds - wait - train,
        "timeline/trainer_idle_frac": 1 - train / seconds,
    }
    if engine is not None:
        record["timeline/engine_busy_frac"] = engine
    return record


def test_summary_weights_each_step_by_its_duration(tmp_path):
    records = [
        step(1, 10.0, 6.0, 4.0, 0.9),
        step(2, 30.0, 10.0, 18.0, 0.5),
        {"step": 2, "eval_success_rate": 0.5},
    ]
    line = summary(records)
    assert line is not None
    # engine (0.9*10 + 0.5*30) / 40 = 60%; trainer idle 1 - 22/40 = 45%; waited 16 s of 40 (40%)
    assert (
        "engine busy 60%" in line and "trainer idle 45%" in line and "waiting for rollouts 16s (40%)" in line
    )
    assert [p.name for p in plot_timeline(records, tmp_path)] == ["timeline.png"]


def test_summary_says_when_the_engine_does_not_report_busy_time():
    line = summary([step(1, 10.0, 5.0, 5.0, None)])
    assert line is not None and "n/a" in line
    assert summary([{"step": 1, "eval_success_rate": 0.1}]) is None
