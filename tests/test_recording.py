"""The trajectory store: exact round trips, live reading, and crash safety under SIGKILL."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from recording_helpers import make_trajectory

from agentrl.recording import FRAME, Recording, RecordingError, RecordWriter, find_store, scan
from agentrl.trajectory import TrajectoryGroup


def test_episode_round_trip_is_exact(tmp_path: Path) -> None:
    original = make_trajectory(5)
    with RecordWriter(tmp_path, "run") as writer:
        key = writer.write_episode(original, source="rollout", policy="expert")
    record = Recording(tmp_path).episode(key)
    assert record.trajectory == original  # float64 log-probs and 100k+ token ids survive bit-for-bit
    assert (record.source, record.policy) == ("rollout", "expert")


def test_float32_logprobs_are_stored_as_float32_and_read_back_exactly(tmp_path: Path) -> None:
    from array import array

    trajectory = make_trajectory(1)
    for turn in trajectory.turns:
        turn.action_logprobs = array("f", turn.action_logprobs).tolist()
    with RecordWriter(tmp_path, "run") as writer:
        key = writer.write_episode(trajectory)
    assert Recording(tmp_path).episode(key).trajectory == trajectory


def test_batch_record_rebuilds_groups_in_learner_order(tmp_path: Path) -> None:
    groups = [
        TrajectoryGroup("ga", 3, [make_trajectory(3), make_trajectory(4)], cancelled=1),
        TrajectoryGroup("gb", 9, [make_trajectory(9)]),
    ]
    with RecordWriter(tmp_path, "train") as writer:
        writer.write_batch(7, 6, groups, learner={"loss": 0.5, "grad_norm": 1.25}, torch_threads=2)
    store = Recording(tmp_path)
    assert store.batch_groups(7) == groups
    assert store.batches[7].learner == {"loss": 0.5, "grad_norm": 1.25}
    assert [s["step"] for s in store.summaries] == [7, 7, 7]
    with pytest.raises(RecordingError, match="no batch record for step 8"):
        store.batch_groups(8)


def test_resume_supersedes_what_later_steps_recorded_and_the_redone_steps_are_current(tmp_path: Path) -> None:
    with RecordWriter(tmp_path, "train") as writer:  # the first run: steps 1-3, killed after step 3
        for step in (1, 2, 3):
            writer.write_batch(step, step - 1, [TrajectoryGroup(f"g{step}", step, [make_trajectory(step)])])
        writer.write_episode(make_trajectory(30), source="eval", step=3)
    store = Recording(tmp_path)
    with RecordWriter(tmp_path, "train") as writer:  # resumed from the step-1 checkpoint: redoes 2 and 3
        writer.write_resume(1)
        store.poll()
        assert sorted(store.batches) == [1]  # steps 2-3 are not what the (cut back) metrics log holds
        writer.write_batch(2, 1, [TrajectoryGroup("g2-redo", 20, [make_trajectory(20)])])
    store.poll()
    superseded = [(s["step"], s["seed"], s["source"]) for s in store.summaries if s["superseded"]]
    assert superseded == [(2, 2, "train"), (3, 3, "train"), (3, 30, "eval")]
    assert [(s["step"], s["seed"]) for s in store.current()] == [(1, 1), (2, 20)]
    assert sorted(store.batches) == [1, 2] and store.batch_groups(2)[0].seed == 20
    assert [(s["step"], s["superseded"]) for s in Recording(tmp_path).summaries] == [
        (s["step"], s["superseded"]) for s in store.summaries
    ]  # a reader opened afterwards reads the same


def test_reader_sees_records_appended_after_it_opened(tmp_path: Path) -> None:
    writer = RecordWriter(tmp_path, "live")
    writer.write_episode(make_trajectory(0))
    store = Recording(tmp_path)
    assert len(store.summaries) == 1
    writer.write_episode(make_trajectory(1))
    assert store.poll() == 1
    assert [s["seed"] for s in store.summaries] == [0, 1]
    writer.close()


def test_torn_tail_is_ignored_by_readers_and_cut_by_the_next_writer(tmp_path: Path) -> None:
    with RecordWriter(tmp_path, "run") as writer:
        writer.write_episode(make_trajectory(0))
        writer.write_episode(make_trajectory(1))
    path = tmp_path / "run.arl"
    whole = path.stat().st_size
    with path.open("ab") as file:  # half a frame, as a writer killed mid-record leaves it
        file.write(FRAME.pack(b"ARL1", 500, 0) + b"x" * 100)
    assert len(Recording(tmp_path).summaries) == 2
    with RecordWriter(tmp_path, "run") as writer:
        assert path.stat().st_size == whole
        writer.write_episode(make_trajectory(2))
    assert [s["seed"] for s in Recording(tmp_path).summaries] == [0, 1, 2]


def test_second_writer_on_the_same_file_is_refused(tmp_path: Path) -> None:
    with RecordWriter(tmp_path, "run"), pytest.raises(RecordingError, match="another process"):
        RecordWriter(tmp_path, "run")


def test_find_store_names_what_is_missing(tmp_path: Path) -> None:
    with pytest.raises(RecordingError, match="holds no recording"):
        find_store(tmp_path)
    RecordWriter(tmp_path / "recording", "x").close()
    assert find_store(tmp_path) == tmp_path / "recording"


WRITER_SCRIPT = textwrap.dedent(
    """
    import sys
    sys.path.insert(0, {tests!r})
    from recording_helpers import make_trajectory
    from agentrl.recording import RecordWriter

    writer = RecordWriter({store!r}, "killed")
    index = 0
    while True:
        writer.write_episode(make_trajectory(index, turns=1 + index % 7))
        index += 1
    """
)


def test_sigkilled_writer_loses_at_most_its_last_partial_record(tmp_path: Path) -> None:
    store = tmp_path / "store"
    script = WRITER_SCRIPT.format(tests=str(Path(__file__).parent), store=str(store))
    child = subprocess.Popen([sys.executable, "-c", script])
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:  # wait until it is writing fast, then kill it mid-stream
            if (store / "killed.arl").exists() and (store / "killed.arl").stat().st_size > 200_000:
                break
            time.sleep(0.05)
        else:
            pytest.fail("the writer produced no records")
    finally:
        os.kill(child.pid, signal.SIGKILL)
        child.wait()
    assert child.returncode == -signal.SIGKILL
    size = (store / "killed.arl").stat().st_size
    records = list(Recording(store).episodes())
    assert len(records) > 100
    for index, record in enumerate(records):  # every complete episode, in order, bit-for-bit
        assert record.trajectory == make_trajectory(index, turns=1 + index % 7)
    ends = [end for end, _ in scan(store / "killed.arl")]
    assert size - ends[-1] < 4096  # only the frame being written when killed is lost
