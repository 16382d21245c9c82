"""The conversation of a chat: its messages, oldest first, and how its turns are numbered.

Only user and assistant messages are kept; the system prompt is the settings', added to each turn's
request (:meth:`Conversation.request_messages`). Numbers count the turns begun in this chat from 1 (a
turn refused before its prefill started gives its number back; one that failed after it keeps it, as the
session records it; a new chat starts again at 1; a resumed session goes on from its own numbers). These
numbers are the session's turn indices too (:class:`~chatphase.chat.recording.SessionRecording` records
each turn under its number): one numbering, owned here.
"""

from __future__ import annotations

from chatphase.engine.events import Message, Role


class Conversation:
    """``messages`` (user/assistant) and the number of the newest turn (``numbered``)."""

    def __init__(self) -> None:
        self.messages: list[Message] = []
        self.numbered = 0
        self.left_out = 0  # the oldest messages the model no longer sees (an overflow dropped or shifted them)

    def request_messages(self, system_prompt: str | None) -> tuple[Message, ...]:
        """What a turn sends: the system prompt (if any), then every message."""
        system = [Message("system", system_prompt)] if system_prompt else []
        return tuple(system + self.messages)

    def user_messages(self) -> list[str]:
        return [m.content for m in self.messages if m.role == "user"]

    @property
    def last_reply(self) -> str:
        """The newest assistant message's answer ("" when there is none)."""
        return next((m.content for m in reversed(self.messages) if m.role == "assistant"), "")

    @property
    def last_thinking(self) -> str:
        """The newest assistant message's thinking ("" when there is none)."""
        return next((m.reasoning for m in reversed(self.messages) if m.role == "assistant"), "")

    def add(self, role: Role, content: str, reasoning: str = "") -> None:
        """Append a message (``reasoning``: an assistant message's thinking, sent back where the
        model's template takes it)."""
        self.messages.append(Message(role, content, reasoning))

    def take_back_reply(self) -> Message | None:
        """Remove and return the last message if it is a reply (regenerate), else ``None``."""
        if self.messages and self.messages[-1].role == "assistant":
            return self.messages.pop()
        return None

    def take_back_exchange(self) -> tuple[Message, ...]:
        """Remove and return the last user message and what follows it (edit), oldest first."""
        users = [i for i, m in enumerate(self.messages) if m.role == "user"]
        if not users:
            return ()
        removed = tuple(self.messages[users[-1] :])
        del self.messages[users[-1] :]
        return removed

    def drop_unanswered(self, give_back_number: bool) -> None:
        """Remove a trailing user message (its turn produced no reply); ``give_back_number``: the turn was
        refused before it began (nothing recorded it), so the next turn takes its number."""
        if self.messages and self.messages[-1].role == "user":
            self.messages.pop()
        if give_back_number:
            self.numbered -= 1

    def next_number(self) -> int:
        self.numbered += 1
        return self.numbered

    def clear(self) -> None:
        self.messages.clear()
        self.numbered = self.left_out = 0

    def restore(self, messages: list[Message], numbered: int) -> None:
        self.messages[:] = [m for m in messages if m.role != "system"]
        self.numbered, self.left_out = numbered, 0
