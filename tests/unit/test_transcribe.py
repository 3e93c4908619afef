"""The transcribe task without Spark: decoding and its per-row reasons, the windows, and the head through the audio
runner against ``transformers.pipeline("automatic-speech-recognition")`` on the same decoded audio, for a tiny Whisper
(weights set by hand so that its text follows the audio) and a tiny random-weight wav2vec2 CTC model, both built in the
test, on recordings from a second to a few minutes, batched together."""

from __future__ import annotations

import io
import struct

import numpy as np
import pyarrow as pa
import pytest

from lakescore.schemas.reasons import (
    AUDIO_TOO_LONG,
    EMPTY_AUDIO,
    INVALID_AUDIO,
    MISSING_FILE,
    NULL_INPUT,
    UNSUPPORTED_SAMPLE_RATE,
    RowFailure,
)
from lakescore.udfs.audio import Transcript, decode_audio, windows
from lakescore.udfs.audio_runner import AudioRunner
from lakescore.udfs.batching import AdaptiveBudget, BatchPolicy
from lakescore.udfs.models.model_source import ModelSpec
from lakescore.udfs.options.transcribe import TranscribeOptions
from tests.tiny_audio import encoded, recording, save_wav2vec2, save_whisper

RATE = 16_000


@pytest.fixture(scope="module")
def whisper_dir(tmp_path_factory):
    return save_whisper(tmp_path_factory.mktemp("whisper"))


@pytest.fixture(scope="module")
def ctc_dir(tmp_path_factory):
    return save_wav2vec2(tmp_path_factory.mktemp("ctc"))


def _pipeline(model_dir):
    from transformers import pipeline

    return pipeline("automatic-speech-recognition", model=str(model_dir))


def _head(model_dir, **options):
    from lakescore.udfs.heads.transcribe import load_transcriber

    spec = ModelSpec("transcribe", str(model_dir), transcribe=TranscribeOptions(**options))
    return load_transcriber(spec, model_dir)


def _run(head, values, paths=None, max_tokens=4096, max_rows=8):
    columns = {"audio": pa.array(values, pa.binary())}
    if paths is not None:
        columns["path"] = pa.array(paths, pa.string())
    batch = pa.RecordBatch.from_pydict(columns)
    runner = AudioRunner(head, list(columns))
    prepared = runner.prepare(batch)
    scored = runner.score(prepared, AdaptiveBudget(BatchPolicy(max_tokens, max_rows)))
    return runner, prepared, scored


def _recordings(window_s: float):
    """Recordings of several shapes: short, mono at 16 kHz; stereo at 44.1 kHz; MP3 at 22.05 kHz; one of three
    windows and one of ten (a few minutes for 30-second windows), in four formats."""
    return [
        encoded(recording(2.5, seed=1), RATE, "WAV"),
        encoded(recording(4, rate=44_100, seed=2, channels=2), 44_100, "FLAC"),
        encoded(recording(5, rate=22_050, seed=4), 22_050, "MP3"),
        encoded(recording(window_s * 7 / 3, seed=3), RATE, "OGG"),
        encoded(recording(window_s * 20 / 3, rate=8_000, seed=5), 8_000, "WAV"),
    ]


def test_decoding_is_libsndfile_then_soxr_and_each_bad_row_has_its_reason():
    import soundfile
    import soxr

    stereo = recording(1.5, rate=44_100, seed=7, channels=2)
    for fmt in ("WAV", "FLAC", "OGG", "MP3"):
        data = encoded(stereo, 44_100, fmt)
        decoded = decode_audio(data, RATE, None)
        read, rate = soundfile.read(io.BytesIO(data), dtype="float32", always_2d=True)
        expected = soxr.resample(read.mean(axis=1, dtype=np.float32), rate, RATE)
        assert decoded.sample_rate == 44_100 and decoded.duration_s == pytest.approx(len(read) / rate)
        np.testing.assert_array_equal(decoded.samples, expected)
        assert abs(len(decoded.samples) - 1.5 * RATE) < 0.01 * RATE  # mp3 pads a few frames

    wav = encoded(recording(1.0), RATE, "WAV")
    odd_rate = bytearray(wav)
    odd_rate[24:28] = struct.pack("<I", 7)  # the fmt chunk's sample rate
    cases = {
        None: NULL_INPUT,
        b"": NULL_INPUT,
        b"not audio at all" * 8: INVALID_AUDIO,
        encoded(recording(3.0), RATE, "FLAC")[:2000]: INVALID_AUDIO,
        encoded(np.zeros(0, np.float32), RATE, "WAV"): EMPTY_AUDIO,
        encoded(recording(12.0), RATE, "WAV"): AUDIO_TOO_LONG,
        bytes(odd_rate): UNSUPPORTED_SAMPLE_RATE,
    }
    for data, reason in cases.items():
        failure = decode_audio(data, RATE, 10.0)
        assert isinstance(failure, RowFailure) and failure.reason == reason, (reason, failure)
        assert "\n" not in failure.error and "BytesIO" not in failure.error
    assert "12.0 s long" in decode_audio(encoded(recording(12.0), RATE, "WAV"), RATE, 10.0).error


