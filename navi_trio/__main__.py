"""``python -m navi_trio`` is the ``navi`` command."""

import sys

from navi_trio.cli import main

if __name__ == "__main__":
    sys.exit(main())
