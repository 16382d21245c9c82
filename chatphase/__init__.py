"""chatphase: a terminal chat for local GGUF models that makes prefill and decode visible."""

__version__ = "0.1.0"
