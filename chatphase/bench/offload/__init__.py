"""The offload sweep (``chatphase bench --gpu-layers``): the sweep once per placement, with each one's roofline."""
