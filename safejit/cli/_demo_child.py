"""The demo's fresh process: ``python -m safejit.cli._demo_child NONCE [CACHE_DIR]``
(its own module, so that it is no command of the CLI's)."""

from __future__ import annotations

import sys

from .demo import demo_child

if __name__ == "__main__":
    demo_child(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else None)
