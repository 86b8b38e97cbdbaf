"""What the multi-process training tests share: the worker, its flags, and reading what its processes left."""

import os
import subprocess

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
WORKER = os.path.join(REPO, "tests", "support", "multiprocess_worker.py")
DEADLINE_S = 900  # a whole run on a loaded 2-core machine; never reached when all is well
# No augmentation: one process and several see the same batches, so their losses can be compared closely.
FLAGS = ["--keras-backend", "jax", "--model", "seed_cnn", "--precision", "float32", "--no-augment", "--seed", "3"]


def finish(procs, output):
    for i, proc in enumerate(procs):
        try:
            code = proc.wait(timeout=DEADLINE_S)
        except subprocess.TimeoutExpired:
            for p in procs:
                p.kill()
            raise
        assert code == 0, f"process {i} exited {code}:\n" + log_tail(output, i)


def log_tail(output, i):
    with open(f"{output}.process-{i}.log") as f:
        return f.read()[-3000:]


def digests(directory, process):
    """``{epoch: (sha256, loss)}`` as process ``process`` wrote them, in order (a list of triples)."""
    path = os.path.join(directory, f"process-{process}.txt")
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [(int(epoch), sha, float(loss)) for epoch, sha, loss in (line.split() for line in f if line.strip())]
