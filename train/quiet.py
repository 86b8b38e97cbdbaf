"""Keep TensorFlow's and XLA's start-up chatter off a user's terminal.

Loading TensorFlow prints lines from C++ before its logging is set up, so
``TF_CPP_MIN_LOG_LEVEL`` cannot silence them: absl's "log messages before InitializeLog"
warning, "Could not find cuda drivers", on any machine without a GPU ``E0000 ... failed
call to cuInit``, which reads as a failure, and on CPUs where TensorFlow turns oneDNN on by itself
(AVX-512 and newer, or ``TF_ENABLE_ONEDNN_OPTS=1``) ``port.cc:153] oneDNN custom operations are
on``. :func:`native_startup` routes file descriptor 2 through a pipe while the frameworks load and
passes on every line except those known ones; ``CIFAR_VERBOSE=1`` passes everything.
"""

import contextlib
import os
import re
import sys
import threading

NOISE = re.compile(
    rb"WARNING: All log messages before absl::InitializeLog\(\) is called are written to STDERR"
    rb"|WARNING: Logging before InitGoogle\(\) is written to STDERR"
    rb"|cudart_stub\.cc:\d+\] Could not find cuda drivers"
    rb"|cuda_platform\.cc:\d+\] failed call to cuInit"
    rb"|cuda_executor\.cc:\d+\] .*(no NVIDIA GPU|could not open file to read NUMA node)"
    rb"|port\.cc:\d+\] oneDNN custom operations are on\. "
    rb"|cpu_feature_guard\.cc:\d+\] This TensorFlow binary is optimized"
    rb"|^To enable the following instructions: .* rebuild TensorFlow with the appropriate compiler flags\."
    rb"|^INFO: Created TensorFlow Lite XNNPACK delegate for CPU\."
    rb"|^fully_quantize: \d+, inference_type: \d+, input_inference_type: \w+, output_inference_type: \w+"
)


def verbose():
    return os.environ.get("CIFAR_VERBOSE", "") not in ("", "0")


@contextlib.contextmanager
def native_startup():
    """Within this block, native stderr lines that are known start-up noise are dropped."""
    if verbose():
        yield
        return
    try:
        sys.stderr.flush()
        saved = os.dup(2)
        read_end, write_end = os.pipe()
    except OSError:  # no usable stderr (a daemon): nothing to tidy
        yield
        return
    os.dup2(write_end, 2)
    os.close(write_end)
    # Lines are passed on as they come, not at the end: a fatal error inside the block still shows.
    reader = threading.Thread(target=_forward, args=(read_end, saved), daemon=True)
    reader.start()
    try:
        yield
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)  # the pipe's last write end closes, so the reader sees its end
        reader.join(timeout=5)
        if not reader.is_alive():  # else it still writes to saved: leave that descriptor open
            os.close(saved)


def _forward(fd, target):
    pending = b""
    with os.fdopen(fd, "rb", buffering=0) as pipe:
        while True:
            chunk = pipe.read(65536)
            lines = (pending + chunk).splitlines(keepends=True)
            pending = lines.pop() if lines and chunk and not lines[-1].endswith(b"\n") else b""
            kept = b"".join(line for line in lines if not NOISE.search(line))
            if kept:
                try:
                    os.write(target, kept)
                except OSError:
                    pass
            if not chunk:
                return
