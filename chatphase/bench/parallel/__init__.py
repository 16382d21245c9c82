"""The parallel-decode sweep (``chatphase bench --parallel``): N sequences decoded together, or N streams."""
