import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))


@pytest.fixture
def methods():
    """Restores the registered placement methods after a test that registers its own."""
    from baechi_tf.placer import methods

    saved = methods.current()
    yield
    methods._current = saved
