"""Grouping, placement algorithms and the simulator: pure functions over `OpGraph` and `Cluster`."""

from baechi_tf.placer.check import check_placement
from baechi_tf.placer.grouping import Groups, colocation_groups, coplace, make_groups
from baechi_tf.placer.m_etf import place_m_etf
from baechi_tf.placer.m_topo import place_m_topo
from baechi_tf.placer.schedule import Placement, Schedule, Transfer
from baechi_tf.placer.simulator import lower_bound_us, simulate, single_device_schedule

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
