"""Every knob has its range, derived from its reader: verl's pre-deadline window (trainer.esi_redundant_time against
the plan's step band and time limit), the time limit, ports and Ray addresses (IPv6 legal), the integer knobs."""
import pytest

from conftest import compose, plan, problems_of

pytestmark = pytest.mark.stack_free  # one CI leg: see pyproject.toml

SLURM = ["model=qwen3_5_35b", "mode=plan", "cluster=slurm", "verl.trainer.use_v1=false"]


def _esi(r, band=(20.0, 80.0), time_min=240, save=585.0, needed=525):
    from vrun.checks.values import esi_problems

    return esi_problems(r, time_min, 120, band, save, needed)


def test_esi_window_follows_verls_rule():
    """verl saves when the deadline is within 60 + longest step + r, then at every step after."""
    assert not _esi(525) and not _esi(600)                    # the plan's figure and a little more: quiet
    assert [p.warning for p in _esi(-100)] == [False]          # window shorter than a step: refused
    assert [p.warning for p in _esi(-60)] == [True]            # a window of exactly one step: saves, too late
    assert [p.warning for p in _esi(100)] == [True]            # under the save's own seconds
    assert [p.warning for p in _esi(14_160)] == [False]        # 60 + r = the usable 240 min − 120 s − 60 s
    assert [p.warning for p in _esi(14_159)] == [True]         # a window of many steps: each saves
    assert _esi(3000)[0].why.count("6 steps"), _esi(3000)[0].why
    assert not _esi(float("nan")) and not _esi(True)           # the type check's, not this one's


@pytest.mark.parametrize("r,kind", [(-100, "error"), (100_000_000, "error"), (5, "warning"), (3000, "warning")])
def test_esi_out_of_range_through_the_plan(r, kind):
    args = SLURM + [f"verl.trainer.esi_redundant_time={r}"]
    errors = problems_of(args)
    if kind == "error":
        assert errors and errors[0].startswith(f"error: verl.trainer.esi_redundant_time={r}: "), errors
        assert "verl.trainer.esi_redundant_time=525" not in f"={r}"
        return
    assert not errors, errors
    warned = [w.line() for w in plan(args).warnings if w.key == "verl.trainer.esi_redundant_time"]
    assert warned and warned[0].startswith("warning: "), warned


def test_esi_left_unset_is_the_plans_and_elsewhere_unread():
    p = plan(SLURM)
    assert not [w for w in p.warnings if w.key == "verl.trainer.esi_redundant_time"]
    local = plan(["model=qwen3_5_35b", "mode=plan", "verl.trainer.esi_redundant_time=30"])
    assert [w.line() for w in local.warnings if w.key == "verl.trainer.esi_redundant_time"][0].startswith(
        "warning: verl.trainer.esi_redundant_time=30: verl's pre-deadline save")


def _values(overrides):
    from vrun.checks import values
    from vrun.config import schema

    return [p.line() for p in values.run_config(schema.typed(compose(["model=qwen3_5_35b", "mode=plan", *overrides])))]


def _errors(overrides):
    return [x for x in _values(overrides) if x.startswith("error: ")]


