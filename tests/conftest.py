import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))


@pytest.fixture
def methods():
    """Restores the registered placement methods after a test that registers its own."""
    from baechi_tf.placer import pipeline

    saved, cut_off = dict(pipeline._METHODS), set(pipeline._CUT_OFF)
    yield
    pipeline._METHODS.clear()
    pipeline._METHODS.update(saved)
    pipeline._CUT_OFF.clear()
    pipeline._CUT_OFF.update(cut_off)
