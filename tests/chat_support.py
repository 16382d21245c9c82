"""Helpers for the chat controller tests: a dispatcher the test steps by hand, and a listener that
writes down what it is told."""

from __future__ import annotations

from collections.abc import Iterator

from fake_engine import FakeEngine, fake_model_info

from chatphase.chat.controller import ChatController
from chatphase.chat.dispatch import EngineJob
from chatphase.chat.listener import ChatListener
from chatphase.engine.events import Event
from chatphase.settings.schema import Settings


class StepDispatcher:
    """Holds the jobs it is given; the test delivers their events one at a time (:meth:`step`) or all
    (:meth:`drain`). Watch jobs wait in :attr:`watches` until :meth:`run_watches`. ``spawn`` runs at once."""

    def __init__(self) -> None:
        self.jobs: list[tuple[EngineJob, Iterator[Event]]] = []
        self.watches: list[EngineJob] = []
        self.spawned = 0

    def start(self, job: EngineJob) -> None:
        if job.kind == "watch":
            self.watches.append(job)
        else:
            self.jobs.append((job, job.run()))

    def spawn(self, fn) -> None:
        self.spawned += 1
        fn()

    def step(self, n: int = 1) -> list[Event]:
        """Deliver the next ``n`` events of the oldest job (ending it when it runs out)."""
        out = []
        for _ in range(n):
            if not self.jobs:
                break
            job, events = self.jobs[0]
            event = next(events, None)
            if event is None:
                self.jobs.pop(0)
                job.end()
                continue
            out.append(event)
            job.deliver(event)
        return out

    def drain(self) -> None:
        """Run every held job to its end (jobs started meanwhile too)."""
        while self.jobs:
            self.step(10_000)

    def run_watches(self) -> None:
        """Run the watch jobs whose engines have died or closed (a live FakeEngine's watch would block)."""
        for job in list(self.watches):
            if job.engine.dead or job.engine.closed:
                self.watches.remove(job)
                for event in job.run():
                    job.deliver(event)
                job.end()


class Calls(ChatListener):
    """Every listener call as ``(method, args)``, in order."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, tuple]] = []

    def names(self) -> list[str]:
        """The method names called, with runs of the same one collapsed."""
        out: list[str] = []
        for name, _ in self.calls:
            if not out or out[-1] != name:
                out.append(name)
        return out

    def args_of(self, name: str) -> list[tuple]:
        return [args for n, args in self.calls if n == name]

    def notices(self) -> list:
        return [args[0] for args in self.args_of("notice")]


def _writes_down(name: str):
    def method(self, *args) -> None:
        self.calls.append((name, args))

    return method


for _name in [n for n in vars(ChatListener) if not n.startswith("_")]:
    setattr(Calls, _name, _writes_down(_name))


def make_chat(settings: Settings | None = None, dispatcher=None, **engine_kwargs):
    """A controller on FakeEngines (``engines``, newest last) with a :class:`Calls` listener."""
    settings = settings or Settings()
    engines: list[FakeEngine] = []
    first_only = engine_kwargs.pop("first_only", False)

    def factory(info, settings):
        engines.append(FakeEngine(info, settings.engine, **({} if first_only and engines else engine_kwargs)))
        return engines[-1]

    calls = Calls()
    chat = ChatController(settings, fake_model_info(), factory, dispatcher or StepDispatcher(), [calls])
    return chat, engines, calls
