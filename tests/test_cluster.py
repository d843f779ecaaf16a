import math

import pytest

from baechi_tf.cluster import Cluster, CommCost, Device, GiB, device_task
from baechi_tf.errors import ConfigError


def test_default_comm_is_the_seeds():
    c = Cluster.homogeneous(2, GiB)
    assert c.comm == CommCost(0.0001754, 134)
    assert c.transfer_us(0, 1, 1_000_000) == pytest.approx(0.0001754 * 1e6 + 134)
    assert c.transfer_us(1, 1, 1_000_000) == 0.0


def _two_tasks() -> Cluster:
    """Two GPUs on task 0, one on task 1; the links within a task are cheaper."""
    devices = [
        Device("/job:worker/replica:0/task:0/device:GPU:0", GiB),
        Device("/job:worker/replica:0/task:0/device:GPU:1", GiB),
        Device("/job:worker/replica:0/task:1/device:GPU:0", GiB),
    ]
    return Cluster(tuple(devices), CommCost(0.0001, 10), CommCost(0.001, 500))


def test_inter_task_link():
    c = _two_tasks()
    assert c.transfer_us(0, 1, 1000) == pytest.approx(10.1)
    assert c.transfer_us(0, 2, 1000) == pytest.approx(501)
    assert c.transfer_us(2, 1, 1000) == pytest.approx(501)


def test_find_accepts_tf_spellings():
    c = Cluster.homogeneous(2, GiB, prefix="/job:localhost/replica:0/task:0")
    assert c.find("/job:localhost/replica:0/task:0/device:GPU:1") == 1
    assert c.find("/device:GPU:1") == 1
    assert c.find("/gpu:1") == 1
    assert c.find("GPU:0") == 0
    assert c.find("/device:GPU:7") is None
    with pytest.raises(ConfigError, match="'/device:GPU:7' is not in the cluster; the devices are"):
        c.device_index("/device:GPU:7")


def test_find_takes_tf_local_names_in_a_cluster_without_tasks():
    # Graphs built in a tf.compat.v1 session pin ops to '/job:localhost/replica:0/task:0/...':
    # on a cluster named without tasks, that is the local device of the same local part.
    c = Cluster.homogeneous(2, GiB)
    assert c.find("/job:localhost/replica:0/task:0/device:GPU:1") == 1
    assert c.find("/job:localhost/replica:0/task:0/device:CPU:0") is None
    # Another task may be another machine: never taken for a local device.
    assert c.find("/job:worker/replica:0/task:1/device:GPU:1") is None
    tasks = Cluster.homogeneous(2, GiB, prefix="/job:worker/replica:0/task:0")
    assert tasks.find("/job:localhost/replica:0/task:0/device:GPU:1") is None


def test_device_task():
    assert device_task("/job:w/replica:0/task:3/device:GPU:0") == "/job:w/replica:0/task:3"
    assert device_task("/job:w/task:3/device:GPU:0") == "/job:w/replica:0/task:3"
    assert device_task("/device:GPU:0") == ""


@pytest.mark.parametrize(
    "make, match",
    [
        (lambda: Cluster(()), "no devices"),
        (lambda: Cluster((Device("/device:GPU:0", GiB), Device("/gpu:0", GiB))), "same device"),
        (lambda: Device("gpu zero", GiB), "malformed"),
        (lambda: Device("garbage/device:GPU:0", GiB), "malformed"),
        (lambda: Device("/device:GPU:0\n", GiB), "malformed"),
        (lambda: Device("/device:GPU:0", 0), "positive capacity"),
        (lambda: Device("/device:GPU:0", 1.5), "whole number"),
        (lambda: CommCost(-1, 0), "finite number >= 0"),
        (lambda: CommCost(float("nan"), 0), "finite number >= 0"),
        (lambda: CommCost.parse("1;2"), "slope,intercept"),
        (lambda: CommCost(0, 1e16), "every copy would take more than the 1e\\+15 us"),
        (lambda: CommCost(1e7, 0), "a copy of a GiB would take more than the 1e\\+15 us"),
        (lambda: Cluster.homogeneous(0, GiB), "at least one device"),
        (lambda: Cluster.homogeneous(1, GiB).with_memory_fraction(0), r"\(0, 1\]"),
    ],
)
def test_bad_clusters(make, match):
    with pytest.raises(ConfigError, match=match):
        make()


def test_parse_comm():
    assert CommCost.parse("0.0001754,134") == CommCost(0.0001754, 134.0)


def test_link_tables_are_made_once_and_agree_with_each_link():
    # They were rebuilt, O(D^2), for every scheduler a refinement move starts: on 200 devices
    # that was most of a move's time.
    c = _two_tasks()
    slope, intercept = c.link_tables()
    assert c.link_tables()[0] is slope and c.link_tables()[1] is intercept
    for a in range(3):
        for b in range(3):
            assert slope[a][b] * 1000 + intercept[a][b] == pytest.approx(c.transfer_us(a, b, 1000))
    assert c.min_link_intercept_us() == 10
    assert Cluster.homogeneous(1, GiB).min_link_intercept_us() == 0.0


