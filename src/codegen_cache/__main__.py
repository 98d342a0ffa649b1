"""`python -m codegen_cache`: the codegen-cache command."""

import sys

from ._cli import main

sys.exit(main())
