"""Grouping, placement algorithms, the simulator and its bounds: pure functions over `OpGraph` and
`Cluster`. No TensorFlow is imported here or below (tests/test_import_rules.py)."""

from baechi_tf.placer.check import check_placement
from baechi_tf.placer.grouping import Groups, colocation_groups, coplace, make_groups
from baechi_tf.placer.m_etf import place_m_etf
from baechi_tf.placer.m_topo import place_m_topo
from baechi_tf.placer.schedule import Placement, Schedule, Transfer
from baechi_tf.placer.bounds import lower_bound_us
from baechi_tf.placer.simulator import simulate, single_device_schedule

__all__ = [
    "Groups",
    "Placement",
    "Schedule",
    "Transfer",
    "check_placement",
    "colocation_groups",
    "coplace",
    "lower_bound_us",
    "make_groups",
    "place_m_etf",
    "place_m_topo",
    "simulate",
    "single_device_schedule",
]
