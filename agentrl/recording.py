"""An append-only store of finished trajectories: written while a run trains, read while it runs.

A store is a directory of `*.arl` files, one per writer. Each file is a sequence of framed records:

    magic (4 bytes) | body length (u32 LE) | CRC-32 of the body (u32 LE) | body

and a body is a zlib-compressed payload `header length (u32 LE) | JSON header | binary arrays`.
The file's first record is compressed on its own (magic `ARL1`); every later one (magic `ARLD`)
with the first record's payload as zlib's preset dictionary, since episodes of one run share
their system prompt, chat-template tokens and observation phrases: this cuts a GuessNumber
episode from about 2.1 kB to 1.3 kB, below gzipped JSON lines (bench/recording_size.py). The
header holds everything small (text, rewards, stop reason, timings, env id, seed, step, policy
version, any extra turn fields such as tool calls); the per-token arrays (prompt and action token
ids as int32, log-probs as float32 when that is exact and float64 otherwise, policy versions as
int32) are packed after it, so an episode costs bytes per token rather than the dozen characters
a JSON number takes, and reads back bit-for-bit.

Why this framing:
- *Readable while written*: records are only appended, each with one `write` call; a reader stops
  at the first incomplete frame and picks up from there on its next poll.
- *Safe across a crash*: a run killed mid-write leaves at most one torn frame at the end. Readers
  ignore it (length or CRC does not match); the next writer to open the file truncates it away
  before appending, so a resumed run never writes after garbage.
- *No dependencies*: zlib, json and struct are in the standard library, so the env-side install
  (no torch) can read and write stores.

Three record kinds exist: `episode` (one trajectory plus where it came from), `batch` (which
episodes formed a training step's batch, group by group in the learner's order, with the loss and
gradient norm the learner logged), which is what `agentrl replay` rebuilds a step from, and
`resume` (a resumed run's mark: what was recorded for the steps it redoes is superseded).
"""

from __future__ import annotations

import dataclasses
import fcntl
import json
import os
import struct
import sys
import time
import uuid
import zlib
from array import array
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

from agentrl.errors import AgentRLError
from agentrl.trajectory import StopReason, Trajectory, TrajectoryGroup, Turn

MAGIC = b"ARL1"  # compressed alone: the file's first record, whose payload is the dictionary
MAGIC_DICT = b"ARLD"  # compressed with the file's dictionary
_DICT_BYTES = 32 * 1024  # zlib's window: a longer dictionary is not used
FRAME = struct.Struct("<4sII")  # magic, payload length, crc32(payload)
SUFFIX = ".arl"
RECORDING_DIR = "recording"  # where a training run keeps its store, under the run directory
_ARRAY_FIELDS = ("prompt_token_ids", "action_token_ids", "action_logprobs", "action_versions")
_TURN_FIELDS = {f.name for f in dataclasses.fields(Turn)}
_MAX_PAYLOAD = 1 << 30  # a length above this is a torn or foreign frame, not a record


class RecordingError(AgentRLError):
    """A store that cannot be opened or a record that cannot be decoded."""


# -- records ------------------------------------------------------------------------------------


@dataclass
class EpisodeRecord:
    """A recorded trajectory and its provenance."""

    key: str  # unique in the store; batch records refer to episodes by it
    trajectory: Trajectory
    source: str = "train"  # train | eval | rollout
    step: int | None = None  # the training step whose batch (or whose evaluation) holds it
    policy: str | None = None  # what played it: a checkpoint, a URL, "expert", ...
    recorded_at: float = 0.0

    def summary(self) -> dict[str, Any]:
        """The fields a list of episodes shows and filters on (no tokens)."""
        t = self.trajectory
        versions = [v for turn in t.turns for v in turn.action_versions]
        return {
            "key": self.key,
            "source": self.source,
            "step": self.step,
            "policy": self.policy,
            "episode_id": t.episode_id,
            "env_id": t.env_id,
            "group_id": t.group_id,
            "seed": t.seed,
            "stop_reason": t.stop_reason.value,
            "reward": t.total_reward,
            "success": t.success,
            "turns": len(t.turns),
            "action_tokens": t.num_action_tokens,
            "min_version": min(versions) if versions else None,
            "max_version": max(versions) if versions else None,
            "duration": t.duration,
            "recorded_at": self.recorded_at,
        }


@dataclass
class BatchGroup:
    """One group of a training batch: its episodes in the order the learner saw them."""

    group_id: str
    seed: int | None
    episodes: list[str]
    cancelled: int = 0


@dataclass
class BatchRecord:
    """Which episodes formed training step `step`, and what the learner logged for it."""

    step: int  # the step this batch produced (1 for the first optimizer step)
    version: int  # the learner's version before the step
    groups: list[BatchGroup]
    learner: dict[str, float] = field(default_factory=dict)  # loss, grad_norm, ... as logged
    torch_threads: int | None = None  # the learner's intra-op threads (reductions depend on it)
    recorded_at: float = 0.0


