"""W12P: W12's transcription in-process (issue 69, item 8): the transcribe head through the worker's audio runner
against ``transformers.pipeline("automatic-speech-recognition")`` over the same recordings, one at a time.

W12's seeded Whisper (:func:`bench.transcription.make_w12_model`) and its recordings of 5-30 s
(:func:`bench.transcription.make_w12_data`: one 30-second window each) in one process on one torch thread, as a Spark
task with one CPU runs it. The head is the registry's (what a worker loads), its recordings one Arrow batch of bytes
through :class:`~lakescore.udfs.audio_runner.AudioRunner` (decode, windows, features, ``generate``, merge) at the
worker's default budget or at ``--windows`` windows a batch; the pipeline reads each file with ``load_audio`` and
transcribes it with ``chunk_length_s=30``, as ``bench/peers/asr_loop.py`` does; the head as it was before issue 69's
item 8 (``generate`` runs the encoder and makes its own beam-search cache) runs too. The paths alternate ``--repeats``
times; the figure is the process's CPU seconds per pass over all recordings (``time.process_time``, steadier than wall
time on a shared host), median per path. Texts are compared row by row. ``--profile``: one more pass of each under
cProfile, the top functions printed. No Spark: the scoring stage's own work is what is measured.

Run: ``python -m bench.transcribe_inprocess --rows 40 --repeats 3 [--windows 1 4 8] [--profile] [--out DIR]``.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from bench.transcription import make_w12_data, make_w12_model

W12P = "W12P"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=40)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--windows", type=int, nargs="*", default=[], help="windows a forward batch (default: the worker's budget)"
    )
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)

    import pyarrow as pa
    import torch
    from transformers import pipeline
    from transformers.audio_utils import load_audio

    from lakescore.udfs.audio_runner import AudioRunner
    from lakescore.udfs.batching import AdaptiveBudget, BatchPolicy
    from lakescore.udfs.heads.protocol import PlansOwnBudget
    from lakescore.udfs.heads.transcribe import WhisperTranscriber
    from lakescore.udfs.models.model_source import ModelSpec
    from lakescore.udfs.options.transcribe import TranscribeOptions
    from lakescore.udfs.registry import get_task

    torch.set_num_threads(args.threads)
    out = args.out or Path(tempfile.mkdtemp(prefix="w12p-"))
    out.mkdir(parents=True, exist_ok=True)
    model_dir = out / "model"
    if not (model_dir / "config.json").is_file():
        make_w12_model(model_dir)
    folder = make_w12_data(out / f"calls_{args.rows}", args.rows)
    files = sorted(folder.iterdir())[: args.rows]
    values = [p.read_bytes() for p in files]

    loads: dict[str, list[float]] = {"head": [], "pipeline": []}
    spec = ModelSpec("transcribe", str(model_dir), transcribe=TranscribeOptions())
    for _ in range(2):  # the first of each pays for imports: the second is the load a warm daemon's worker pays
        started = time.process_time()
        head = get_task("transcribe").load(spec, model_dir)
        loads["head"].append(time.process_time() - started)
        started = time.process_time()
        pipe = pipeline("automatic-speech-recognition", model=str(model_dir))
        loads["pipeline"].append(time.process_time() - started)
    rate = pipe.feature_extractor.sampling_rate
    window_cost = head.window_cost(head.windows(30 * rate)[0])
    default_budget = head.default_max_tokens("cpu") if isinstance(head, PlansOwnBudget) else None

    def lakescore_pass(windows: int | None, head=head) -> Callable[[], list[str]]:
        from lakescore.udfs.batching import default_max_tokens

        budget = windows * window_cost if windows else (default_budget or default_max_tokens("cpu"))

        def run() -> list[str]:
            runner = AudioRunner(head, ["audio"])
            prepared = runner.prepare(pa.RecordBatch.from_pydict({"audio": pa.array(values, pa.binary())}))
            scored = runner.score(prepared, AdaptiveBudget(BatchPolicy(budget, 256)))
            assert scored.ok.all(), [e for e in scored.errors if e][:3]
            return head.columns(scored.outputs, scored.ok)[0].to_pylist()

        return run

    # the head as it was before: generate runs the encoder (twice where it detects the language) and its beam search
    # copies the cross-attention keys and values at every step
    before = get_task("transcribe").load(spec, model_dir)
    assert isinstance(before, WhisperTranscriber)
    before.encode_once = before.shares_cross_attention = False

    def pipeline_pass() -> list[str]:
        return [
            pipe({"raw": load_audio(str(p), sampling_rate=rate), "sampling_rate": rate}, chunk_length_s=30)["text"]
            for p in files
        ]

    paths: dict[str, Callable[[], list[str]]] = {
        "pipeline": pipeline_pass,
        "lakescore before (generate's encoder and cache)": lakescore_pass(None, before),
    }
    for windows in args.windows or [None]:
        paths[f"lakescore ({windows} windows a batch)" if windows else "lakescore (default budget)"] = lakescore_pass(
            windows
        )
    seconds: dict[str, list[float]] = {name: [] for name in paths}
    walls: dict[str, list[float]] = {name: [] for name in paths}
    texts: dict[str, list[str]] = {}
    names = list(paths)
    for repeat in range(args.repeats):
        for name in names if repeat % 2 == 0 else names[::-1]:
            started, wall = time.process_time(), time.perf_counter()
            texts[name] = paths[name]()
            seconds[name].append(time.process_time() - started)
            walls[name].append(time.perf_counter() - wall)
    reference = statistics.median(seconds["pipeline"])
    result = {
        "rows": len(files),
        "threads": args.threads,
        "load_cpu_seconds": loads,
        "cpu_seconds": seconds,
        "wall_seconds": walls,
        "texts_equal": {name: sum(a == b for a, b in zip(texts[name], texts["pipeline"])) for name in paths},
        "distinct_texts": len(set(texts["pipeline"])),
    }
    print(
        f"{W12P}: {len(files)} recordings, {args.threads} torch thread(s); loads (CPU s, cold then warm): head "
        f"{loads['head'][0]:.1f}, {loads['head'][1]:.1f}; pipeline {loads['pipeline'][0]:.1f}, "
        f"{loads['pipeline'][1]:.1f}; {result['distinct_texts']} distinct texts"
    )
    for name in paths:
        median = statistics.median(seconds[name])
        print(
            f"{W12P} {name}: {median:.1f} CPU s (runs {', '.join(f'{s:.1f}' for s in seconds[name])}; wall "
            f"{statistics.median(walls[name]):.1f} s), {reference / median:.2f}x the pipeline's CPU, texts equal "
            f"{result['texts_equal'][name]} of {len(files)}"
        )
    if args.profile:
        for index, name in enumerate(paths):
            profiler = cProfile.Profile()
            profiler.runcall(paths[name])
            profiler.dump_stats(out / f"path-{index}.prof")
            text = io.StringIO()
            pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(25)
            print(f"--- {name}: top functions by own time\n{text.getvalue()}")
    (out / "w12p.json").write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
