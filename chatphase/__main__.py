"""`python -m chatphase` entry point."""

from chatphase.cli import main

raise SystemExit(main())
