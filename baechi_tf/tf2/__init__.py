"""TensorFlow 2 programs placed by Baechi: a traced ``tf.function`` as a GraphDef the pipeline
places, and its profile (`baechi_tf.tf2.graph`)."""

__all__: list[str] = []
