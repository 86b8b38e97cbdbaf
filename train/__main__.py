import os
import sys

# TensorFlow's C++ start-up chatter is not for users; real errors still reach stderr.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from train.cli import main  # noqa: E402  (the variable must be set before TensorFlow loads)

sys.exit(main())
