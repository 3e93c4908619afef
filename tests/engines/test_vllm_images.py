"""``--task generate --image-col`` through a served vLLM (``generate.server.engine: vllm``, its CPU build from
``build/engines/vllm``) running a tiny seeded Idefics3 (SmolVLM's architecture), on real Spark + Delta.

Every row is scored; each text equals vLLM's own offline ``LLM.generate`` on the same image and the same rendered
prompt exactly; the share equal to transformers' greedy ``generate`` in-process is printed (random weights: near-ties
may split the two engines); no vLLM process of the run is left. A tiny LLaVA saved by transformers 5 is no use here:
vLLM 0.32 does not map its checkpoint's keys (``vision_tower.embeddings`` and others), an Idefics3 it loads as saved.
"""

from __future__ import annotations

import json
import subprocess
import threading
import time
from pathlib import Path

import pandas as pd
import pytest

from lakescore.jobs.config import load_config
from lakescore.jobs.score_job import run_scoring
from tests.engines.vllm_engine import (
    ENGINE_ENV,
    STARTUP_S,
    VLLM_PYTHON,
    assert_sessions_end,
    engine_env,
    equal_texts,
    needs_vllm,
    offline_texts,
)
from tests.served_models import live_processes

pytestmark = needs_vllm

TEMPLATE = "Caption this photo of a {name}."
NEW_TOKENS = 8
ARGS = ["--dtype", "float32", "--max-model-len", "256", "--gpu-memory-utilization", "0.1"]
"""The tier's flags (:data:`~tests.engines.vllm_engine.SERVE_ARGS`) within the tiny model's 256 positions."""
NAMES = ["lamp", "mug", "chair", "desk", "rug", "vase"]

OFFLINE = """
import io, json, sys
from PIL import Image, ImageOps
from transformers import AutoTokenizer
from vllm import LLM, SamplingParams

def main():
    spec = json.loads(sys.argv[1])
    tokenizer = AutoTokenizer.from_pretrained(spec["model"])
    llm = LLM(model=spec["model"], dtype="float32", max_model_len=256, gpu_memory_utilization=0.1)
    requests = []
    for path, prompt in spec["rows"]:
        image = ImageOps.exif_transpose(Image.open(path)).convert("RGB")
        messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": prompt}]}]
        text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        # the chat template writes the BOS token: the text's tokens as they are, none added (as vLLM's chat API does)
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        requests.append({"prompt_token_ids": ids, "multi_modal_data": {"image": image}})
    outputs = llm.generate(requests, SamplingParams(temperature=0.0, max_tokens=spec["max_new_tokens"]), use_tqdm=False)
    print("RESULT " + json.dumps([[o.outputs[0].text, len(o.prompt_token_ids)] for o in outputs]), flush=True)

if __name__ == "__main__":
    main()
"""


@pytest.fixture(autouse=True)
def engine_environment(monkeypatch):
    for name, value in ENGINE_ENV.items():
        monkeypatch.setenv(name, value)


def _vllm_sessions(model: Path) -> set[int]:
    """The sessions of vLLM API servers serving ``model`` (each engine's processes share its server's session)."""
    found = set()
    for pid, command in live_processes():
        if "vllm.entrypoints.openai.api_server" in command and str(model) in command:
            try:
                found.add(int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[3]))
            except OSError:  # it ended meanwhile
                pass
    return found


