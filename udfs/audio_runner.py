"""The runner of the ``audio`` input kind: a binary column of encoded recordings (then, optionally, the path each was
read from), decoded per row (:mod:`lakescore.udfs.audio`), each recording cut in the head's windows, and the windows
of the whole Arrow batch scored through the batching core in batches cut by what the model reads (a Whisper window's
encoder positions, a CTC window's frames), longest first; each recording is then assembled from its own windows.

A head that sends each recording whole to a server (:class:`~lakescore.udfs.heads.protocol.SendsRecordings`: a
transcription endpoint) gets the files as they are, after only their headers were read here: the server decodes them.

A recording that does not decode is that row's dead letter (``null_input``, ``invalid_audio``, ``empty_audio``,
``audio_too_long``, ``unsupported_sample_rate``; ``missing_file`` for a path with no file behind it); a window whose
forward raises even alone fails its recording (``scoring_error``); the other rows are scored.

:meth:`AudioRunner.sample` measures a sample from the headers alone (what ``lakescore plan`` counts): seconds of audio
and the windows they make, no recording decoded.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa

from lakescore.schemas.reasons import MISSING_FILE, NULL_INPUT, SCORING_ERROR, RowFailure
from lakescore.udfs.audio import AudioHeader, Decoded, Transcript, Window, describe_audio
from lakescore.udfs.batching import AdaptiveBudget, Scored, score_present
from lakescore.udfs.heads.protocol import AudioInputHead, SendsRecordings
from lakescore.udfs.runners import image_bytes

__all__ = ["PreparedAudio", "AudioSample", "AudioRunner"]


@dataclass
class PreparedAudio:
    """An audio batch ready to score: the encoded values, each decoded row, the windows of every decoded row
    (``(row, window)``, in row order), the rows refused with why, the path each was read from (``None``: a binary
    column), and for a head that sends whole files each sendable row's header (no row decoded then)."""

    values: list[memoryview | None]
    decoded: dict[int, Decoded]
    windows: list[tuple[int, Window]]
    failures: dict[int, RowFailure] = field(default_factory=dict)
    paths: list[str | None] | None = None
    headers: dict[int, AudioHeader] = field(default_factory=dict)


@dataclass(frozen=True)
class AudioSample:
    """A sample of recordings as their headers describe them: how many can be transcribed, their seconds of audio,
    and the cost of each window they make (one per recording for a head that sends whole files)."""

    recordings: int
    seconds: float
    window_costs: np.ndarray


