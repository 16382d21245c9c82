"""The experiments of ``chatphase bench`` and the Experiments screen, free of Textual.

- :mod:`~chatphase.bench.core` — what every experiment shares: the contract (:mod:`~chatphase.bench.core.contract`:
  plan, run, result, ``kind`` and ``version``), the experiment's record and its plan's knobs
  (:mod:`~chatphase.bench.core.experiment`), the child-process job, the sweep's fits, the machine's peaks, the
  roofline's use, the cell records, the report and plot helpers.
- one subpackage per experiment, each defining its record (``experiment.py``) and importing only the core (and
  :mod:`~chatphase.bench.sweep`, those built on the sweep's measuring loop); the registry lists them.
- :mod:`~chatphase.bench.experiments` — the registry of experiments (one line each) and the one loader of saved
  results.
- :mod:`~chatphase.bench.whatif` — the what-if predictions from a device's datasheet figures.
"""
