"""LLM backends: Ollama /api/chat, OpenAI-compatible /v1/chat/completions, scripted."""

from navi_trio.imports import HTTPX_HIDDEN, import_hiding

# Before any backend imports httpx: without its command-line client (navi_trio/imports.py).
import_hiding("httpx", HTTPX_HIDDEN)
