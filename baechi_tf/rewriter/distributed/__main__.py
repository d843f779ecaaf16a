"""``python -m baechi_tf.rewriter.distributed``: runs one task's TF server (`worker.main`)."""

import sys

from baechi_tf.rewriter.distributed.worker import main

__all__: list[str] = []

if __name__ == "__main__":
    sys.exit(main())