@dataclass
class ResumeRecord:
    """The run resumed from its step-`step` checkpoint.

    A killed run's steps after its checkpoint are redone after the resume, as its metrics log is
    cut back to that step; so what the store holds for those steps from before this record (their
    episodes, evaluations and batch records) is superseded: kept for inspection, not current.
    """

    step: int
    recorded_at: float = 0.0


# -- encoding -----------------------------------------------------------------------------------


def _pack(values: Sequence[float] | Sequence[int], kind: str) -> tuple[str, bytes]:
    """Pack a number list, choosing float32 only when every value survives the round trip."""
    if kind == "f":
        narrow = array("f", values)
        typecode = "f" if list(narrow) == list(values) else "d"
        packed = narrow if typecode == "f" else array("d", values)
    else:
        typecode, packed = "i", array("i", values)
    if sys.byteorder != "little":
        packed.byteswap()
    return typecode, packed.tobytes()


def _unpack(typecode: str, data: bytes) -> list[Any]:
    values = array(typecode)
    values.frombytes(data)
    if sys.byteorder != "little":
        values.byteswap()
    return values.tolist()


def _jsonable(value: Any) -> Any:
    """Extra turn fields (tool calls, messages) may be dataclasses; store their fields."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    return str(value)


def encode_episode(record: EpisodeRecord) -> bytes:
    """The payload (before compression) of an episode record."""
    t = record.trajectory
    arrays: dict[str, list[Any]] = {name: [] for name in _ARRAY_FIELDS}
    turns = []
    for turn in t.turns:
        data = {}
        for f in dataclasses.fields(turn):
            value = getattr(turn, f.name)
            if f.name in arrays:
                arrays[f.name].extend(value)
                data["n_" + f.name] = len(value)
            else:
                data[f.name] = value
        turns.append(data)
    blobs = []
    layout = []
    for name, values in arrays.items():
        typecode, blob = _pack(values, "f" if name == "action_logprobs" else "i")
        layout.append([name, typecode, len(blob)])
        blobs.append(blob)
    header = {
        "kind": "episode",
        "key": record.key,
        "source": record.source,
        "step": record.step,
        "policy": record.policy,
        "recorded_at": record.recorded_at,
        "trajectory": {
            "episode_id": t.episode_id,
            "env_id": t.env_id,
            "group_id": t.group_id,
            "seed": t.seed,
            "system_prompt": t.system_prompt,
            "stop_reason": t.stop_reason.value,
            "error": t.error,
            "final_observation": t.final_observation,
            "started_at": t.started_at,
            "finished_at": t.finished_at,
            "info": t.info,
            "turns": turns,
        },
        "arrays": layout,
    }
    return _with_header(header, b"".join(blobs))


def encode_batch(record: BatchRecord) -> bytes:
    header = {"kind": "batch", **dataclasses.asdict(record)}
    return _with_header(header, b"")


def encode_resume(record: ResumeRecord) -> bytes:
    return _with_header({"kind": "resume", **dataclasses.asdict(record)}, b"")


def _with_header(header: dict[str, Any], tail: bytes) -> bytes:
    text = json.dumps(header, separators=(",", ":"), default=_jsonable).encode()
    return struct.pack("<I", len(text)) + text + tail


def decode(payload: bytes) -> EpisodeRecord | BatchRecord | ResumeRecord:
    """Inverse of `encode_episode` / `encode_batch` / `encode_resume`."""
    (size,) = struct.unpack_from("<I", payload)
    header = json.loads(payload[4 : 4 + size])
    if header["kind"] == "resume":
        return ResumeRecord(step=header["step"], recorded_at=header["recorded_at"])
    if header["kind"] == "batch":
        groups = [BatchGroup(**g) for g in header["groups"]]
        fields = {k: v for k, v in header.items() if k not in ("kind", "groups")}
        return BatchRecord(groups=groups, **fields)
    if header["kind"] != "episode":
        raise RecordingError(f"unknown record kind {header['kind']!r}")
    arrays: dict[str, list[Any]] = {}
    offset = 4 + size
    for name, typecode, length in header["arrays"]:
        arrays[name] = _unpack(typecode, payload[offset : offset + length])
        offset += length
    data = header["trajectory"]
    cursors = dict.fromkeys(arrays, 0)
    turns = []
    for turn_data in data.pop("turns"):
        kwargs = {k: v for k, v in turn_data.items() if k in _TURN_FIELDS}
        for name in arrays:
            n = turn_data.get("n_" + name, 0)
            kwargs[name] = arrays[name][cursors[name] : cursors[name] + n]
            cursors[name] += n
        turns.append(Turn(**kwargs))
    trajectory = Trajectory(**{**data, "stop_reason": StopReason(data["stop_reason"]), "turns": turns})
    return EpisodeRecord(
        key=header["key"],
        trajectory=trajectory,
        source=header["source"],
        step=header["step"],
        policy=header["policy"],
        recorded_at=header["recorded_at"],
    )


def frame(payload: bytes, level: int = 6, zdict: bytes | None = None) -> bytes:
    """One framed record; with `zdict`, compressed against the file's dictionary."""
    if zdict is None:
        magic, body = MAGIC, zlib.compress(payload, level)
    else:
        compressor = zlib.compressobj(level, zdict=zdict)
        magic, body = MAGIC_DICT, compressor.compress(payload) + compressor.flush()
    return FRAME.pack(magic, len(body), zlib.crc32(body)) + body


