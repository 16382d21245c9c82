"""The chat controller: the conversation, the engine's life and the turn, in plain Python (no Textual).

:class:`~chatphase.chat.controller.ChatController` owns them; its listeners
(:class:`~chatphase.chat.listener.ChatListener`: the TUI's view, the session recording, ``ask``'s printer)
are told what happened; a :class:`~chatphase.chat.dispatch.Dispatcher` runs the engine's blocking calls
where the host wants them (Textual thread workers, or inline for ``ask`` and the tests).
"""
