"""Side by side (``chatphase compare``, ``bench --compare``): one conversation sent to two models, or to one model
under two settings, turn by turn, with the ratios of each turn's phase figures."""
