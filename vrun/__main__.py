"""`python -m vrun <verb>`: see vrun/runs/cli.py."""
import sys

from vrun.core import writer
from vrun.runs.cli import main

writer.install()

sys.exit(main())