class AudioRunner:
    """Audio heads (:class:`~lakescore.udfs.heads.protocol.AudioInputHead`): see the module docstring."""

    def __init__(self, head: AudioInputHead | SendsRecordings, input_cols: Sequence[str]) -> None:
        self.audio_col, *path_col = input_cols
        self.path_col = path_col[0] if path_col else None
        self.head = head

    def _values(self, batch: pa.RecordBatch) -> tuple[list[memoryview | None], list[str | None] | None]:
        column = batch.column(self.audio_col)
        if not (pa.types.is_binary(column.type) or pa.types.is_large_binary(column.type)):
            raise TypeError(
                f"audio column {self.audio_col!r} is {column.type}; transcribe reads encoded audio (binary)"
            )
        return image_bytes(column, self.audio_col), batch.column(self.path_col).to_pylist() if self.path_col else None

    def prepare(self, batch: pa.RecordBatch) -> PreparedAudio:
        values, paths = self._values(batch)
        decoded: dict[int, Decoded] = {}
        failures: dict[int, RowFailure] = {}
        headers: dict[int, AudioHeader] = {}
        cut: list[tuple[int, Window]] = []
        for i, value in enumerate(values):
            if value is None and paths is not None and paths[i] is not None:
                failures[i] = RowFailure(MISSING_FILE, f"no file at {paths[i]}")
                continue
            if isinstance(self.head, SendsRecordings):  # the server decodes: only the header is read here
                header = self.head.read_header(value)
                if isinstance(header, RowFailure):
                    failures[i] = header
                else:
                    headers[i] = header
                continue
            result = self.head.decode(value)
            if isinstance(result, RowFailure):
                failures[i] = result
                continue
            decoded[i] = result
            cut.extend((i, w) for w in self.head.windows(len(result.samples)))
        return PreparedAudio(values, decoded, cut, failures, paths, headers)

    def sample(self, batch: pa.RecordBatch) -> AudioSample:
        """The recordings of ``batch`` measured from their headers (none decoded): those that can be transcribed
        (a path's missing file, an unreadable header, a recording over the limit left out), their seconds, and the
        cost of each window the head cuts them in, at the model's sampling rate."""
        values, _ = self._values(batch)
        head = self.head
        seconds, costs, recordings = 0.0, [], 0
        for value in values:
            header = head.read_header(value)
            if isinstance(header, RowFailure):
                continue
            recordings += 1
            seconds += header.duration_s
            if isinstance(head, SendsRecordings):
                costs.append(1)
                continue
            samples = -(-header.frames * head.sampling_rate // header.sample_rate)  # as many as resampling makes
            costs.extend(head.window_cost(w) for w in head.windows(samples))
        return AudioSample(recordings, seconds, np.asarray(costs, dtype=np.int64))

    def score(self, prepared: PreparedAudio, budget: AdaptiveBudget) -> Scored:
        n = len(prepared.values)
        head = self.head
        if isinstance(head, SendsRecordings):
            scored = head.send_recordings(prepared.values, prepared.headers)
            for row, failure in prepared.failures.items():
                scored.reasons[row], scored.errors[row] = failure.reason, failure.error
            return scored
        window_outputs: list[object] = [None] * len(prepared.windows)
        window_errors: dict[int, str] = {}
        groups: dict[int, list[int]] = {}
        for w, (_, window) in enumerate(prepared.windows):
            groups.setdefault(head.batch_key(window), []).append(w)
        for members in groups.values():
            index = np.asarray(members, dtype=np.int64)
            costs = np.asarray([head.window_cost(prepared.windows[w][1]) for w in members], dtype=np.int64)

            def take(rows: np.ndarray, width: int, index: np.ndarray = index):
                pieces = []
                for w in index[rows]:
                    row, window = prepared.windows[w]
                    pieces.append(prepared.decoded[row].samples[window.start : window.end])
                return head.features(pieces)

            scored = score_present(
                np.ones(len(members), dtype=bool), costs, take, head.forward, budget, invalid_reason=NULL_INPUT
            )
            for k, w in enumerate(members):
                if scored.reasons[k] is None:
                    window_outputs[w] = scored.outputs[k]
                else:
                    window_errors[w] = scored.errors[k] or scored.reasons[k] or SCORING_ERROR
        outputs = np.empty(n, dtype=object)
        reasons: list[str | None] = [NULL_INPUT] * n
        errors: list[str | None] = [None] * n
        by_row: dict[int, list[int]] = {}
        for w, (row, _) in enumerate(prepared.windows):
            by_row.setdefault(row, []).append(w)
        for row, decoded in prepared.decoded.items():
            members = by_row.get(row, [])
            failed = next((window_errors[w] for w in members if w in window_errors), None)
            if failed is not None:
                reasons[row], errors[row] = SCORING_ERROR, failed
                continue
            try:
                text, segments = head.assemble(
                    [window_outputs[w] for w in members], [prepared.windows[w][1] for w in members]
                )
            except Exception as exc:  # the row's windows do not merge: the row fails, not the batch
                reasons[row], errors[row] = SCORING_ERROR, f"{type(exc).__name__}: {exc}"[:2000]
                continue
            outputs[row] = Transcript(text, segments, decoded.duration_s, decoded.sample_rate)
            reasons[row] = None
        for row, failure in prepared.failures.items():
            reasons[row], errors[row] = failure.reason, failure.error
        return Scored(outputs, reasons, errors)

    def row_costs(self, prepared: PreparedAudio) -> np.ndarray:
        """Each window's cost (what the model reads of it): the forward batches are cut from windows, not rows; one per
        sendable recording for a head that sends whole files."""
        if isinstance(self.head, SendsRecordings):
            return np.ones(len(prepared.headers), dtype=np.int64)
        return np.asarray([self.head.window_cost(w) for _, w in prepared.windows], dtype=np.int64)

    def raw_inputs(self, prepared: PreparedAudio, scored: Scored) -> list[str | None]:
        if prepared.paths is not None:
            return [None if reason is None else prepared.paths[i] for i, reason in enumerate(scored.reasons)]
        return [
            None if reason is None else describe_audio(prepared.values[i]) for i, reason in enumerate(scored.reasons)
        ]