@pytest.mark.parametrize("overrides,key", [
    (["cluster=slurm", "cluster.time_min=1000000000000"], "cluster.time_min"),
    (["cluster=kuberay", "cluster.time_min=525601"], "cluster.time_min"),
    (["cluster.master_port=0"], "cluster.master_port"),
    (["cluster.master_port=65536"], "cluster.master_port"),
    (["cluster.ray.address=head:0"], "cluster.ray.address"),
    (["cluster.ray.address=head:70000"], "cluster.ray.address"),
    (["cluster.ray.address='[::g]:6379'"], "cluster.ray.address"),
    (["cluster.ray.address=-head:6379"], "cluster.ray.address"),
    (["cluster=ray", "cluster.ray.address=http://head:0"], "cluster.ray.address"),
    (["cluster=ray", "cluster.ray.address=ftp://head:8265"], "cluster.ray.address"),
    (["cluster=ray", "cluster.ray.dashboard_timeout_s=0"], "cluster.ray.dashboard_timeout_s"),
    (["cluster=slurm", "cluster.ray.join_timeout_s=14400"], "cluster.ray.join_timeout_s"),
    (["cluster=slurm", "cluster.cpus_per_task=2147483648"], "cluster.cpus_per_task"),
    (["cluster=slurm", "cluster.max_requeues=-1"], "cluster.max_requeues"),
    (["cluster=slurm", "cluster.ray.auth_mode=tokn"], "cluster.ray.auth_mode"),
    (["cluster=slurm", "cluster.ray.interface=-x"], "cluster.ray.interface"),
    (["cluster=slurm", "cluster.ray.interface=averyveryverylongname"], "cluster.ray.interface"),
], ids=lambda x: " ".join(x) if isinstance(x, list) else x)
def test_out_of_range_knobs_are_refused(overrides, key):
    errors = _errors(overrides)
    assert errors and errors[0].startswith(f"error: {key}="), errors


@pytest.mark.parametrize("overrides", [
    ["cluster=ray", "cluster.ray.address='http://[::1]:8265'"],
    ["cluster=ray", "cluster.ray.address='https://[fe80::1%eth0]:8265/'"],
    ["cluster=ray", "cluster.ray.address=http://ray-head.example.org:8265"],
    ["cluster.ray.address='[::1]:6379'"],
    ["cluster.ray.address='ray://[2001:db8::5]:10001'"],
    ["cluster.ray.address=10.0.0.1:6379"],
    ["cluster=slurm", "cluster.time_min=525600"],
    ["cluster.master_port=65535", "algo=sft", "mesh=8gpu"],
    ["cluster=slurm", "cluster.ray.join_timeout_s=14399"],
    ["cluster=slurm", "cluster.ray.auth_mode=token", "cluster.ray.interface=ib0.8001"],
], ids=lambda o: " ".join(o))
def test_legal_values_beside_them_plan(overrides):
    assert not _errors(overrides), _errors(overrides)


@pytest.mark.parametrize("overrides,port", [
    (["cluster=ray", "cluster.ray.address=http://head:6379"], "6379"),
    (["cluster=ray", "cluster.ray.address=http://head:10001"], "10001"),
    (["cluster.ray.address=head:8265"], "8265"),
])
def test_a_ray_port_in_the_other_knobs_place_is_warned(overrides, port):
    lines = _values(overrides)
    assert [x for x in lines if x.startswith("warning: cluster.ray.address=") and f"port {port}" in x], lines
    assert not _errors(overrides)


def _int_knobs():
    from vrun.checks.values import INT_KNOBS
    from vrun.config.schema import Cluster

    return [(key, low, high) for key, _, low, high in INT_KNOBS(Cluster())]


@pytest.mark.parametrize("key,low,high", _int_knobs(), ids=lambda x: str(x))
def test_every_integer_knob_at_and_past_its_bounds(key, low, high):
    """Generated from the checks' own table (values.INT_KNOBS): each bound is legal, one past it refused, and so is
    a boolean (an int to Python, not a count)."""
    import copy

    from vrun.checks import values
    from vrun.config import schema

    base = schema.typed(compose(["model=qwen3_5_35b", "mode=plan", "cluster=slurm", "cluster.time_min=525600"]))

    def errors(v):
        cfg = copy.deepcopy(base)
        obj, name = cfg, key.split(".")
        for part in name[:-1]:
            obj = getattr(obj, part)
        setattr(obj, name[-1], v)
        return [p for p in values.run_problems(cfg) if p.key == key and not p.warning]

    edge_ok = {"cluster.ray.num_gpus": 1, "cluster.ray.join_timeout_s": min(high, 525600 * 60 - 1),
               "cluster.signal_delay_s": min(high, values.timelimit.max_signal_delay_s(525600))}
    for v in (low if low else 1, edge_ok.get(key, high)):
        assert not errors(v), (key, v, errors(v))
    for v in (low - 1, high + 1, True):
        assert errors(v), (key, v)
