"""Prompt-length, context-depth and parallel-decode experiments (``chatphase bench`` and the Experiments screen).

Modules, each single-purpose and free of Textual:

- :mod:`~chatphase.bench.core.prompts` — prompts of exactly N tokens, cut on token boundaries.
- :mod:`~chatphase.bench.core.stats` — mean ± sample sd, median, min, max of repetitions.
- :mod:`~chatphase.bench.core.fits` — least-squares TTFT = a + b × prompt_tokens, decode speed vs depth.
- :mod:`~chatphase.bench.core.roofline` — measured memory bandwidth and matmul FLOP/s, and the phase bounds.
- :mod:`~chatphase.bench.core.runner` — the sweep over prompt lengths and depths (warm-up, reps, cold cache).
- :mod:`~chatphase.bench.parallel.sweep` — the parallel-decode sweep: N sequences decoded together, step accounting.
- :mod:`~chatphase.bench.parallel.remote` — the same over a server: N concurrent streams.
- :mod:`~chatphase.bench.parallel.roofline` — the step's roofline per N (bandwidth- or arithmetic-bound).
- :mod:`~chatphase.bench.core.results`, :mod:`~chatphase.bench.core.parallel_results` — the records and their JSON/CSV forms.
- :mod:`~chatphase.bench.core.report` — table, Markdown, CSV and JSON output; :mod:`~chatphase.bench.core.plot` — the plots.
- :mod:`~chatphase.bench.core.events` — the run's events, system facts, engine loading.
- :mod:`~chatphase.bench.sweep.run` — one whole run as an iterator of events (model load, peaks, sweep, result);
  :mod:`~chatphase.bench.parallel.run` — the same for the parallel sweep.
- :mod:`~chatphase.bench.core.job` — that run in a child process, for the TUI (no llama.cpp in the UI process).
"""
