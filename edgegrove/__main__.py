"""`python -m edgegrove`: the same as the `edgegrove` command."""

import sys

from edgegrove.cli import main

sys.exit(main())
