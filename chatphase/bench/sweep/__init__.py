"""The prompt-length and context-depth sweep (``chatphase bench``, the Experiments screen's first tab)."""
