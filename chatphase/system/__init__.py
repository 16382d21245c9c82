"""System figures: the engine process's RSS and CPU and the machine's memory (:mod:`.process`), the
CPU features llama.cpp cares about (:mod:`.cpu_features`) and GPU memory (:mod:`.gpu`)."""
