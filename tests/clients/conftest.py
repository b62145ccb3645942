"""Clients we did not write (vLLM's ``vllm bench serve``, GuideLLM, the OpenAI Python client) against the emulator
serving the lane's tiny model's tokenizer, and (tests marked ``vllm``) against the real lane server.

The real-vLLM helpers of ``tests/vllm/vllm_lane.py`` are shared (the lane's paths, the counter-window lock, the
running server's URL). A missing client skips with the reason; ``BLIS_REQUIRE_CLIENTS=1`` (.ci/run's clients step)
makes that a failure.
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "vllm"))
