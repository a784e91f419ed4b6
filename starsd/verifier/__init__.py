"""The target server: an OpenAI-compatible HTTP API over a target model that verifies the draft's proposals."""
