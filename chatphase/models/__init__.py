"""Models: spec -> local GGUF path (:mod:`.resolve`), Hugging Face download (:mod:`.hub`), GGUF
metadata and validation (:mod:`.gguf_meta`), the memory estimate (:mod:`.memory`) and KV-cache geometry
(:mod:`.kv`). The lowest layer: it imports nothing else of chatphase but :mod:`chatphase.errors` and
:mod:`chatphase.units`."""
