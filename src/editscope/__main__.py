"""``python -m editscope``: the same CLI as the ``editscope`` command (for machines where it is not on PATH)."""

import sys

from editscope.cli import main

if __name__ == "__main__":  # importing the module (a walk over the package) runs nothing
    sys.exit(main())
