"""Keras 3 ``model.fit`` with its train step placed by Baechi (TensorFlow backend).

::

    model.compile(optimizer=..., loss=..., metrics=[...])
    placed = baechi_tf.tf2.keras.place(model, (x[:64], y[:64]), num_devices=4)
    model.fit(x, y, batch_size=64, epochs=3)
    print(placed.summary())

`place` makes the model's ``train_function`` (what ``fit`` and ``train_on_batch`` call with an
iterator of batches, `steps_per_execution` at a time) call a `baechi_tf.function` of
``model.train_step``: each batch signature (shapes and types of ``(x, y[, sample_weight])``) is
profiled, placed and traced again as for any `baechi_tf.function`, with ``reduce_retracing`` as
Keras's own step has it (a last, smaller batch gives a trace of any batch size, placed once). The
model's weights, its optimizer's variables (built here when they are not yet) and its metrics'
variables are pinned where they live, as `baechi_tf.tf2.function` says; the train step's ops that
read or update them run there. With `sample_batch`, the first signature is placed now, without
training on it (profiling runs copies), and `placed.placement` is its report before ``fit``.

``evaluate`` and ``predict`` keep Keras's own functions: they run unplaced and read the trained
weights. ``compile`` again drops the placed train function (Keras makes a new one); call `place`
after it.

Refused with a `ConfigError`: a model that is not built or not compiled, ``run_eagerly=True``,
``jit_compile=True`` (`JIT_COMPILE_REFUSED`), and a model under a distribution strategy.
"""

from __future__ import annotations

from typing import Any, Optional

from baechi_tf.errors import ConfigError
from baechi_tf.tf2.function import JIT_COMPILE_REFUSED, PlacedFunction, function

__all__ = ["place"]


def _check(model: Any) -> None:
    import keras
    import tensorflow as tf

    if not isinstance(model, keras.Model):
        raise ConfigError(f"place takes a keras.Model, not a {type(model).__name__}")
    if keras.backend.backend() != "tensorflow":
        raise ConfigError(
            f"Keras runs on {keras.backend.backend()!r}; baechi_tf places TensorFlow programs: set "
            "KERAS_BACKEND=tensorflow"
        )
    if not model.built:
        raise ConfigError(
            f"model {model.name!r} is not built, so its weights do not exist yet: build it first "
            "(keras.Input in a Sequential or functional model, model.build(input_shape), or a call "
            "on a batch), then compile it and place it"
        )
    if not getattr(model, "compiled", False):
        raise ConfigError(f"model {model.name!r} is not compiled: call model.compile(...) before place")
    if model.run_eagerly:
        raise ConfigError("the model was compiled with run_eagerly=True: there is no traced step to place")
    if model.jit_compile is True:
        raise ConfigError(JIT_COMPILE_REFUSED + "compile the model with jit_compile=False")
    if model.distribute_strategy is not tf.distribute.get_strategy() or tf.distribute.has_strategy():
        raise ConfigError(
            "the model runs under a tf.distribute strategy, which places its replicas itself; "
            "place a model made outside any strategy scope"
        )


def place(model: Any, sample_batch: Optional[Any] = None, **placement: Any) -> PlacedFunction:
    """Makes ``model.fit`` run `model`'s train step placed; returns the `PlacedFunction` (its
    `placements`, `summary()`). `placement` is `baechi_tf.function`'s arguments (`num_devices`,
    `options`, `cost_path`, `report_dir`, ...). `sample_batch`: a batch as ``fit`` gives it to the
    train step, ``(x, y)`` or ``(x, y, sample_weight)``, whose signature is placed now."""
    import tensorflow as tf

    _check(model)
    for name in ("jit_compile", "autograph", "reduce_retracing", "input_signature"):
        if name in placement:
            raise ConfigError(f"{name}= is set by place, as Keras sets it for its own train step")
    if model.optimizer is not None and not model.optimizer.built:
        model.optimizer.build(model.trainable_variables)  # its variables exist before the trace

    @tf.autograph.experimental.do_not_convert  # as Keras's own step: Keras code is not converted
    def train_step(data: Any) -> Any:
        return model.train_step(data)

    placed = function(train_step, autograph=False, reduce_retracing=True, **placement)

    def train_function(iterator: Any) -> Any:
        if isinstance(iterator, tf.data.Iterator):  # fit's
            outputs = None
            for _ in range(model.steps_per_execution):
                batch = iterator.get_next_as_optional()
                if not batch.has_value():
                    break
                outputs = placed(batch.get_value())
            if outputs is None:
                raise StopIteration
            return outputs
        outputs = None
        for _, data in zip(range(model.steps_per_execution), iterator):  # train_on_batch's
            outputs = placed(data)
        return outputs

    if sample_batch is not None:
        placed.place(tuple(tf.nest.map_structure(tf.convert_to_tensor, tuple(sample_batch))))
    model.train_function = train_function
    return placed
