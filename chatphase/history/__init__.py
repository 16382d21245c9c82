"""The turn history: every recorded turn of every session in one SQLite database (``history.db``), an index
kept beside the session files (which stay the durable record, :mod:`chatphase.sessions.store`).

- :mod:`~chatphase.history.db` — the schema, its migrations (``PRAGMA user_version``) and the connection.
- :mod:`~chatphase.history.context` — what a turn ran on: the model's identity, the engine settings, the
  backend, the machine, chatphase's version (the ``context`` record the session writer keeps).
- :mod:`~chatphase.history.index` — session files into rows: the catch-up and the live updater.
- :mod:`~chatphase.history.query` — ``chatphase logs`` and ``chatphase stats``: filters, rows, medians, fits.

docs/history.md describes the schema.
"""
