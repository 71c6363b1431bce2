"""``python -m seqbalance`` runs the command line."""

import sys

from seqbalance.cli import main

sys.exit(main())