def test_windows_are_the_pipelines_chunks():
    from transformers.pipelines.automatic_speech_recognition import chunk_iter

    class Identity:
        sampling_rate = RATE

        def __call__(self, chunk, **_):
            return {}

    for samples in (1, 479_999, 480_000, 480_001, 1_120_000, 1_600_321):
        for chunk, stride in ((480_000, 80_000), (160_000, 16_000)):
            theirs = [
                item["stride"] for item in chunk_iter(np.zeros(samples, np.float32), Identity(), chunk, stride, stride)
            ]
            ours = [(w.length, w.left, w.right) for w in windows(samples, chunk, stride, stride)]
            assert ours == theirs, (samples, chunk)


@pytest.mark.parametrize("arch", ["ctc", "whisper"])
def test_texts_equal_the_pipeline_on_every_row_batched_with_long_recordings(arch, ctc_dir, whisper_dir):
    model_dir = ctc_dir if arch == "ctc" else whisper_dir
    timestamps = True if arch == "whisper" else "word"
    head = _head(model_dir, return_timestamps=True)
    pipe = _pipeline(model_dir)
    window_s = head.chunk_length_s
    assert window_s == (30 if arch == "ctc" else 6)  # the model's own window: Whisper's feature extractor's
    values = _recordings(window_s)
    broken = [None, b"garbage" * 40, None]
    paths = [None] * len(values) + [None, None, "/no/such/file.wav"]
    # a budget of two Whisper windows (or about 40 s of CTC frames): windows of different rows share batches
    budget = 2 * head.window_cost(head.windows(int(window_s * RATE))[0])
    runner, prepared, scored = _run(head, values + broken, paths, max_tokens=budget)
    assert len(prepared.windows) == 3 + 3 + 10
    assert scored.reasons[len(values) :] == [NULL_INPUT, INVALID_AUDIO, MISSING_FILE]
    assert runner.raw_inputs(prepared, scored)[-1] == "/no/such/file.wav"
    text, duration, rate, segments = [a.to_pylist() for a in head.columns(scored.outputs, scored.ok)]
    assert text[len(values) :] == [None] * 3
    for i in range(len(values)):
        audio = {"raw": prepared.decoded[i].samples, "sampling_rate": RATE}
        expected = pipe(dict(audio), chunk_length_s=window_s, return_timestamps=timestamps)
        assert text[i] == expected["text"], i
        assert [(s["start"], s["end"], s["text"]) for s in segments[i]] == [
            (*c["timestamp"], c["text"]) for c in expected["chunks"]
        ]
        assert rate[i] == prepared.decoded[i].sample_rate and duration[i] == prepared.decoded[i].duration_s
        if prepared.decoded[i].duration_s < window_s:  # one window: the plain pipeline, unchunked
            assert text[i] == pipe(dict(audio), return_timestamps=timestamps)["text"]
    # the tiny models write what they hear, so equality says something of each row
    assert any(len(t) > 3 for t in text[: len(values)]) and len(set(text[: len(values)])) == len(values)
    alone = _run(head, values[3:4])[2]
    assert head.columns(alone.outputs, alone.ok)[0].to_pylist() == text[3:4]  # a row's text is not its batch's


def test_whisper_language_and_task_reach_generate_as_the_pipelines(whisper_dir):
    head = _head(whisper_dir, language="de", whisper_task="translate")
    pipe = _pipeline(whisper_dir)
    values = [encoded(recording(6, seed=9), RATE, "WAV")]
    _, prepared, scored = _run(head, values)
    expected = pipe(
        {"raw": prepared.decoded[0].samples, "sampling_rate": RATE},
        chunk_length_s=6,
        generate_kwargs={"language": "de", "task": "translate"},
    )
    assert head.columns(scored.outputs, scored.ok)[0].to_pylist() == [expected["text"]]
    assert len(head.columns(scored.outputs, scored.ok)) == 3  # no segments unless asked


