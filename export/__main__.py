import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from export.exporter import main  # noqa: E402  (the variable must be set before TensorFlow loads)
from train.quiet import native_startup  # noqa: E402

with native_startup():  # TensorFlow's start-up lines are not for users; errors still pass
    code = main()
sys.exit(code)
