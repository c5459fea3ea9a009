"""What the plan needs of each node, checked before Ray starts (vrun.launch.nodecheck): every verdict from its facts
(GPU count, model and leftover processes; a dir not writable; the files each node sees; the clock), node 0's
judgement over every node's report, the requeue count, and this machine's own facts taken for real (token files
written, read back and seen on a real filesystem; the environment's visible devices)."""
import json
import os
import threading
import time

import pytest

from vrun.launch import nodecheck
from vrun.launch.nodecheck import Failure, Gpu, Need, need_of
from vrun.launch.slurm.nodegate import requeues_in_a_row

pytestmark = pytest.mark.stack_free  # one CI leg: see pyproject.toml

NEED = Need(4, "H100", (("run dir", "/shared/run"), ("checkpoint dir", "/shared/run/checkpoints")))


def h100(i, procs=()):
    return Gpu(str(i), f"GPU-{i:04d}", "NVIDIA H100 80GB HBM3", 0, tuple(procs))


def test_visible_devices_as_cuda_reads_them():
    assert nodecheck.visible({}) is None
    assert nodecheck.visible({"CUDA_VISIBLE_DEVICES": ""}) == []
    assert nodecheck.visible({"CUDA_VISIBLE_DEVICES": "-1"}) == []
    assert nodecheck.visible({"CUDA_VISIBLE_DEVICES": "0,1,2,3"}) == ["0", "1", "2", "3"]
    assert nodecheck.visible({"CUDA_VISIBLE_DEVICES": "0,1,-1,3"}) == ["0", "1"]  # CUDA stops at the invalid one
    assert nodecheck.visible({"CUDA_VISIBLE_DEVICES": "GPU-aa, GPU-bb"}) == ["GPU-aa", "GPU-bb"]


def test_nvidia_smi_csv_parsed():
    gpus = nodecheck.parse_smi("0, GPU-a, NVIDIA H100 80GB HBM3, 3\n1, GPU-b, NVIDIA H100 80GB HBM3, 70001\nbad\n",
                               "GPU-b, 4242, 70000\nGPU-b, x, 1\n")
    assert [g.index for g in gpus] == ["0", "1"] and gpus[0].procs == () and gpus[1].procs == ((4242, 70000),)
    assert gpus[1].used_mib == 70001


def test_gpu_count_from_cuda_visible_devices():
    assert nodecheck.gpu_failures("n1", NEED, ["0", "1", "2", "3"], None) == []
    [f] = nodecheck.gpu_failures("n1", NEED, ["0", "1", "2"], None)
    assert f.check == "gpus" and "3 visible GPU(s) (CUDA_VISIBLE_DEVICES=0,1,2), the plan needs 4 per node" in f.numbers
    line = f.line()
    assert line.startswith("node n1: gpus: ") and "fix: drain it (scontrol update nodename=n1 state=drain" in line
    [f] = nodecheck.gpu_failures("n1", NEED, [], None)
    assert "0 visible GPU(s) (CUDA_VISIBLE_DEVICES hides all)" in f.numbers


def test_no_device_facts_no_verdict():
    """Neither CUDA_VISIBLE_DEVICES nor nvidia-smi: nothing to count by (Ray is told the count)."""
    assert nodecheck.gpu_failures("n1", NEED, None, None) == []


def test_gpu_count_from_nvidia_smi_restricted_to_the_visible_ones():
    listed = [h100(i) for i in range(3)]  # one GPU fell off the bus: nvidia-smi lists 3
    [f] = nodecheck.gpu_failures("n2", NEED, None, listed)
    assert "3 visible GPU(s) (nvidia-smi lists 3)" in f.numbers
    [f] = nodecheck.gpu_failures("n2", NEED, ["0", "1", "2", "3"], listed)  # SLURM gave 4, the node has 3
    assert "3 visible GPU(s) (nvidia-smi lists 3, CUDA_VISIBLE_DEVICES=0,1,2,3)" in f.numbers
    assert nodecheck.gpu_failures("n2", NEED, ["GPU-0000", "1", "2", "3"], listed + [h100(3)]) == []


def test_gpu_model_against_the_plans_part():
    a100 = [Gpu(str(i), f"u{i}", "NVIDIA A100-SXM4-80GB") for i in range(4)]
    [f] = nodecheck.gpu_failures("n0", NEED, None, a100)
    assert f.check == "gpu model" and "nvidia-smi reports NVIDIA A100-SXM4-80GB on 4 GPU(s), the plan is for H100 " \
        "(cluster.gpu)" in f.numbers and "cluster.gpu=<this part>" in f.fix


def test_leftover_process_holding_a_gpu():
    listed = [h100(0), h100(1, [(777, 30000)]), h100(2), h100(3)]
    [f] = nodecheck.gpu_failures("n0", NEED, None, listed)
    assert f.check == "gpu busy" and "1 GPU(s) (GPU 1: pid 777 30000 MiB)" in f.numbers
    listed[2] = Gpu("2", "u2", "NVIDIA H100 80GB HBM3", 60000)  # held from a container nvidia-smi cannot see into
    [f] = nodecheck.gpu_failures("n0", NEED, None, listed)
    assert "another process holds 2 GPU(s) (GPU 1: pid 777 30000 MiB; GPU 2: 60000 MiB in use)" in f.numbers
    # a process on a GPU this job does not see is not this job's problem
    assert nodecheck.gpu_failures("n0", Need(2, "H100"), ["0", "3"], listed) == []


