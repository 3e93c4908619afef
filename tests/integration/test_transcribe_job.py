"""``transcribe`` end to end on real Spark + Delta with tiny speech models built in the test (a random-weight wav2vec2,
a Whisper whose text follows the audio): a folder of recordings read with ``--input-format audio`` through the CTC
model (every format, a long recording in windows, a broken, an empty, a too-long file dead-lettered, another file
ignored), and a Delta table of paths through the Whisper with timestamps, incremental (a missing file dead-lettered;
the rerun transcribes only the file whose length or modification time changed), and a folder through
``transcribe.endpoint``: a real ``transformers serve`` running the tiny Whisper, each recording one request (a file
whose header reads but whose frames do not decode dead-lettered with the server's answer, a garbage file refused before
any request, the price per audio minute from the audio sent, the key in no report or table). Every published text
equals ``transformers.pipeline("automatic-speech-recognition")`` on the same decoded audio."""

from __future__ import annotations

import os
from pathlib import Path

import pandas as pd
import pytest

from lakescore.jobs.config import load_config
from lakescore.jobs.score_job import run_scoring
from lakescore.udfs.audio import decode_audio
from tests.served_models import transformers_serve
from tests.tiny_audio import WHISPER_WINDOW_S, encoded, recording, save_wav2vec2, save_whisper

RATE = 16_000


def _config(**flags):
    return load_config(flags={"spark.master": "local[2]", "max_error_rate": 0.6, **flags})


def _pipeline_text(model_dir: Path, data: bytes, window_s: float, **kwargs) -> dict:
    from transformers import pipeline

    audio = decode_audio(data, RATE, None)
    pipe = pipeline("automatic-speech-recognition", model=str(model_dir))
    return pipe({"raw": audio.samples, "sampling_rate": RATE}, chunk_length_s=window_s, **kwargs)


def test_a_folder_of_recordings_through_a_ctc_model(spark, tmp_path):
    model_dir = save_wav2vec2(tmp_path / "ctc")
    root = tmp_path / "calls"
    (root / "nested").mkdir(parents=True)
    files = {
        "a.wav": encoded(recording(3, seed=1), RATE, "WAV"),
        "nested/b.FLAC": encoded(recording(4, rate=44_100, seed=2, channels=2), 44_100, "FLAC"),
        "long.ogg": encoded(recording(70, seed=3), RATE, "OGG"),
        "c.mp3": encoded(recording(2, rate=22_050, seed=4), 22_050, "MP3"),
    }
    bad = {
        "broken.mp3": b"ID3 but not really an mp3" * 4,
        "empty.wav": b"",
        "too_long.wav": encoded(recording(130, rate=8_000, seed=5), 8_000, "WAV"),
    }
    for name, data in {**files, **bad, "notes.txt": b"not audio"}.items():
        (root / name).write_bytes(data)
    output = tmp_path / "transcripts"
    report = run_scoring(
        _config(
            input=str(root),
            input_format="audio",
            output=str(output),
            task="transcribe",
            **{"model.source": str(model_dir), "transcribe.max_duration_s": 120},
        ),
        spark,
    )
    assert report.status == "succeeded", report.error
    assert (report.input_rows, report.output_rows, report.ignored_files) == (7, 4, 1)
    assert report.error_reasons == {"invalid_audio": 1, "null_input": 1, "audio_too_long": 1}
    out = spark.read.format("delta").load(str(output)).toPandas().set_index("path")
    assert "segments" not in out.columns
    for name, data in files.items():
        row = out.loc[f"file:{root / name}"]
        assert row["text"] == _pipeline_text(model_dir, data, 30)["text"], name
        assert row["duration_s"] == pytest.approx(decode_audio(data, RATE, None).duration_s)
    assert out.loc[f"file:{root / 'nested/b.FLAC'}", "sample_rate"] == 44_100
    errors = spark.read.format("delta").load(f"{output}_errors").toPandas().set_index("path")
    assert errors.loc[f"file:{root / 'too_long.wav'}", "error"] == (
        "130.0 s long, above transcribe.max_duration_s 120 s"
    )
    assert errors.loc[f"file:{root / 'broken.mp3'}", "reason"] == "invalid_audio"


