"""``python -m editscope``: the same CLI as the ``editscope`` command (for machines where it is not on PATH)."""

import sys

from editscope.cli import main

sys.exit(main())
