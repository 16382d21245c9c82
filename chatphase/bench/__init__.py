"""Prompt-length and context-depth experiments (``chatphase bench`` and the Experiments screen).

Modules, each single-purpose and free of Textual:

- :mod:`~chatphase.bench.prompts` — prompts of exactly N tokens, cut on token boundaries.
- :mod:`~chatphase.bench.stats` — mean ± sample sd, median, min, max of repetitions.
- :mod:`~chatphase.bench.fits` — least-squares TTFT = a + b × prompt_tokens, decode speed vs depth.
- :mod:`~chatphase.bench.roofline` — measured memory bandwidth and matmul FLOP/s, and the phase bounds.
- :mod:`~chatphase.bench.runner` — the sweep over prompt lengths and depths (warm-up, reps, cold cache).
- :mod:`~chatphase.bench.results` — the result records and their JSON/CSV forms.
- :mod:`~chatphase.bench.report` — table, Markdown, CSV and JSON output, and the matplotlib plot.
- :mod:`~chatphase.bench.api` — one whole run as an iterator of events (model load, peaks, sweep, result).
- :mod:`~chatphase.bench.job` — that run in a child process, for the TUI (no llama.cpp in the UI process).
"""
