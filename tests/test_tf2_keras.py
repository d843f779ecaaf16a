"""baechi_tf.tf2.keras.place: Keras 3 model.fit with its train step placed computes what the
unplaced model computes; evaluate, predict and train_on_batch keep working; bad models refused.

The placed programs run in a fresh process (tests/tf2_programs.py), as in test_tf2_function.py.
"""

import numpy as np
import pytest

from baechi_tf.errors import ConfigError
from test_tf2_function import HOST, run

pytestmark = [pytest.mark.tf, pytest.mark.slow]


def test_fit_placed_computes_what_fit_computes():
    out = run("keras_fit")
    placed, plain = out["placed"], out["plain"]
    # Three epochs of 4 batches of 64 and one of 32, with dropout: the same losses.
    np.testing.assert_allclose(placed["loss"], plain["loss"], rtol=1e-5)
    assert placed["loss"][-1] < placed["loss"][0]
    np.testing.assert_allclose(placed["evaluate"], plain["evaluate"], rtol=1e-5)
    np.testing.assert_allclose(placed["predict"], plain["predict"], rtol=1e-5, atol=1e-6)
    assert placed["train_on_batch"] == pytest.approx(plain["train_on_batch"], rel=1e-5)
    # fit's step ran on the host (the weights) and on at least two stand-ins.
    assert len([d for d in out["ran_on"] if d != HOST]) >= 2, out["ran_on"]
    # The sample batch was placed before fit; fit's last, smaller batch gave a trace of any
    # batch size, and train_on_batch's batch one of its own.
    assert out["placed_before_fit"] == 1 and out["placements"] == 3
    assert "variables: 25 pinned where they live" in out["summary"]
    assert "adam/sequential_dense_kernel_momentum:0" in out["summary"]


def test_fit_placed_keeps_together_what_tf_fuses_or_regroups():
    """A conv net with biases, a sum of four branches and a batch norm, placed by m_etf: oneDNN's
    filter-and-bias gradients, the arithmetic optimizer's AddN and the remapper's fused nodes
    ran as unplaced (before their ops were kept together, m_etf split the filter and bias
    gradients: none of the three fused), and the losses are equal."""
    out = run("keras_conv", "m_etf")
    placed, plain = out["placed"], out["plain"]
    assert placed["regrouped"] == plain["regrouped"]
    assert plain["regrouped"]["_MklNativeConv2DBackpropFilterWithBias"] == 3
    np.testing.assert_allclose(placed["loss"], plain["loss"], rtol=1e-5)
    assert len([d for d in placed["ran_on"] if d != HOST]) >= 2, placed["ran_on"]


def _model(built=True, compiled=True, **compile_options):
    import keras

    layers = [keras.layers.Dense(4)]
    model = keras.Sequential(([keras.Input((3,))] if built else []) + layers)
    if compiled:
        model.compile(optimizer="sgd", loss="mse", **compile_options)
    return model


@pytest.mark.parametrize("kind, says", [
    ({"built": False}, "is not built, so its weights do not exist yet: build it first"),
    ({"compiled": False}, "is not compiled: call model.compile"),
    ({"jit_compile": True}, "jit_compile=True: XLA compiles the whole function .* compile the model with jit_compile=False"),
    ({"run_eagerly": True}, "run_eagerly=True: there is no traced step to place"),
])
def test_a_model_that_cannot_be_placed_is_refused(kind, says):
    from baechi_tf.tf2.keras import place

    model = _model(**kind)
    with pytest.raises(ConfigError, match=says):
        place(model, num_devices=4)
    assert model.train_function is None  # nothing changed


def test_keras_step_arguments_are_place_s_own():
    from baechi_tf.tf2.keras import place

    with pytest.raises(ConfigError, match="jit_compile= is set by place"):
        place(_model(), num_devices=4, jit_compile=False)
