"""`python -m chatphase` entry point."""

from chatphase.cli import main

if __name__ == "__main__":  # the engine's child process is spawned and re-imports the main module
    raise SystemExit(main())