@pytest.mark.parametrize(
    "memory_fraction, config_fraction, share",
    [
        (0.5, 0.0, 0.5),  # no per_process_gpu_memory_fraction: TF lists the whole GPU
        (0.5, 0.5, 1.0),  # train.py --memory_fraction=0.5 sets both: the listing is that half already
        (0.25, 0.5, 0.5),  # a quarter of the GPU is half of what TF lists
        (1.0, 0.3, 1.0),  # the placer takes no more than TF's allocator may
    ],
)
def test_a_gpu_listed_under_a_memory_fraction_is_not_scaled_by_it_again(memory_fraction, config_fraction, share):
    from baechi_tf.rewriter.devices import gpu_share, memory_share

    assert gpu_share(memory_fraction, config_fraction) == pytest.approx(share)
    # 16 GiB GPU, listed by TF as config_fraction of it (or whole): the placer gets memory_fraction of the GPU
    listed = int(16 * GiB * config_fraction) if config_fraction > 0 else 16 * GiB
    placed = memory_share(listed, gpu_share(memory_fraction, config_fraction))
    assert placed == pytest.approx(16 * GiB * min(memory_fraction, config_fraction or 1.0), rel=1e-9)


@pytest.mark.slow
@pytest.mark.parametrize("method", ["auto", "m_etf", "m_sct", "heft", "m_topo"])
def test_the_slowest_copies_allowed_still_place_and_schedule_finitely(method):
    # At the limits every copy costs as much as a step may take: each method still places,
    # its makespan is finite, and auto keeps one device (every copy costs more than it saves).
    import math

    from baechi_tf.cluster import MAX_COPY_US
    from baechi_tf.placer.pipeline import PlacementOptions, place
    from graphs import fork_join

    slowest = CommCost(MAX_COPY_US / GiB, MAX_COPY_US)
    cluster = Cluster.homogeneous(4, GiB, comm=slowest)
    graph = fork_join(4)
    r = place(graph, cluster, PlacementOptions(method, refine_seconds=0.2))
    assert math.isfinite(r.makespan_us)
    if method == "auto":
        assert r.makespan_us == r.single_device_makespan_us


@pytest.mark.parametrize("job", ["a-b", "w\nx", "$$", "1a", "ps 0"])
def test_a_job_tf_cannot_run_is_refused_with_the_rule(job):
    # TF's runtime takes a job name of a letter and then letters, digits and '_' (a server of the
    # job 'a-b' ends the process in a CHECK failure). A newline stays inside the one-line message.
    with pytest.raises(ConfigError, match="which TF cannot run: a job name is a letter") as e:
        Device(f"/job:{job}/replica:0/task:0/device:GPU:0", GiB)
    assert "\n" not in str(e.value)


def test_a_job_holding_a_slash_is_refused_not_read_as_another_task():
    # '/job:a/b/replica:0/task:1/...' was read as task 0 of the job 'a', so the devices of two
    # tasks were refused as 'the same device'; TF refuses such a name ("Unknown attribute 'b'").
    with pytest.raises(ConfigError, match="'/job:a/b/replica:0/task:0/device:GPU:0' is malformed"):
        Cluster(tuple(Device(f"/job:a/b/replica:0/task:{t}/device:GPU:0", GiB) for t in range(2)))


def test_sends_on_compute_is_a_bool_and_parts_twins():
    with pytest.raises(ConfigError, match=r"sends_on_compute='yes'; give True .* or False"):
        Device("/device:CPU:0", GiB, "CPU", sends_on_compute="yes")
    devices = tuple(Device(f"/device:CPU:{i}", GiB, "CPU", sends_on_compute=i < 2) for i in range(4))
    cluster = Cluster(devices)
    assert cluster.sends_on_compute() == (True, True, False, False)
    assert cluster.twins() == ((0, 1), (2, 3))  # a copy out of 0 waits where one out of 2 does not


@pytest.mark.parametrize("k", [0.5, 0, -1, float("nan"), "2", True, None])
def test_copies_in_flight_below_one_or_not_a_number_is_refused(k):
    with pytest.raises(ConfigError, match=r"copies_in_flight=.*; give a number >= 1: how many copies"):
        CommCost(1, 2, copies_in_flight=k)


def test_copies_in_flight_splits_the_intercept_into_held_and_latency():
    assert CommCost(1, 2, 3) == CommCost(1, 2, 3.0) and CommCost(1, 2).copies_in_flight == 1.0
    devices = tuple(Device(f"/job:worker/replica:0/task:{t}/device:CPU:{i}", GiB, "CPU")
                    for t in range(2) for i in range(2))
    c = Cluster(devices, CommCost(1, 10), CommCost(2, 30, copies_in_flight=3))
    slope, held, latency = c.channel_tables()
    assert slope == c.link_tables()[0]
    assert held[0] == [0, 10, 10, 10] and latency[0] == [0, 0, 20, 20]
    assert c.min_link_intercept_us() == 10 and c.min_hold_us() == 10
    assert Cluster(devices, CommCost(1, 10), CommCost(2, 30, 6)).min_hold_us() == 5
    unbounded = Cluster(devices, CommCost(1, 10), CommCost(2, 30, copies_in_flight=math.inf))
    assert unbounded.channel_tables()[1][0] == [0, 10, 0, 0] and unbounded.channel_tables()[2][0] == [0, 0, 30, 30]
    assert unbounded.min_hold_us() == 0  # bytes alone hold 0 to 2
    assert c.twins() == ((0, 1), (2, 3))
    # Links that overlap their fixed costs differently part devices that the intercepts join.
    mixed = Cluster(devices, CommCost(1, 30), CommCost(1, 30, copies_in_flight=2))
    assert mixed.twins() == ((0, 1), (2, 3))
    assert Cluster(devices, CommCost(1, 30)).twins() == ((0, 1, 2, 3),)
