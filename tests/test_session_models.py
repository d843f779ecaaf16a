"""BaechiSession on a real model whose CPU kernels add output slots at run time."""

import numpy as np
import pytest
import tensorflow as tf

from baechi_tf import BaechiSession
from baechi_tf.models import build_model
from baechi_tf.models.inception_v3 import InceptionV3HParams

pytestmark = pytest.mark.tf


def test_training_inception_v3_profiles_places_and_trains():
    # oneDNN's training MaxPool keeps a workspace as an extra output that the graph does not
    # declare; the profile folds it into temporary memory instead of refusing the graph.
    hp = InceptionV3HParams(batch_size=2, image_size=75, num_classes=10, depth_multiplier=0.1)
    spec = build_model("inception_v3", hp)
    with spec.graph.as_default():
        tf.compat.v1.set_random_seed(1)
        train = tf.compat.v1.train.GradientDescentOptimizer(0.01).minimize(
            spec.loss, colocate_gradients_with_ops=True
        )
        init = tf.compat.v1.global_variables_initializer()
    plain = tf.compat.v1.Session(graph=spec.graph)
    plain.run(init)
    with BaechiSession(plain, placement_method="m_etf", num_devices=2, profile_steps=1,
                       warmup_steps=1) as sess:
        losses = [sess.run([spec.loss, train], feed_dict=spec.feeds)[0] for _ in range(2)]
        assert np.isfinite(losses).all()
        outputs = {op.name: len(op.outputs) for op in spec.graph.get_operations()}
        assert all(len(c.output_bytes) <= outputs[name] for name, c in sess.profile.ops.items())
        assert sess.placement.op_to_device
