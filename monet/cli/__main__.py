"""``python -m monet.cli ...``: the same as the ``monet`` console script."""
import sys

from monet.cli import main

sys.exit(main())
