import sys

from train import hardware

# TensorFlow's C++ start-up chatter is not for users; real errors still reach stderr.
hardware.quiet_tensorflow()

from train.cli import main  # noqa: E402  (before TensorFlow loads)

sys.exit(main())
