"""Hugging Face checkpoint → GGUF converters, one module per family, plus the GGUF writer."""