def test_a_table_of_paths_through_whisper_with_timestamps_incrementally(spark, tmp_path):
    model_dir = save_whisper(tmp_path / "whisper")
    root = tmp_path / "voice_notes"
    root.mkdir()
    files = {
        "n1.wav": encoded(recording(4, seed=6), RATE, "WAV"),
        "n2.flac": encoded(recording(WHISPER_WINDOW_S * 3, rate=48_000, seed=7), 48_000, "FLAC"),
    }
    for name, data in files.items():
        (root / name).write_bytes(data)
    paths = {1: str(root / "n1.wav"), 2: f"file://{root / 'n2.flac'}", 3: str(root / "gone.wav")}
    source, output = tmp_path / "notes", tmp_path / "note_texts"
    spark.createDataFrame(
        pd.DataFrame({"note_id": list(paths), "recording": list(paths.values())}), "note_id long, recording string"
    ).write.format("delta").save(str(source))
    flags = dict(
        input=str(source),
        output=str(output),
        task="transcribe",
        id_col="note_id",
        audio_col="recording",
        **{"model.source": str(model_dir), "write.mode": "incremental", "transcribe.return_timestamps": True},
    )
    report = run_scoring(_config(**flags), spark)
    assert report.status == "succeeded", report.error
    assert (report.output_rows, report.error_reasons) == (2, {"missing_file": 1})
    out = spark.read.format("delta").load(str(output)).toPandas().set_index("note_id")
    for note, name in ((1, "n1.wav"), (2, "n2.flac")):
        expected = _pipeline_text(model_dir, files[name], WHISPER_WINDOW_S, return_timestamps=True)
        assert out.loc[note, "text"] == expected["text"]
        assert [(s["start"], s["end"], s["text"]) for s in out.loc[note, "segments"]] == [
            (*c["timestamp"], c["text"]) for c in expected["chunks"]
        ]
    assert out.loc[2, "sample_rate"] == 48_000 and out.loc[2, "input_path"] == paths[2]
    assert out.loc[1, "text"] != out.loc[2, "text"]  # the tiny Whisper writes what it hears

    # The rerun: n1 touched with other bytes (a new length and time) is transcribed again; n2, untouched, is kept.
    files["n1.wav"] = encoded(recording(5, seed=8), RATE, "WAV")
    (root / "n1.wav").write_bytes(files["n1.wav"])
    stat = (root / "n1.wav").stat()
    os.utime(root / "n1.wav", ns=(stat.st_atime_ns, stat.st_mtime_ns + 5_000_000_000))
    again = run_scoring(_config(**flags), spark)
    assert again.status == "succeeded", again.error
    assert (again.rows_kept, again.rows_scored) == (1, 1)
    now = spark.read.format("delta").load(str(output)).toPandas().set_index("note_id")
    assert now.loc[1, "run_id"] == again.run_id and now.loc[2, "run_id"] == report.run_id
    expected = _pipeline_text(model_dir, files["n1.wav"], WHISPER_WINDOW_S, return_timestamps=True)
    assert now.loc[1, "text"] == expected["text"] and now.loc[1, "duration_s"] == pytest.approx(5.0)
    assert now.loc[1, "text"] != out.loc[1, "text"]  # the new recording's, not the old row's


def test_a_folder_through_a_transcription_endpoint_equals_the_pipeline_and_the_servers_failure_is_a_dead_letter(
    spark, tmp_path, monkeypatch
):
    import json

    key_env, key = "LAKESCORE_TEST_SPEECH_KEY", "sk-lakescore-speech-7a6b5c4d3e"
    # beams in the model's generation config: the server's plain generate searches as the pipeline (which adds its 5
    # beams only where the model sets none)
    model_dir = save_whisper(tmp_path / "whisper", num_beams=5)
    root = tmp_path / "calls"
    root.mkdir()
    files = {
        "a.wav": encoded(recording(3, seed=1), RATE, "WAV"),
        "b.flac": encoded(recording(WHISPER_WINDOW_S, seed=2), RATE, "FLAC"),
        "c.ogg": encoded(recording(4.5, seed=3), RATE, "OGG"),
    }
    bad = {
        "cut.flac": encoded(recording(3, seed=4), RATE, "FLAC")[:2000],  # its header reads, its frames do not
        "junk.wav": b"RIFF but not a wave" * 8,
    }
    for name, data in {**files, **bad}.items():
        (root / name).write_bytes(data)
    monkeypatch.setenv(key_env, key)
    spark.sparkContext.environment[key_env] = key  # the executors' Python workers read it
    try:
        with transformers_serve(model_dir, tmp_path / "serve.log") as server:
            report = run_scoring(
                _config(
                    input=str(root),
                    input_format="audio",
                    output=str(tmp_path / "texts"),
                    task="transcribe",
                    **{
                        "transcribe.endpoint.url": server.url,
                        "transcribe.endpoint.model": str(model_dir),
                        "transcribe.endpoint.api_key_env": key_env,
                        "transcribe.endpoint.max_retries": 1,
                        "transcribe.endpoint.price": {"per_audio_minute": 0.006},
                    },
                ),
                spark,
            )
    finally:
        spark.sparkContext.environment.pop(key_env, None)
    assert report.status == "succeeded", report.error
    assert (report.output_rows, report.error_reasons) == (3, {"endpoint_error": 1, "invalid_audio": 1})
    out = spark.read.format("delta").load(str(tmp_path / "texts")).toPandas().set_index("path")
    from transformers import pipeline

    pipe = pipeline("automatic-speech-recognition", model=str(model_dir))
    for name, data in files.items():
        row = out.loc[f"file:{root / name}"]
        assert row["text"] == pipe({"raw": decode_audio(data, RATE, None).samples, "sampling_rate": RATE})["text"], name
        assert (row["duration_s"], row["sample_rate"]) == (decode_audio(data, RATE, None).duration_s, RATE)
    assert any(len(t) > 3 for t in out["text"]) and out["text"].nunique() == len(files)  # each file's own text
    errors = spark.read.format("delta").load(str(tmp_path / "texts_errors")).toPandas().set_index("path")
    assert errors.loc[f"file:{root / 'cut.flac'}", "reason"] == "endpoint_error"
    assert errors.loc[f"file:{root / 'cut.flac'}", "error"].startswith("HTTP 500")  # the server's, after its retry
    assert errors.loc[f"file:{root / 'junk.wav'}", "reason"] == "invalid_audio"  # never sent
    workers = report.workers
    sent_ms = sum(round(decode_audio(d, RATE, None).duration_s * 1000) for d in files.values())
    assert workers["audio_ms"] == sent_ms + workers["preflight"]["audio_ms"]  # the failed file's audio is not priced
    assert workers["requests"] - workers["preflight"]["requests"] == 3 + 2  # the cut file: sent, then once again
    assert report.cost["token_cost"] == pytest.approx(workers["audio_ms"] / 60_000 * 0.006)
    assert key not in json.dumps(report.as_dict()) and key not in errors.to_json()