def test_dir_failure_line():
    assert nodecheck.dir_failure("n1", "checkpoint dir", "/c", None) is None
    f = nodecheck.dir_failure("n1", "checkpoint dir", "/c", "PermissionError: Permission denied")
    assert f.line().startswith("node n1: checkpoint dir: /c: PermissionError: Permission denied; fix: mount it")


def test_shared_files_majority_names_the_odd_node():
    all3 = frozenset({"n0", "n1", "n2"})
    assert nodecheck.shared_failures("run dir", "/r", {"n0": all3, "n1": all3, "n2": all3}, 30) == []
    seen = {"n0": frozenset({"n0", "n2"}), "n1": frozenset({"n1"}), "n2": frozenset({"n0", "n2"})}
    [f] = nodecheck.shared_failures("checkpoint dir", "/c", seen, 30)
    assert f.host == "n1" and "after 30 s this node sees the files of 0 of the 2 other node(s) (not n0,n2)" in f.numbers


def test_shared_files_tie_names_every_node():
    seen = {"n0": frozenset({"n0"}), "n1": frozenset({"n1"})}
    fs = nodecheck.shared_failures("checkpoint dir", "/c", seen, 30)
    assert [f.host for f in fs] == ["n0", "n1"] and all("no majority" in f.numbers for f in fs)
    assert nodecheck.shared_failures("checkpoint dir", "/c", {"n0": frozenset({"n0"})}, 30) == []


def test_clock_skew_against_node_0():
    assert nodecheck.clock_failures({"n0": 0.1, "n1": 0.2}, "n0", 5) == []
    [f] = nodecheck.clock_failures({"n0": 0.1, "n1": -7.9, "n2": 4.0}, "n0", 5)
    assert f.host == "n1" and f.numbers == "-8.0 s against node 0 (n0), beyond 5 s" and "chronyc" in f.fix
    assert nodecheck.clock_failures({"n1": 100.0}, "n0", 5) == []  # node 0 gave none: nothing to compare with


def report(failures=(), seen=None, offset=0.0):
    return {"failures": [vars(f) for f in failures], "seen": seen or {}, "offset": offset}


def test_judge_collects_every_nodes_verdict():
    hosts = ["n0", "n1", "n2"]
    both = {"run dir": hosts, "checkpoint dir": hosts}
    reports = {h: report(seen=both) for h in hosts}
    assert nodecheck.judge(hosts, reports, NEED).ok
    bad_gpu = Failure("n1", "gpus", "3 visible GPU(s)", "drain it")
    reports["n1"] = report([bad_gpu], seen=both)
    reports["n2"] = report(seen=both, offset=9.0)
    v = nodecheck.judge(hosts, reports, NEED)
    assert v.bad == ["n1", "n2"] and not v.everyone
    assert v.line() == "node check: node n1: gpus: 3 visible GPU(s); fix: drain it | " + \
        nodecheck.clock_failures({"n0": 0.0, "n2": 9.0}, "n0", 5)[0].line()


def test_judge_the_nodes_that_reported_and_everyone_failing():
    hosts = ["n0", "n1"]
    f = lambda h: Failure(h, "checkpoint dir", "/c: no such dir", "mount it")  # noqa: E731
    v = nodecheck.judge(["n0"], {"n0": report(), "n1": report([f("n1")])}, NEED)  # n1 came too late: not judged
    assert v.ok and not v.everyone
    v = nodecheck.judge(hosts, {h: report([f(h)]) for h in hosts}, NEED)
    assert v.everyone and v.bad == hosts
    assert v.line().count("node n") == 2


def test_judge_one_line_counts_more_failures_of_a_node():
    many = [Failure("n1", c, "x", "y") for c in ("gpus", "gpu model", "gpu busy")]
    v = nodecheck.judge(["n0", "n1"], {"n0": report(), "n1": report(many)}, NEED)
    assert v.line().endswith("(+2 more, in the run dir's events)") and v.line().count("node n1") == 1


def test_requeues_in_a_row_end_with_an_attempt_that_got_past_its_check():
    ev = lambda e, **k: {"event": e, **k}  # noqa: E731
    assert requeues_in_a_row([]) == 0
    row = [ev("node_check", action="requeued"), ev("started"), ev("node_check", action="requeued")]
    assert requeues_in_a_row(row) == 2
    assert requeues_in_a_row(row + [ev("ray_up")]) == 0
    assert requeues_in_a_row([ev("node_check", action="requeued"), ev("entrypoint_started"),
                              ev("node_check", action="failed")]) == 0