def test_the_tiny_whisper_writes_what_it_hears(whisper_dir):
    # the equality tests say something only if the text follows the audio: each recording has its own text, and
    # each window of a long one its own (a window dropped, swapped or given another row's audio would show)
    pipe = _pipeline(whisper_dir)
    texts = [pipe({"raw": recording(2 + i / 2, seed=10 + i), "sampling_rate": RATE})["text"] for i in range(8)]
    assert len(set(texts)) >= 7 and all(texts), texts
    samples = recording(10, seed=18)
    cut = list(windows(len(samples), 6 * RATE, RATE, RATE))
    pieces = [pipe({"raw": samples[w.start : w.end], "sampling_rate": RATE})["text"] for w in cut]
    assert len(cut) == 2 and pieces[0] != pieces[1] and all(pieces), pieces


def test_text_the_pipeline_gives_no_time_keeps_a_null_start(whisper_dir):
    # text after a window's closing timestamp (a Whisper that goes on writing) has no time in the pipeline's chunks
    head = _head(whisper_dir, return_timestamps=True)
    tokens = head.tokenizer.convert_tokens_to_ids(["<|0.00|>", "B", "<|2.00|>", "er"])
    text, segments = head.assemble([np.array(tokens)], head.windows(3 * RATE))
    assert (text, segments) == ("Ber", [(0.0, 2.0, "B"), (None, None, "er")])
    outputs = np.empty(1, dtype=object)
    outputs[0] = Transcript(text, segments, 3.0, RATE)
    assert head.columns(outputs, np.array([True]))[3].to_pylist() == [
        [{"start": 0.0, "end": 2.0, "text": "B"}, {"start": None, "end": None, "text": "er"}]
    ]


def test_a_ctc_model_refuses_whispers_settings(ctc_dir, tmp_path):
    from lakescore.udfs.models.model_source import UnfitModelError

    with pytest.raises(UnfitModelError, match="Whisper's"):
        _head(ctc_dir, language="en")


@pytest.mark.parametrize("arch", ["ctc", "whisper"])
def test_plan_counts_audio_seconds_and_windows_from_the_headers_alone(arch, ctc_dir, whisper_dir):
    from lakescore.jobs.commands.plan import UnitCost, predict, sample_shape
    from lakescore.jobs.cost import SessionResources

    window_s = 30 if arch == "ctc" else 6
    head = _head(ctc_dir if arch == "ctc" else whisper_dir, max_duration_s=7 * window_s)
    values = _recordings(window_s)
    runner = AudioRunner(head, ["audio"])
    prepared = runner.prepare(pa.RecordBatch.from_pydict({"audio": pa.array(values, pa.binary())}))  # decoded, not run
    # a FLAC cut short: its header says 3 s, its frames do not decode; plan counts it from the header alone
    cut_short = encoded(recording(3.0), RATE, "FLAC")[:2000]
    unsendable = [None, b"garbage" * 40, encoded(recording(7 * window_s + 1, rate=8_000), 8_000, "WAV")]
    batch = pa.RecordBatch.from_pydict({"audio": pa.array([*values, cut_short, *unsendable], pa.binary())})
    sample = runner.sample(batch)
    assert sample.recordings == len(values) + 1
    assert sample.seconds == pytest.approx(sum(d.duration_s for d in prepared.decoded.values()) + 3.0)
    cut_short_windows = head.windows(3 * RATE)
    np.testing.assert_array_equal(
        sample.window_costs, [*runner.row_costs(prepared), *(head.window_cost(w) for w in cut_short_windows)]
    )
    shape = sample_shape(
        sample.window_costs, batch.num_rows, BatchPolicy(4096, 8), 0.0, sample.recordings, sample.seconds
    )
    plan = predict(shape, batch.num_rows * 100, UnitCost(0.001, 1.0, 1.0, "test"), SessionResources(2, 2, 1))
    assert plan["rows_to_score"] == sample.recordings * 100
    assert plan["windows"] == len(sample.window_costs) * 100 == (len(prepared.windows) + len(cut_short_windows)) * 100
    assert plan["audio_seconds"] == pytest.approx(sample.seconds * 100, abs=0.1)


ENDPOINT = {
    "task": "transcribe",
    "input": "calls",
    "output": "call_texts",
    "id_col": "call_id",
    "audio_col": "recording",
    "transcribe.endpoint.url": "http://127.0.0.1:9/v1",
    "transcribe.endpoint.model": "whisper-1",
}


