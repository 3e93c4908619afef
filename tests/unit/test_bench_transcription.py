"""W12's pure parts (no Spark, no Ray, no Daft, no model): the Daft and Ray Data peers hear the samples lakescore
hears, and each peer's transcripts are read back keyed by the same path whatever URL form its engine writes."""

import json
import sys

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from lakescore.udfs.audio import decode_audio
from tests.tiny_audio import encoded, recording


def test_the_peers_decode_a_stereo_44k_flac_to_lakescores_samples():
    from bench.peers.asr_parts import decode

    data = encoded(recording(1.5, rate=44_100, seed=3, channels=2), 44_100, "FLAC")
    theirs = decode(data, 16_000)
    assert theirs.dtype == np.float32 and np.array_equal(theirs, decode_audio(data, 16_000, None).samples)


def test_every_peers_texts_are_keyed_by_the_plain_path(tmp_path):
    from bench.transcription import texts

    runs = {peer: tmp_path / peer for peer in ("lakescore", "loop", "daft", "ray")}
    (runs["lakescore"] / "delta" / "_delta_log").mkdir(parents=True)
    pq.write_table(
        pa.table({"path": ["file:/calls/a.wav"], "text": [" hi"]}), runs["lakescore"] / "delta" / "p.parquet"
    )
    log = [{"metaData": {"partitionColumns": []}}, {"add": {"path": "p.parquet"}}]
    (runs["lakescore"] / "delta" / "_delta_log" / f"{0:020d}.json").write_text("\n".join(map(json.dumps, log)))
    runs["loop"].mkdir()
    pd.DataFrame({"path": ["/calls/a.wav"], "text": [" hi"]}).to_parquet(runs["loop"] / "texts.parquet")
    for peer, path in (("daft", "file:///calls/a.wav"), ("ray", "/calls/a.wav")):
        (runs[peer] / "texts").mkdir(parents=True)
        pd.DataFrame({"path": [path], "text": [" hi"]}).to_parquet(runs[peer] / "texts" / "part-0.parquet")
    for peer, run in runs.items():
        assert texts(peer, run).to_dict("records") == [{"path": "/calls/a.wav", "text": " hi"}], peer
    assert not {"ray", "daft"} & set(sys.modules)