def test_need_and_its_clause():
    n = need_of(8, "H200", "/r", "/r/checkpoints")
    assert n.dirs == (("run dir", "/r"), ("checkpoint dir", "/r/checkpoints"))
    assert need_of(8, "H200", "/r", "/r/").dirs == (("run dir", "/r"),)
    text = n.describe()
    assert "8 H200 GPU(s) visible and free" in text and "run dir and checkpoint dir writable" in text
    assert f"clock within {nodecheck.MAX_SKEW_S:g} s of node 0" in text and "cluster.max_requeues" in text


# ---------------------------------------------------------------- this machine's facts, for real
def test_probe_a_writable_dir_and_its_clock(tmp_path):
    error, offset = nodecheck.probe_dir(str(tmp_path), "job-1-0", "n0", json.dumps({"host": "n0"}))
    assert error is None and abs(offset) < 5  # the storage here is this machine's own clock
    assert (tmp_path / nodecheck.TOKENS / "job-1-0" / "n0").read_text() == '{"host": "n0"}'


def test_probe_a_dir_that_is_a_file_or_a_dangling_link(tmp_path):
    (tmp_path / "file").write_text("x")
    error, offset = nodecheck.probe_dir(str(tmp_path / "file"), "t", "n0", "{}")
    assert error and offset is None and "NotADirectoryError" in error or "FileExistsError" in error
    (tmp_path / "ckpt").symlink_to("/nonexistent/mount/ckpt")
    error, _ = nodecheck.probe_dir(str(tmp_path / "ckpt"), "t", "n0", "{}")
    assert error == "a link to /nonexistent/mount/ckpt, which is missing on this node"


def test_a_dir_not_made_yet_is_probed_where_it_will_be_made(tmp_path):
    error, _ = nodecheck.probe_dir(str(tmp_path / "checkpoints"), "t", "n0", "{}")
    assert error is None and not (tmp_path / "checkpoints").exists()
    assert (tmp_path / nodecheck.TOKENS / "t" / "n0").is_file()
    nodecheck.clean([("checkpoint dir", str(tmp_path / "checkpoints"))], "t")
    assert not (tmp_path / nodecheck.TOKENS).exists()


def test_tokens_seen_waits_for_the_others_within_its_bound(tmp_path):
    d = tmp_path / nodecheck.TOKENS / "t"
    d.mkdir(parents=True)
    (d / "n0").write_text("{}")
    late = threading.Timer(1.0, lambda: (d / "n1").write_text("{}"))
    late.start()
    try:
        assert nodecheck.tokens_seen(str(tmp_path), "t", ["n0", "n1"], 60) == {"n0", "n1"}
    finally:
        late.cancel()
    t0 = time.monotonic()
    assert nodecheck.tokens_seen(str(tmp_path), "t", ["n0", "n1", "n2"], 1.0) == {"n0", "n1"}
    assert time.monotonic() - t0 < 30
    # n2 is done (its report published) without a token: not waited for
    t0 = time.monotonic()
    assert nodecheck.tokens_seen(str(tmp_path), "t", ["n0", "n1", "n2"], 600, settled=lambda: {"n2"}) == {"n0", "n1"}
    assert time.monotonic() - t0 < 300


def test_report_of_this_machine(tmp_path):
    """The node's own report: the devices its environment shows, its tokens written and seen, its clock."""
    need = need_of(4, "H100", str(tmp_path), str(tmp_path / "checkpoints"))
    (tmp_path / "checkpoints").mkdir()
    r = nodecheck.report("me", need, {"CUDA_VISIBLE_DEVICES": "0,1"}, "t", ["me"])
    if nodecheck.smi() is None:  # no nvidia-smi here: the environment decides the count
        assert [f["check"] for f in r["failures"]] == ["gpus"] and "CUDA_VISIBLE_DEVICES=0,1" in \
            r["failures"][0]["numbers"]
    assert r["seen"] == {"run dir": ["me"], "checkpoint dir": ["me"]} and isinstance(r["offset"], float)
    json.dumps(r)  # published as JSON in the control dir
    (tmp_path / "bad").symlink_to(tmp_path / "absent")
    need = need_of(0, "H100", str(tmp_path), str(tmp_path / "bad"))
    r = nodecheck.report("me", need, {}, "t2", ["me"])
    assert [f["check"] for f in r["failures"]] == ["checkpoint dir"] and "checkpoint dir" not in r["seen"]


def test_here_cleans_its_tokens(tmp_path, monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    need = need_of(0, "H100", str(tmp_path), str(tmp_path / "checkpoints"))
    assert nodecheck.here(need) == [] or nodecheck.smi() is not None
    assert os.listdir(tmp_path) == []


def test_probe_a_dir_that_is_a_link_to_its_storage(tmp_path):
    """A checkpoint dir linked to the storage that holds it (a mount elsewhere) is written through its link."""
    (tmp_path / "store").mkdir()
    (tmp_path / "ckpt").symlink_to(tmp_path / "store")
    error, _ = nodecheck.probe_dir(str(tmp_path / "ckpt"), "t", "n0", "{}")
    assert error is None and (tmp_path / "store" / nodecheck.TOKENS / "t" / "n0").is_file()
    assert nodecheck.tokens_seen(str(tmp_path / "ckpt"), "t", ["n0"], 0) == {"n0"}
