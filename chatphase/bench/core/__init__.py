"""What every experiment shares: the contract, events, the child-process job, stats, peaks, the roofline's use,
the sweep's measuring loop and records, and the common report and plot helpers. Imports no experiment."""
