import sys

from baechi_tf.cli import main

sys.exit(main())
