"""Old path of :mod:`chatphase.bench.core.prompts`, kept for ``commands/whatif.py`` and ``benchmarks/`` until they import the new one."""

from chatphase.bench.core.prompts import EngineTokenizer, PromptBuilder

__all__ = ["EngineTokenizer", "PromptBuilder"]