def _inflate(magic: bytes, body: bytes, zdict: bytes | None) -> bytes:
    if magic == MAGIC:
        return zlib.decompress(body)
    if zdict is None:
        raise RecordingError("a dictionary-compressed record precedes the file's first record")
    decompressor = zlib.decompressobj(zdict=zdict)
    return decompressor.decompress(body) + decompressor.flush()


# -- files --------------------------------------------------------------------------------------


def scan(path: str | Path, start: int = 0) -> Iterator[tuple[int, bytes]]:
    """Yield `(end_offset, payload)` of every complete record from `start`; stop at a torn one.

    Stops (rather than raises) at anything that is not a whole, checksummed frame: that is the
    tail a writer is still appending, or the remains of a killed one.
    """
    with open(path, "rb") as file:
        zdict = None
        if start > 0:  # the dictionary is the payload of the file's first record
            first = _read_frame(file, None)
            zdict = first[1][-_DICT_BYTES:] if first else None
            file.seek(start)
        offset = start
        while (item := _read_frame(file, zdict)) is not None:
            size, payload = item
            if offset == 0:
                zdict = payload[-_DICT_BYTES:]
            offset += size
            yield offset, payload


def _read_frame(file: BinaryIO, zdict: bytes | None) -> tuple[int, bytes] | None:
    """(frame size, payload) of the whole frame at the file's position, or None."""
    head = file.read(FRAME.size)
    if len(head) < FRAME.size:
        return None
    magic, length, crc = FRAME.unpack(head)
    if magic not in (MAGIC, MAGIC_DICT) or length > _MAX_PAYLOAD:
        return None
    body = file.read(length)
    if len(body) < length or zlib.crc32(body) != crc:
        return None
    return FRAME.size + length, _inflate(magic, body, zdict)


def valid_length(path: str | Path) -> int:
    """Bytes of `path` made of complete records (the offset a writer must append from)."""
    end = 0
    for end, _ in scan(path):  # noqa: B007 (the last one is the answer)
        pass
    return end


def _dictionary(path: str | Path) -> bytes | None:
    """The file's compression dictionary (its first record's payload), None for an empty file."""
    for _, payload in scan(path):
        return payload[-_DICT_BYTES:]
    return None


class RecordWriter:
    """Appends records to one `.arl` file of a store; one writer per file (an flock enforces it).

    Each record goes out in a single unbuffered `write`, so what a reader or a crash sees is
    whole records plus at most one partial frame at the end.
    """

    def __init__(self, directory: str | Path, name: str | None = None, *, level: int = 6) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        name = name or f"{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
        self.path = self.directory / (name + SUFFIX)
        self.level = level
        self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(self._fd)
            raise RecordingError(f"{self.path} is being written by another process") from None
        # Drop a torn tail left by a killed writer, then append after the last whole record.
        os.ftruncate(self._fd, valid_length(self.path))
        os.lseek(self._fd, 0, os.SEEK_END)
        self._zdict = _dictionary(self.path)
        self.bytes_written = 0

    def _append(self, payload: bytes) -> None:
        data = frame(payload, self.level, self._zdict)
        if self._zdict is None:
            self._zdict = payload[-_DICT_BYTES:]
        written = os.write(self._fd, data)
        while written < len(data):  # only on exotic filesystems; keep the frame contiguous
            written += os.write(self._fd, data[written:])
        self.bytes_written += len(data)

    def write_episode(
        self,
        trajectory: Trajectory,
        *,
        source: str = "train",
        step: int | None = None,
        policy: str | None = None,
    ) -> str:
        """Append one trajectory; returns its key (what a batch record refers to)."""
        key = uuid.uuid4().hex[:16]
        record = EpisodeRecord(key, trajectory, source, step, policy, recorded_at=time.time())
        self._append(encode_episode(record))
        return key

    def write_batch(
        self,
        step: int,
        version: int,
        groups: Sequence[TrajectoryGroup],
        *,
        learner: dict[str, float] | None = None,
        torch_threads: int | None = None,
    ) -> BatchRecord:
        """Append every trajectory of a training batch, then the batch record naming them in order."""
        batch_groups = []
        for group in groups:
            keys = [self.write_episode(t, source="train", step=step) for t in group.trajectories]
            batch_groups.append(BatchGroup(group.group_id, group.seed, keys, group.cancelled))
        record = BatchRecord(
            step, version, batch_groups, dict(learner or {}), torch_threads, recorded_at=time.time()
        )
        self._append(encode_batch(record))
        return record

    def write_resume(self, step: int) -> ResumeRecord:
        """Mark a resume from the step-`step` checkpoint (what later steps hold so far is superseded)."""
        record = ResumeRecord(step, recorded_at=time.time())
        self._append(encode_resume(record))
        return record

    def close(self) -> None:
        if self._fd >= 0:
            os.fsync(self._fd)
            os.close(self._fd)
            self._fd = -1

    def __enter__(self) -> RecordWriter:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


