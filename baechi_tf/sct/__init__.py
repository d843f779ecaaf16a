"""m-SCT's linear program: building it (`lp`), solving it (`solvers`, `relaxation`) and rounding
it into favourite children (`rounding`). Pure numpy/scipy over `OpGraph`; no TensorFlow."""

from baechi_tf.sct.lp import SctLP, arc_comm_us, build_sct_lp, sct_lp
from baechi_tf.sct.relaxation import SctRelaxation, solve_sct_relaxation
from baechi_tf.sct.rounding import favourite_children
from baechi_tf.sct.solvers import SOLVERS, LPSolution, choose_solver, mosek_licence_problem, solve_lp

__all__ = [
    "LPSolution",
    "SOLVERS",
    "SctLP",
    "SctRelaxation",
    "arc_comm_us",
    "build_sct_lp",
    "choose_solver",
    "favourite_children",
    "mosek_licence_problem",
    "sct_lp",
    "solve_lp",
    "solve_sct_relaxation",
]
