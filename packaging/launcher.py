"""The frozen app's entry point: the window, the engine process (--engine-server) or pip (--pip)."""

import multiprocessing
import sys

from gui.app import main

if __name__ == "__main__":
    multiprocessing.freeze_support()
    sys.exit(main())
