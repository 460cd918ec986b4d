"""navi_trio: a local LLM agent daemon on trio."""

__version__ = "0.1.0"
