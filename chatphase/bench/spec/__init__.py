"""Decode modes side by side (``chatphase bench --spec``): plain, prompt lookup, a draft model; the verify cost."""
