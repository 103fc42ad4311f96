"""Tool calls as text: c2jax's own protocol (`protocol`) and the per-model formats
(`formats`: c2jax, Qwen3 `<tool_call>`, Kimi-K2 sections). A leaf package, so the data
pipeline (chat templates, SFT traces), the environment's tools and the agent loop all
read and write tool calls the same way without importing each other.
"""
