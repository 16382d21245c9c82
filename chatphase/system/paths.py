"""Where chatphase keeps what it can rebuild: the user cache directory.

``$CHATPHASE_CACHE_DIR`` when set (tests and benchmarks point it at a temporary folder), else the platform's
user cache directory for ``chatphase`` (platformdirs: ``~/.cache/chatphase`` on Linux). Holds the AMX probe's
verdict, the prefix store and the remote slot index; nothing in it is needed to read a session.
"""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    """The user cache directory (not created here)."""
    import platformdirs

    return Path(os.environ.get("CHATPHASE_CACHE_DIR") or platformdirs.user_cache_dir("chatphase"))
