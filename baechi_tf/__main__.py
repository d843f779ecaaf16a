from baechi_tf.cli import console_main

console_main()
