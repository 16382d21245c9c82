"""A served model under rising load (``chatphase bench --server URL --rates R,R``): open-loop arrivals per rate."""
