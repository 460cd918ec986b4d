"""LLM backends: Ollama /api/chat, OpenAI-compatible /v1/chat/completions, scripted."""
