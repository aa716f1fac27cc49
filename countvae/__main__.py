"""``python -m countvae`` runs the command line."""

import sys

from countvae.cli import main

sys.exit(main())
