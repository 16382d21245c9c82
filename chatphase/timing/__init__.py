"""Models of time, pure and on the bottom layer (no import from the rest of chatphase): what the chat, the
dashboard, the history and the bench predict and summarise about how long things take.

- :mod:`~chatphase.timing.stats` — summary statistics of repetitions (mean ± sd, median, min, max) and Student's t.
- :mod:`~chatphase.timing.fits` — least-squares lines (TTFT against prompt tokens, decode rate against depth).
- :mod:`~chatphase.timing.forecast` — when the conversation fills the context, from the KV cache after each turn.
- :mod:`~chatphase.timing.ttft_model` — the TTFT model: a prefill's time and its fit from measured prefills.
- :mod:`~chatphase.timing.ttft_prediction` — what is shown of it: a turn's prediction, its range, or why it is
  withheld and its bounds; the predictor a chat keeps.
- :mod:`~chatphase.timing.saved_sweeps` — the one reader of saved sweeps' prefills as the model's points.
"""
