"""The TensorFlow end of baechi_tf: GraphDef import, placement apply, the graph pass, the session.

`import_graph_def` turns a GraphDef and a cost profile into an `OpGraph`; `apply_placement`
writes a placement back as ``device`` fields of a copy; `place_graph_def` chains both around the
placer; `BaechiSession` profiles, places and runs a ``tf.compat.v1`` graph. The modules import
TensorFlow only inside the functions that need it.
"""

from baechi_tf._lazy import lazy_attributes

__all__ = [
    "BaechiSession",
    "ImportResult",
    "PlacementReport",
    "apply_placement",
    "import_graph_def",
    "place_graph_def",
]

_LAZY = {
    "BaechiSession": "baechi_tf.rewriter.session",
    "ImportResult": "baechi_tf.rewriter.importer",
    "PlacementReport": "baechi_tf.rewriter.graph_pass",
    "apply_placement": "baechi_tf.rewriter.apply",
    "import_graph_def": "baechi_tf.rewriter.importer",
    "place_graph_def": "baechi_tf.rewriter.graph_pass",
}

__getattr__ = lazy_attributes(__name__, _LAZY, globals())
