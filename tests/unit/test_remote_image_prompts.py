"""What the remote generate head sends for a row's image: its bytes as they are where every server reads the
in-process head's pixels from them, else a PNG of those pixels; and the chat request that carries it (the image part,
then the prompt's text part, in one user message)."""

import base64
import io

import numpy as np
import pytest
from PIL import Image

from lakescore.udfs.images import decode_image
from lakescore.udfs.options.generate import GenerateOptions
from lakescore.udfs.remote.completions import request_body
from lakescore.udfs.remote.image_prompts import image_payload
from tests.tiny_vision import encoded, picture


def _sent(data: bytes):
    payload = image_payload(data, decode_image(data))
    part = payload.content_part()
    prefix = f"data:{payload.media_type};base64,"
    assert part["type"] == "image_url" and part["image_url"]["url"].startswith(prefix)
    return payload.media_type, base64.b64decode(part["image_url"]["url"][len(prefix) :])


@pytest.mark.parametrize(
    "fmt, media_type", [("PNG", "image/png"), ("JPEG", "image/jpeg"), ("WEBP", "image/webp"), ("GIF", "image/gif")]
)
def test_formats_every_server_reads_go_as_they_are(fmt, media_type):
    data = encoded(picture(24, 16, 1), fmt)
    assert _sent(data) == (media_type, data)
    gray = encoded(picture(24, 16, 2).convert("L"), fmt)
    assert _sent(gray) == (media_type, gray)


@pytest.mark.parametrize(
    "make",
    [
        lambda: encoded(picture(24, 16, 3), "BMP"),  # a format OpenAI's API does not take
        lambda: encoded(picture(24, 16, 3), "TIFF"),
        lambda: encoded(picture(24, 16, 3).convert("RGBA"), "PNG"),  # alpha: vLLM composites it on white
        lambda: encoded(picture(24, 16, 3).convert("P"), "PNG", transparency=0),  # a transparent palette colour
        lambda: encoded(picture(24, 16, 3), "GIF", save_all=True, append_images=[picture(24, 16, 4)]),  # animated
    ],
    ids=["bmp", "tiff", "rgba", "transparent-palette", "animated-gif"],
)
def test_others_go_as_png_of_the_pixels_the_in_process_head_reads(make):
    data = make()
    media_type, sent = _sent(data)
    assert media_type == "image/png" and sent != data
    with Image.open(io.BytesIO(sent)) as image:
        assert image.format == "PNG" and image.mode == "RGB"
        assert np.array_equal(np.asarray(image), np.asarray(decode_image(data)))


def test_a_chat_request_holds_the_image_then_the_prompt_in_one_user_message():
    options = GenerateOptions(max_new_tokens=4, system_prompt="Be brief.")
    part = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
    body = request_body(options, "m", "chat", "Caption it.", image=part)
    assert body["messages"] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": [part, {"type": "text", "text": "Caption it."}]},
    ]
    assert request_body(options, "m", "chat", "Caption it.")["messages"][1] == {
        "role": "user",
        "content": "Caption it.",
    }
    with pytest.raises(ValueError, match="chat API only"):
        request_body(options, "m", "completions", "Caption it.", image=part)


def test_the_docs_endpoint_example_loads_and_completions_is_refused_before_compute(tmp_path):
    from pathlib import Path

    from lakescore.jobs.config import ConfigError, load_config

    guide = (Path(__file__).resolve().parents[2] / "docs" / "generation.md").read_text(encoding="utf-8")
    at = guide.index("# the captions above, by a vision-language model a team serves")
    example = guide[at : guide.index("```", at)]
    (tmp_path / "captions.yaml").write_text(example, encoding="utf-8")
    cfg = load_config(tmp_path / "captions.yaml")
    cfg.require_for_scoring()
    assert cfg.input_kind.prompted and cfg.generate.endpoint.api == "chat"
    (tmp_path / "completions.yaml").write_text(example.replace("api: chat", "api: completions"), encoding="utf-8")
    with pytest.raises(ConfigError) as refused:
        load_config(tmp_path / "completions.yaml")
    assert "\n" not in str(refused.value) and "set generate.endpoint.api: chat" in str(refused.value)
