"""A stall's stack, given by the process itself where py-spy may not read it (Yama's ptrace_scope 2 or 3 without
CAP_SYS_PTRACE, or no py-spy on the node). The plan puts this directory first on the run's PYTHONPATH, so every
Python process of the run (the driver, Ray's workers, torchrun's ranks) imports it at start-up, as site.py imports
`sitecustomize`. It then:

- registers faulthandler for SIGURG, every thread, into a file of its own: `vrun-stack.<host>.<pid>` in $TMPDIR
  (else /tmp), unlinked as soon as it is open, so that it lives exactly as long as the process and is read through
  /proc/<pid>/fd by vrun.launch.stacks, which sends the signal only where /proc/<pid>/status shows it caught.
  SIGURG because nothing in Ray, torch (torchrun / elastic: TERM, INT, HUP, QUIT, USR1, USR2), submitit (USR2,
  TERM, CONT) or verl (ALRM, ABRT, KILL) handles it, and because its default action is to ignore it: a stray one
  never kills a process. Not chained: chaining makes faulthandler drop SA_RESTART, and a C++ call blocked in a
  socket read (gloo, NCCL's bootstrap) would then return EINTR; SIGURG has no earlier handler to chain to.
- does the same again in a forked child (its own file; a DataLoader worker is one);
- under Yama's ptrace_scope 1, names the node process ($VRUN_STACK_TRACER, set by vrun.launch.environment) as
  this process's ptracer, so that py-spy, a child of the node process and not an ancestor of the ranks, may read it;
- starts the flight-recorder listener (vrun_frdump, beside this file) where the run's environment names its dir:
  a rank asked on a stall writes its recorder's dump, even while it is blocked in a gloo collective;
- imports the next `sitecustomize` on sys.path (Megatron Lite's runtime patches every worker through one), as if
  this one were not there.

VRUN_STACKHOOK=0 turns it off. Standard library only, nothing of the project; nothing here raises.
"""
import os
import sys

SIGNAL_NAME = "SIGURG"
TRACER_ENV = "VRUN_STACK_TRACER"
PR_SET_PTRACER = 0x59616D61  # prctl option (linux/prctl.h), Yama's

_state = {"file": None}


def _open_own_file():
    """A file only this process writes, unlinked at once (it goes with the process)."""
    host = os.uname().nodename.replace("/", "_")
    pid = os.getpid()
    for d in (os.environ.get("TMPDIR"), "/tmp", "/dev/shm"):
        if not d:
            continue
        path = os.path.join(d, f"vrun-stack.{host}.{pid}")
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC | getattr(os, "O_NOFOLLOW", 0),
                         0o600)
        except OSError:
            continue
        try:
            os.unlink(path)
        except OSError:
            pass
        return os.fdopen(fd, "w", buffering=1)
    return None


def _register():
    try:
        import faulthandler
        import signal

        f = _open_own_file()
        if f is None:
            return
        faulthandler.register(getattr(signal, SIGNAL_NAME), file=f, all_threads=True, chain=False)
        old, _state["file"] = _state["file"], f  # faulthandler holds its own reference as well
        if old is not None:
            try:
                old.close()  # the parent's, inherited by a fork
            except OSError:
                pass
    except Exception:  # noqa: BLE001 - a process must start whatever happens here
        pass


def _name_ptracer():
    tracer = os.environ.get(TRACER_ENV, "")
    if not tracer.isdigit():
        return
    try:
        with open("/proc/sys/kernel/yama/ptrace_scope") as f:
            if f.read().strip() != "1":  # only scope 1 knows declared ptracers
                return
    except OSError:
        return  # no Yama
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PTRACER, int(tracer), 0, 0, 0)  # EINVAL without Yama or for a gone pid: nothing to do
    except Exception:  # noqa: BLE001
        pass


def _chain():
    """Import the next sitecustomize on sys.path, under its own name, as site.py would have."""
    import importlib.machinery
    import importlib.util

    here = os.path.dirname(os.path.abspath(__file__))
    rest, seen = [], False
    for p in sys.path:
        try:
            same = os.path.abspath(p or os.getcwd()) == here
        except (OSError, ValueError):
            same = False
        if same:
            seen = True
            continue
        if seen:
            rest.append(p)
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest) if seen else None
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    sys.modules["sitecustomize"] = module
    spec.loader.exec_module(module)  # its errors are site.py's to report, as without this hook


if os.environ.get("VRUN_STACKHOOK", "1") != "0" and sys.platform.startswith("linux"):
    _register()
    try:
        os.register_at_fork(after_in_child=_register)
    except Exception:  # noqa: BLE001
        pass
    _name_ptracer()
    try:
        import vrun_frdump

        vrun_frdump.start()
    except Exception:  # noqa: BLE001
        pass
_chain()