def test_a_served_vllm_reads_each_image_with_its_prompt_as_its_offline_generate_does(spark, tmp_path):
    import torch
    import transformers

    from lakescore.udfs.images import decode_image
    from tests.tiny_vision import encoded, picture
    from tests.tiny_vlms import tiny_idefics3

    model = tiny_idefics3(tmp_path / "served-idefics3")  # its path marks this test's engine
    photos = [encoded(picture(24 + 7 * i, 40 - 3 * i, 20 + i), "JPEG" if i % 2 else "PNG") for i in range(len(NAMES))]
    for i, data in enumerate(photos):
        (tmp_path / f"{i + 1}.img").write_bytes(data)
    frame = pd.DataFrame({"sku": range(1, len(NAMES) + 1), "photo": photos, "name": NAMES})
    source, output = tmp_path / "catalog", tmp_path / "captions"
    spark.createDataFrame(frame, "sku long, photo binary, name string").write.format("delta").save(str(source))
    sessions: set[int] = set()
    ended = threading.Event()

    def watch() -> None:  # the engine's session, while it runs (it stops with the run)
        while not ended.is_set():
            sessions.update(_vllm_sessions(model))
            time.sleep(0.5)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    started = time.monotonic()
    try:
        report = run_scoring(
            load_config(
                flags={
                    "input": str(source),
                    "output": str(output),
                    "task": "generate",
                    "id_col": "sku",
                    "image_col": "photo",
                    "model.source": str(model),
                    "generate.prompt_template": TEMPLATE,
                    "generate.max_new_tokens": NEW_TOKENS,
                    "spark.master": "local[2]",
                    "scoring.partitions": 1,
                    "generate.server.engine": "vllm",
                    "generate.server.python": str(VLLM_PYTHON),
                    "generate.server.api": "chat",
                    "generate.server.args": ARGS,
                    "generate.server.startup_timeout_s": STARTUP_S,
                }
            ),
            spark,
        )
    finally:
        ended.set()
        watcher.join()
    served_s = time.monotonic() - started
    assert sessions  # the watcher saw the engine
    assert report.status == "succeeded", report.error
    assert not report.error_reasons
    out = spark.read.format("delta").load(str(output)).toPandas().sort_values("sku").reset_index(drop=True)
    assert out["sku"].tolist() == frame["sku"].tolist()  # every row scored

    prompts = [TEMPLATE.format(name=n) for n in NAMES]
    log = tmp_path / "offline.log"
    spec = json.dumps(
        {
            "model": str(model),
            "max_new_tokens": NEW_TOKENS,
            "rows": [[str(tmp_path / f"{i + 1}.img"), p] for i, p in enumerate(prompts)],
        }
    )
    with open(log, "wb") as sink:
        offline = subprocess.Popen(
            [str(VLLM_PYTHON), "-c", OFFLINE, spec],
            stdout=sink,
            stderr=subprocess.STDOUT,
            env=engine_env(),
            start_new_session=True,
        )
    sessions.add(offline.pid)  # its own session, as the engine's
    answers = offline_texts(offline, log)
    assert out["generated_text"].tolist() == [text for text, _ in answers]  # vLLM's own offline generate, exactly
    assert out["prompt_tokens"].tolist() == [
        tokens for _, tokens in answers
    ]  # usage: the image's tokens and the prompt's

    processor = transformers.AutoProcessor.from_pretrained(model)
    vlm = transformers.AutoModelForImageTextToText.from_pretrained(model).eval()
    in_process = []
    for data, prompt in zip(photos, prompts):
        messages = [
            {
                "role": "user",
                "content": [{"type": "image", "image": decode_image(data)}, {"type": "text", "text": prompt}],
            }
        ]
        inputs = processor.apply_chat_template(
            messages, add_generation_prompt=True, tokenize=True, return_dict=True, return_tensors="pt"
        )
        with torch.no_grad():
            new = vlm.generate(**inputs, do_sample=False, max_new_tokens=NEW_TOKENS)[0, inputs["input_ids"].shape[1] :]
        in_process.append(processor.decode(new, skip_special_tokens=True))
    same, same_but_cut = equal_texts(out["generated_text"].tolist(), in_process)
    differ = [
        n for n, a, b in zip(NAMES, out["generated_text"], in_process) if a.rstrip("\ufffd") != b.rstrip("\ufffd")
    ]
    print(
        f"served vLLM (images) vs transformers' in-process greedy: {same} of {len(NAMES)} texts equal, {same_but_cut} "
        f"but for a last character cut at max_new_tokens; rows that differ: {differ}; the run took {served_s:.0f} s"
    )

    assert_sessions_end(sessions)
    assert not _vllm_sessions(model)
