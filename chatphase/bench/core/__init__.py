"""What every experiment shares: the contract, events, the child-process job, peaks, the roofline's use, the
sweep's measuring loop, records and fits, the common report helper and the sweep's plot (statistics and line fits
are :mod:`chatphase.timing`'s, plot files :mod:`chatphase.plotting`'s). Imports no experiment."""