# -- reading ------------------------------------------------------------------------------------


class Recording:
    """A store read incrementally: `poll()` picks up what writers appended since the last call.

    Episodes are kept as summaries plus their file offsets, so a store of many thousands of
    episodes is listed without holding every token in memory; `episode(key)` decodes one.
    A resumed run redoes the steps after its checkpoint: a resume record marks the summaries of
    those steps read so far `superseded` and drops their batch records, and the redone steps'
    records are the current ones.
    """

    def __init__(self, directory: str | Path) -> None:
        self.directory = Path(directory)
        self._offsets: dict[Path, int] = {}
        self._where: dict[str, tuple[Path, int]] = {}
        self.summaries: list[dict[str, Any]] = []
        self.batches: dict[int, BatchRecord] = {}
        self.poll()

    def files(self) -> list[Path]:
        return sorted(self.directory.glob("*" + SUFFIX)) if self.directory.is_dir() else []

    def poll(self) -> int:
        """Read newly appended records; returns how many episodes were added."""
        added = 0
        for path in self.files():
            start = self._offsets.get(path, 0)
            if path.stat().st_size <= start:
                continue
            for end, payload in scan(path, start):
                record = decode(payload)
                if isinstance(record, BatchRecord):
                    self.batches[record.step] = record
                elif isinstance(record, ResumeRecord):
                    self._supersede_after(record.step)
                else:
                    self._where[record.key] = (path, start)
                    self.summaries.append(record.summary() | {"superseded": False})
                    added += 1
                start = end
            self._offsets[path] = start
        return added

    def _supersede_after(self, step: int) -> None:
        for summary in self.summaries:
            if summary["step"] is not None and summary["step"] > step:
                summary["superseded"] = True
        for later in [s for s in self.batches if s > step]:
            del self.batches[later]

    def current(self) -> list[dict[str, Any]]:
        """The summaries not superseded by a resume (what the run's metrics log describes)."""
        return [s for s in self.summaries if not s["superseded"]]

    def episode(self, key: str) -> EpisodeRecord:
        if key not in self._where:
            raise RecordingError(f"no episode {key!r} in {self.directory}")
        path, offset = self._where[key]
        for _, payload in scan(path, offset):
            record = decode(payload)
            if isinstance(record, EpisodeRecord):
                return record
            break
        raise RecordingError(f"episode {key!r} at {path}:{offset} cannot be read")

    def episodes(self) -> Iterator[EpisodeRecord]:
        """Every episode record, in file order."""
        for path in self.files():
            for _, payload in scan(path):
                record = decode(payload)
                if isinstance(record, EpisodeRecord):
                    yield record

    def batch_groups(self, step: int) -> list[TrajectoryGroup]:
        """The groups of step `step`'s batch, rebuilt in the learner's order."""
        if step not in self.batches:
            have = sorted(self.batches)
            raise RecordingError(
                f"{self.directory} has no batch record for step {step} (recorded steps: {have or 'none'})"
            )
        groups = []
        for group in self.batches[step].groups:
            trajectories = [self.episode(key).trajectory for key in group.episodes]
            groups.append(TrajectoryGroup(group.group_id, group.seed, trajectories, group.cancelled))
        return groups


def find_store(path: str | Path) -> Path:
    """The store directory of a run directory (its `recording/`) or the directory itself."""
    path = Path(path)
    if (path / RECORDING_DIR).is_dir():
        return path / RECORDING_DIR
    if path.is_dir() and any(path.glob("*" + SUFFIX)):
        return path
    raise RecordingError(f"{path} holds no recording (no {RECORDING_DIR}/ and no *{SUFFIX} files)")
