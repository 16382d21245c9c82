"""The lever grid (``chatphase bench`` with comma lists in a lever): every combination, interleaved."""
