"""llama.cpp's sampler chain for one turn's :class:`~chatphase.engine.events.SamplingParams`.

Sampling runs inside llama.cpp (one ``llama_sampler_sample`` call per token), so the per-token Python
work stays one call. The order is llama.cpp's own default: penalties, top-k, top-p, min-p, temperature,
then the random draw; ``temperature <= 0`` is greedy.
"""

from __future__ import annotations

import random

import llama_cpp as lc

from chatphase.engine.events import SamplingParams


def sampler_chain(sp: SamplingParams) -> lc.llama_sampler_p:
    """A new ``llama_sampler`` chain (free it with ``llama_sampler_free``); ``seed=None`` draws a seed."""
    chain: lc.llama_sampler_p = lc.llama_sampler_chain_init(lc.llama_sampler_chain_default_params())
    if sp.temperature <= 0:
        lc.llama_sampler_chain_add(chain, lc.llama_sampler_init_greedy())
        return chain
    if sp.repeat_penalty != 1.0:
        lc.llama_sampler_chain_add(chain, lc.llama_sampler_init_penalties(64, sp.repeat_penalty, 0.0, 0.0))
    lc.llama_sampler_chain_add(chain, lc.llama_sampler_init_top_k(sp.top_k))
    lc.llama_sampler_chain_add(chain, lc.llama_sampler_init_top_p(sp.top_p, 1))
    lc.llama_sampler_chain_add(chain, lc.llama_sampler_init_min_p(sp.min_p, 1))
    lc.llama_sampler_chain_add(chain, lc.llama_sampler_init_temp(sp.temperature))
    seed = sp.seed if sp.seed is not None else random.getrandbits(32)
    lc.llama_sampler_chain_add(chain, lc.llama_sampler_init_dist(seed))
    return chain
