import sys

from train import hardware

hardware.quiet_tensorflow()

from export.exporter import main  # noqa: E402  (before TensorFlow loads)
from train.quiet import native_startup  # noqa: E402

with native_startup():  # TensorFlow's start-up lines are not for users; errors still pass
    code = main()
sys.exit(code)
