"""`python -m vrun <verb>`: see vrun/runs/cli.py."""
import sys

from vrun.runs.cli import main

sys.exit(main())
