"""`python -m vrun <verb>`: see vrun/runs/cli.py."""
import sys

from vrun.core import text, writer
from vrun.runs.cli import main

text.install()    # a terminal gets text: no control or escape sequence from a run's files or a job's output
writer.install()  # masked first, on the raw text

sys.exit(main())