def test_the_transcription_endpoint_is_configured_priced_and_refused_in_one_line_like_every_endpoint():
    from lakescore.jobs.config import ConfigError, load_config
    from lakescore.schemas.traffic import Traffic
    from lakescore.udfs.remote.answers import Malformed
    from lakescore.udfs.remote.transcriptions import parse_transcription, transcription_form

    cfg = load_config(
        flags={
            **ENDPOINT,
            "transcribe.endpoint.api_key_env": "SPEECH_KEY",
            "transcribe.endpoint.price": {"per_audio_minute": 0.006},
            "transcribe.language": "en",
        }
    )
    cfg.require_for_scoring()  # no model.source: the endpoint's model answers
    assert cfg.endpoint() is cfg.transcribe.endpoint and cfg.secret_env_names() == ("SPEECH_KEY",)
    assert cfg.transcribe.endpoint.price.charge(Traffic(audio_ms=150_000)) == pytest.approx(0.015)
    assert cfg.transcribe.identity()["endpoint"] == {"model": "whisper-1", "revision": None}
    assert "endpoint" not in TranscribeOptions().identity()  # in-process: the digests it had before
    for flags, refusal in (
        ({"transcribe.chunk_length_s": 10}, "transcribe.chunk_length_s with transcribe.endpoint"),
        ({"transcribe.whisper_task": "translate"}, "/v1/audio/transcriptions; translate in-process"),
        ({"transcribe.endpoint.batch": {}}, "no provider's Batch API takes audio"),
        ({"transcribe.endpoint.price": {"input": 1.0}}, "per_audio_minute"),
    ):
        with pytest.raises(ConfigError) as refused:
            load_config(flags={**ENDPOINT, **flags})
        assert refusal in str(refused.value) and "\n" not in str(refused.value).strip(), refused.value

    assert transcription_form("whisper-1", None, False) == {"model": "whisper-1", "response_format": "json"}
    assert transcription_form("w", "de", True) == {"model": "w", "response_format": "verbose_json", "language": "de"}
    answer = parse_transcription(
        {
            "text": " hi there",
            "segments": [{"start": 0, "end": 1.5, "text": " hi there"}],
            "usage": {"type": "duration"},
        }
    )
    assert (answer.text, answer.segments, answer.tokens) == (" hi there", [(0.0, 1.5, " hi there")], None)
    for body in ({"segments": []}, {"text": 3}, {"text": "", "segments": [{"start": "0", "end": 1, "text": ""}]}):
        with pytest.raises(Malformed):
            parse_transcription(body)


def test_whisper_runs_its_encoder_once_a_window_and_leaves_its_beams_shared_keys_in_place(whisper_dir):
    """Without ``transcribe.language`` Whisper's ``generate`` detects each window's language with an encoder pass of
    its own before the one it transcribes with: the head hands it the encoder's outputs, one pass a batch. Its beam
    search's cache leaves the cross-attention keys and values, equal for every beam of a window, where they are instead
    of copying them at every step. The text is still the pipeline's."""
    import torch

    from lakescore.udfs.heads.whisper_cache import SharedCrossAttention, beam_search_cache

    head, pipe = _head(whisper_dir), _pipeline(whisper_dir)
    assert head.encode_once and head.shares_cross_attention
    passes = {"head": 0, "pipeline": 0}
    for name, model in (("head", head.model), ("pipeline", pipe.model)):
        model.get_encoder().register_forward_hook(lambda *_, name=name: passes.__setitem__(name, passes[name] + 1))
    values = [encoded(recording(4, seed=11), RATE, "WAV"), encoded(recording(5, seed=12), RATE, "WAV")]
    _, prepared, scored = _run(head, values, max_tokens=2 * head.window_cost(head.windows(6 * RATE)[0]))
    expected = [pipe({"raw": prepared.decoded[i].samples, "sampling_rate": RATE})["text"] for i in range(2)]
    assert head.columns(scored.outputs, scored.ok)[0].to_pylist() == expected
    assert passes["head"] == 1  # two windows, one batch, one encoder pass
    assert passes["pipeline"] == 4, "transformers' language detection no longer runs the encoder: drop encode_once"

    features = head.features([prepared.decoded[i].samples for i in range(2)])
    cache = beam_search_cache(head.model.config, 2)
    with torch.inference_mode():
        shared = head.model.generate(**features, past_key_values=cache, **head.generate_kwargs)
        copied = head.model.generate(**features, **head.generate_kwargs)
    assert cache.cross_attention_cache.shared is True and torch.equal(shared, copied)
    # beams that differ are reordered as transformers reorders them
    unequal = SharedCrossAttention(head.model.config, 1)
    rows = torch.arange(3.0).view(3, 1, 1, 1)
    unequal.update(rows, rows.clone(), 0)
    unequal.reorder_cache(torch.tensor([2, 2, 0]))
    assert unequal.shared is False and unequal.layers[0].keys.flatten().tolist() == [2.0, 2.0, 0.0]
