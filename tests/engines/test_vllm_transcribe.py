"""``--task transcribe`` through ``transcribe.endpoint`` against a standalone vLLM server (CPU build, with its
``audio`` extra) serving the tiny seeded Whisper of :func:`tests.tiny_audio.save_whisper` (d_model 256 over 4 heads:
head_dim 64, which vLLM's CPU attention takes; 30-second windows) on ``/v1/audio/transcriptions``, started once for
the module, on real Spark + Delta: a folder of WAV, FLAC and OGG recordings (one longer than a window, which vLLM cuts
itself), every row's text equal to vLLM's own answer to the same file posted by hand; with
``transcribe.return_timestamps`` the segments equal vLLM's ``verbose_json`` segments (asked with
``timestamp_granularities[]=segment``, as OpenAI's client asks; lakescore asks ``verbose_json`` alone), at least one
recording holding some."""

from __future__ import annotations

import httpx2
import pytest

from lakescore.jobs.config import load_config
from lakescore.jobs.score_job import run_scoring
from tests.engines.vllm_engine import VllmServer, needs_vllm, vllm_processes
from tests.tiny_audio import encoded, recording, save_whisper

pytestmark = needs_vllm

NAME = "tiny-whisper"
RATE = 16_000
FILES = {"a.wav": (4.0, "WAV"), "full.flac": (30.0, "FLAC"), "long.ogg": (41.0, "OGG")}
"""Seconds and container of each recording: one window the recording fills, where the tiny Whisper closes a segment
(vLLM's own cut of a longer one falls a little short of 30 s), and one longer than a window."""


@pytest.fixture(scope="module")
def whisper_dir(module_tmp_path):
    return save_whisper(
        module_tmp_path / "whisper",
        seed=5,
        window_s=30,
        # 60 steps a window, so a second of audio (the executors' preflight sends one) fills a step: vLLM 0.32 answers
        # verbose_json with a 500 ("tuple index out of range") when the model writes nothing but <|endoftext|>; and a
        # full window's closing timestamp is then the last token vLLM generates (64 positions), which its verbose_json
        # reads as the end of a segment (a timestamp followed by more text closes none)
        max_length=62,
        d_model=256,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        encoder_ffn_dim=256,
        decoder_ffn_dim=256,
    )


@pytest.fixture(scope="module")
def calls(module_tmp_path):
    root = module_tmp_path / "calls"
    root.mkdir()
    for i, (name, (seconds, fmt)) in enumerate(FILES.items()):
        (root / name).write_bytes(encoded(recording(seconds, seed=20 + i), RATE, fmt))
    return root


@pytest.fixture(scope="module")
def vllm(whisper_dir, module_tmp_path):
    server = VllmServer(
        whisper_dir, module_tmp_path / "vllm.log", NAME, args=("--dtype", "float32", "--gpu-memory-utilization", "0.1")
    )
    try:
        yield server.start()
    finally:
        server.stop()
    assert not [c for c in vllm_processes() if str(whisper_dir) in c], "a vLLM process outlived its server"


def _posted(server: VllmServer, path, **form) -> dict:
    """vLLM's answer to ``path`` posted by hand, as OpenAI's client posts it."""
    response = httpx2.post(
        f"{server.url}/audio/transcriptions",
        timeout=600,
        data={"model": NAME, "language": "en", **form},
        files={"file": (path.name, path.read_bytes())},
    )
    assert response.status_code == 200, response.text
    return response.json()


def _run(spark, tmp_path, calls, url, **flags):
    report = run_scoring(
        load_config(
            flags={
                "input": str(calls),
                "input_format": "audio",
                "output": str(tmp_path / "texts"),
                "task": "transcribe",
                "spark.master": "local[2]",
                "transcribe.language": "en",
                "transcribe.endpoint.url": url,
                "transcribe.endpoint.model": NAME,
                **flags,
            }
        ),
        spark,
    )
    assert report.status == "succeeded", report.error
    assert report.output_rows == len(FILES) and not report.error_reasons
    out = spark.read.format("delta").load(str(tmp_path / "texts")).toPandas()
    return out.set_index(out["path"].str.removeprefix(f"file:{calls}/"))


def test_a_folder_through_vllm_gives_vllms_own_texts(spark, tmp_path, calls, vllm):
    out = _run(spark, tmp_path, calls, vllm.url)
    for name, (seconds, _) in FILES.items():
        assert out.loc[name, "text"] == _posted(vllm, calls / name)["text"], name
        assert out.loc[name, "duration_s"] == pytest.approx(seconds)
    assert any(len(t) > 3 for t in out["text"])  # the tiny model writes text, so equality says something


def test_timestamps_through_vllm_are_its_verbose_json_segments(spark, tmp_path, calls, vllm):
    out = _run(spark, tmp_path, calls, vllm.url, **{"transcribe.return_timestamps": True})
    segmented = 0
    for name in FILES:
        answer = _posted(vllm, calls / name, response_format="verbose_json", **{"timestamp_granularities[]": "segment"})
        expected = [(s["start"], s["end"], s["text"]) for s in answer["segments"]]
        got = [(s["start"], s["end"], s["text"]) for s in out.loc[name, "segments"]]
        assert got == expected, name  # float64 both ways: the seconds exactly as vLLM wrote them
        assert out.loc[name, "text"] == answer["text"], name
        segmented += bool(expected)
    # vLLM applies none of Whisper's timestamp rules: a segment is what the model writes between two timestamps, which
    # the tiny Whisper does where a window is full (the long recording's first)
    assert segmented, "vLLM gave no recording a segment: the equality says nothing of them"
