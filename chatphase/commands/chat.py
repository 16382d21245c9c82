"""``chatphase chat`` (the default command): the Textual chat TUI on a local GGUF model.

The model is resolved and validated (GGUF header, sizes) *before* the TUI starts, so a bad model is
one line on stderr and exit code 2, never a half-drawn screen (with ``--server URL`` the same TUI measures
a model on an OpenAI-compatible server instead: :mod:`chatphase.engine.remote.engine`; a bad URL is one line too). The TUI then runs the model in an
:class:`~chatphase.engine.process.host.EngineHost` child process (a native crash cannot take the UI down).
Textual is imported only here, inside :func:`run`, so the other commands never load it.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from chatphase.commands.options import add_model_options, add_sampling_options, add_setting_flags, settings_from_args
from chatphase.commands.server_options import add_server_options, engine_for, model_info_for
from chatphase.errors import ChatPhaseError
from chatphase.settings.schema import Settings


def register(sub) -> None:
    """Add the ``chat`` subcommand to ``sub`` (an argparse subparsers object)."""
    p = sub.add_parser(
        "chat",
        help="chat in the terminal UI (default)",
        description="Chat with a local GGUF model and watch prefill and decode happen.",
    )
    add_model_options(p)
    add_sampling_options(p)
    add_server_options(p)
    add_setting_flags(p, "chat")  # --theme
    p.add_argument(
        "--resume",
        nargs="?",
        const="last",
        metavar="ID",
        help="reopen a saved session (default: the last one) with its history; see `chatphase sessions`",
    )
    p.add_argument("--no-save", action="store_true", help="do not save this conversation as a session")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Validate the model, then run the TUI until the user quits; returns the exit code: 0, or 1 when the
    TUI ended on an unhandled exception (Textual has printed it and set ``App.return_code``) or the session
    could not be saved in full (disk full: one line on stderr).

    Raises:
        UsageError: bad settings (exit 2). ModelError: a model that cannot be used (exit 2).
        SessionError: ``--resume`` names no saved session (exit 1).
    """
    from chatphase.settings.file import load_config

    config = load_config()  # its problems are shown in the TUI
    settings = settings_from_args(args, base=config.settings)
    resume = None
    notices: list[str] = []
    if args.resume:  # an unknown session is one line and exit 1, before the TUI starts
        from chatphase.sessions.catalog import load_session

        resume = load_session(args.resume)
        recorded = resume.model.get("path")
        if not args.model and recorded and Path(recorded).is_file():
            settings = settings.with_overrides(model=recorded)  # continue on the session's model
        settings, note = resumed_n_ctx(settings, resume.settings, args.n_ctx)
        notices += [note] if note else []
    warnings: list[str] = []
    info = model_info_for(settings, pull=args.pull, warn=warnings.append)
    # --server: a RemoteEngine on that server (chatphase.engine.factory), else EngineHost on the local GGUF.
    # The first engine starts now, so that the child imports llama.cpp and loads the model while the UI
    # imports Textual and draws; the app's first start_engine() takes it over.
    first = [engine_for(settings, info)]
    getattr(first[0], "start", lambda: None)()

    def engines(model_info, current):
        return first.pop() if first and model_info is info else engine_for(current, model_info)

    from chatphase.ui.app import ChatPhaseApp
    from chatphase.ui.signals import EXIT_GRACE_S

    app = ChatPhaseApp(
        settings,
        info,
        engines,
        save_sessions=not args.no_save,
        startup_notices=(*config.problems, *warnings, *notices, *getattr(args, "input_notices", ())),
        resume=resume,
        exit_grace_s=EXIT_GRACE_S,
    )
    try:
        app.run()  # returns normally after a crash too, so its return code must be passed on
    finally:
        if app.exit_timer is not None:  # the terminal is put back: no need to end the process early
            app.exit_timer.cancel()
    if app.return_code:
        return app.return_code
    if app.recording.failed:  # the TUI said so when it happened; the terminal is back: say it once more
        print(f"chatphase: the session was not saved in full ({app.recording.failed})", file=sys.stderr)
        return 1
    return 0


def resumed_n_ctx(settings: Settings, recorded: dict, flag: int | None) -> tuple[Settings, str | None]:
    """The n_ctx a resumed chat runs at: the session's own (``recorded``: its settings dict), unless the
    user gave ``--n-ctx`` (``flag``); returns the settings and the line that says which (``None`` when the
    session recorded none)."""
    was = recorded.get("n_ctx")
    if not isinstance(was, int) or isinstance(was, bool):
        return settings, None
    if flag is not None:
        if flag == was:
            return settings, f"Resumed at n_ctx {was:,}, the session's."
        return settings, f"Resumed at n_ctx {flag:,} from --n-ctx; the session ran at {was:,}."
    try:
        return settings.with_overrides(n_ctx=was).validate(), f"Resumed at n_ctx {was:,}, the session's."
    except ChatPhaseError:  # out of today's range: keep the configured one, and say so
        now = "auto" if settings.engine.n_ctx is None else f"{settings.engine.n_ctx:,}"
        return settings, f"Resumed at n_ctx {now}; the session's {was:,} is not valid now."
