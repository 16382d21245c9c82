"""The experiments of ``chatphase bench`` and the Experiments screen, free of Textual.

- :mod:`~chatphase.bench.core` — what every experiment shares: the contract (:mod:`~chatphase.bench.core.contract`:
  plan, run, result, ``kind`` and ``version``), the child-process job, the sweep's fits, the machine's peaks,
  the roofline's use, the sweep's measuring loop and records, the report and plot helpers.
- one subpackage per experiment, each importing only the core: :mod:`~chatphase.bench.sweep` (prompt length and
  depth), :mod:`~chatphase.bench.parallel` (N sequences decoded together), :mod:`~chatphase.bench.grid` (lever
  grids), :mod:`~chatphase.bench.spec` (decode modes side by side), :mod:`~chatphase.bench.offload` (layers on
  the GPU).
- :mod:`~chatphase.bench.experiments` — the registry of experiments and the one loader of saved results.
- :mod:`~chatphase.bench.whatif` — the what-if predictions from a device's datasheet figures.
"""
