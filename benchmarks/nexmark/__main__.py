"""``python -m benchmarks.nexmark``: see benchmarks/nexmark/harness.py."""

import sys

from benchmarks.nexmark.harness import main

sys.exit(main())
