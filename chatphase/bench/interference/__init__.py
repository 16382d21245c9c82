"""Prefill meets decode (``chatphase bench --interference``): N streams decode while a new prompt arrives."""
