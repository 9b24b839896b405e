"""Pure rules of the weights transport: which URIs are fetched, what is announced, which names a
remote manifest may list (a manifest can never make the fetcher write outside its version)."""

from __future__ import annotations

from pathlib import Path

import pytest

from prioreplay.checkpoint_reader import WEIGHTS_FORMAT
from prioreplay.weights_transport import WeightsFetcher, WeightsFetchError, is_remote, manifest_files, published_uri


def test_only_uris_with_a_scheme_other_than_file_are_fetched():
    assert [is_remote(u) for u in ("/ckpt/v-1", "file:///ckpt/v-1", "http://h:1/v-1/", "s3://b/v-1", "gs://b/v-1")] == [
        False,
        False,
        True,
        True,
        True,
    ]


def test_the_announced_uri_is_the_local_path_or_the_base_url_with_the_version():
    assert published_uri(Path("/ckpt/published/v-3"), None) == "/ckpt/published/v-3"
    assert published_uri(Path("/ckpt/published/v-3"), "http://learner-0:8000/") == "http://learner-0:8000/v-3/"
    assert published_uri(Path("/x/v-12"), "s3://bucket/run") == "s3://bucket/run/v-12/"


def _manifest(*names):
    return {"format": WEIGHTS_FORMAT, "version": 1, "tensors": 3, "files": {n: {"size": 1} for n in names}}


def test_a_manifest_lists_safe_relative_names_only():
    assert manifest_files(_manifest("model.safetensors", "config.json", "sub/tokenizer.json"), "u") == [
        "config.json",
        "model.safetensors",
        "sub/tokenizer.json",
    ]
    for bad in ("../evil", "/etc/passwd", "a/../../b", ".hidden", "a//b", "a\\b", "prioreplay.json", "a b", "%2e%2e/x"):
        with pytest.raises(WeightsFetchError, match="unsafe"):
            manifest_files(_manifest("model.safetensors", bad), "u")


def test_a_manifest_of_another_format_or_without_weights_is_refused():
    with pytest.raises(WeightsFetchError, match="not a prioreplay-weights"):
        manifest_files({"format": "prioreplay-checkpoint/1", "files": {}}, "u")
    with pytest.raises(WeightsFetchError, match="no model.safetensors"):
        manifest_files(_manifest("config.json"), "u")


def test_fetcher_settings_are_checked():
    with pytest.raises(ValueError, match=r"keep \(0\) must be"):
        WeightsFetcher("/tmp/x", keep=0)
    with pytest.raises(ValueError, match=r"timeout \(0\) must be"):
        WeightsFetcher("/tmp/x", timeout_s=0)
