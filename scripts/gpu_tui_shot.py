"""Two chat turns in the TUI, headless, on a model with every layer offloaded; saves the screen as SVG.

Run: ``python3 scripts/gpu_tui_shot.py MODEL OUT.svg [N_GPU_LAYERS]`` (MODEL ``""``: the default model) (used by ``scripts/gpu_device_check.sh``
to see the dashboard on a real GPU; the engine is the TUI's own, an EngineHost child process).
Exits 1 with one line when a turn does not end within the time limit.
"""

from __future__ import annotations

import asyncio
import sys
import time

from chatphase.commands.server_options import model_info_for
from chatphase.engine.process.host import EngineHost
from chatphase.settings.schema import Settings
from chatphase.ui.app import ChatPhaseApp
from chatphase.ui.prompt_input import PromptInput

TIMEOUT_S = 180
PROMPTS = ("Explain what a KV cache holds, in three sentences.", "And why does decode read it every step?")


async def main(model: str, out: str, n_gpu_layers: int) -> int:
    settings = Settings().with_overrides(model=model or None, n_ctx=8192, n_gpu_layers=n_gpu_layers, temperature=0.0,
                                         seed=0, max_tokens=48)  # fmt: skip
    info = model_info_for(settings, warn=lambda line: print(line, file=sys.stderr))
    app = ChatPhaseApp(settings, info, lambda model_info, current: EngineHost(model_info, current.engine),
                       save_sessions=False)  # fmt: skip

    def idle() -> bool:
        return app.chat.loaded is not None and not app.chat.busy and app.chat.active_turn is None

    async with app.run_test(size=(150, 45)) as pilot:
        app.prompt.cursor_blink = False

        async def until(condition, what: str) -> None:
            deadline = time.monotonic() + TIMEOUT_S
            while not condition():
                if time.monotonic() > deadline:
                    raise SystemExit(f"gpu_tui_shot: {what} did not happen within {TIMEOUT_S} s")
                await pilot.pause(0.05)

        await until(idle, "the model load")
        for n, text in enumerate(PROMPTS, 1):
            app.query_one(PromptInput).set_text(text)
            await pilot.press("enter")
            await until(lambda n=n: len(app.chat.conversation) == 2 * n and idle(), f"turn {n}")
        await pilot.pause(0.5)
        app.save_screenshot(out)
        await pilot.press("ctrl+q")
    return 0


if __name__ == "__main__":
    args = sys.argv[1:]
    raise SystemExit(asyncio.run(main(args[0], args[1], int(args[2]) if len(args) > 2 else -1)))
