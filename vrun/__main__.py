"""`python -m vrun <verb>`: see vrun/runs/cli.py."""
import sys

from vrun import writer
from vrun.runs.cli import main

writer.install()

sys.exit(main())
