"""``python -m navi_trio`` is the ``navi`` command; `main` is its console script too.

The command's own modules are imported inside the start-up's fewer garbage collections
(navi_trio/imports.py), as the rest of its start-up: imported before them, they made
~80 young and ~6 middle collections of their own. The code attrs writes for their
classes comes from the last process's when it can (navi_trio/class_code.py), and trio
is imported without running ``ldconfig -p`` (`import_answering_pthread`).
"""

import sys

from navi_trio import class_code
from navi_trio.imports import import_answering_pthread, start_up_collections


def main() -> int:
    """The ``navi`` command, from the import of its modules to its exit code."""
    with start_up_collections():
        class_code.install()  # attrs' methods from the kept code (navi_trio/class_code.py)
        import_answering_pthread("trio")  # before anything imports it (navi_trio/imports.py)
        from navi_trio.cli import main as navi

        return navi()


if __name__ == "__main__":
    sys.exit(main())
