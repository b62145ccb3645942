"""pytest-blis: calibration scenarios for a tiered-KV simulator of vLLM, as pytest items."""
from blis_sim import __version__

__all__ = ["__version__"]
