"""The names other modules imported from here before the checks were split by concern: re-exported, nothing
defined. The checks live in vrun/check_secrets.py (secrets), vrun/check_paths.py (names, run dirs),
vrun/check_sbatch.py (sbatch values), vrun/check_values.py (verl values and types, run config ranges) and
vrun/check_composed.py (the composed config, and the callback before Hydra creates the run dir)."""
from vrun.check_composed import before_run_dir as check_single_run  # noqa: F401
from vrun.check_composed import config_problems  # noqa: F401
from vrun.check_paths import NAME_KEYS, SAFE_NAME, group_of, new_ancestors, remove_if_empty  # noqa: F401
from vrun.check_paths import names as name_problems  # noqa: F401
from vrun.check_paths import run_dir as run_dir_problems  # noqa: F401
from vrun.check_sbatch import SBATCH_KEYS, SBATCH_OWNED  # noqa: F401
from vrun.check_secrets import DEFAULT_PASS_ENV, secret_names  # noqa: F401
from vrun.check_values import (arch_problems, length_problems, model_problems, range_problems,  # noqa: F401
                               run_problems)
from vrun.writer import mask as scrub  # noqa: F401
from vrun.writer import secret_values  # noqa: F401
