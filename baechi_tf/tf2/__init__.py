"""TensorFlow 2 programs placed by Baechi: `function`, a ``tf.function`` whose traces are
profiled, placed and traced again with every op on its device (`baechi_tf.tf2.function`), and
`standin_devices`, the CPU devices that stand in for GPUs in TF's eager context."""

from baechi_tf.tf2.function import PlacedFunction, function, standin_devices

__all__ = ["PlacedFunction", "function", "standin_devices"]
