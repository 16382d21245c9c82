"""What the TUI needs from Textual beyond its public API, in one place (:mod:`.textual_private`)."""
