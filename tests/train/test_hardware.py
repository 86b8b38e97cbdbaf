"""Which backend and hardware training picks, decided before Keras, TensorFlow or JAX is imported."""

import json
import os
import re
import subprocess
import sys

import pytest

from train import hardware, quiet

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _pci(root, *vendors):
    for i, vendor in enumerate(vendors):
        device = root / f"0000:00:{i:02x}.0"
        device.mkdir(parents=True)
        (device / "vendor").write_text(vendor + "\n")
    return str(root)


def test_tpu_chips_are_googles_pci_devices_and_nothing_else(tmp_path):
    assert hardware.tpu_chips(_pci(tmp_path / "tpu-host", "0x1ae0", "0x1ae0", "0x1ae0", "0x1ae0", "0x8086")) == 4
    # A GPU passed through VFIO (NVIDIA's vendor id) is not a TPU, whatever /dev/vfio holds.
    gpu_host = _pci(tmp_path / "gpu-host", "0x10de", "0x8086")
    assert hardware.tpu_chips(gpu_host) == 0
    assert not hardware.tpu_present(gpu_host, environ={})
    assert hardware.tpu_present(gpu_host, environ={"TPU_NAME": "my-tpu-node"})


def test_auto_backend_is_jax_on_a_tpu_host_and_tensorflow_elsewhere():
    assert hardware.pick_backend("auto", environ={}, tpu=True) == "jax"
    assert hardware.pick_backend("auto", environ={}, tpu=False) == "tensorflow"
    assert hardware.pick_backend("auto", environ={"KERAS_BACKEND": "jax"}, tpu=False) == "jax"
    assert hardware.pick_backend("tensorflow", environ={}, tpu=True) == "tensorflow"
    with pytest.raises(hardware.AcceleratorError, match="unknown backend 'torch'"):
        hardware.pick_backend("torch", environ={})


def test_without_a_tpu_jax_never_loads_libtpu(tmp_path):
    env = {}
    hardware.prepare_environment("jax", environ=env, pci_root=_pci(tmp_path / "cpu-host", "0x8086"))
    assert env["KERAS_BACKEND"] == "jax" and env["JAX_PLATFORMS"] in ("cpu", "cuda,cpu")
    chosen = {"JAX_PLATFORMS": "cpu,tpu"}
    hardware.prepare_environment("jax", environ=chosen, pci_root=str(tmp_path / "cpu-host"))
    assert chosen["JAX_PLATFORMS"] == "cpu,tpu", "the user's choice stands"


def test_on_a_tpu_host_jax_may_use_the_tpu_and_tensorflow_is_not_pointed_at_it(tmp_path):
    tpu_host = _pci(tmp_path / "tpu-host", "0x1ae0")
    env = {}
    hardware.prepare_environment("jax", environ=env, pci_root=tpu_host)
    assert "JAX_PLATFORMS" not in env
    env = {}
    hardware.prepare_environment("tensorflow", environ=env, pci_root=tpu_host)
    # No TensorFlow build runs on current TPUs: TensorFlow trains on the CPU or GPUs only.
    assert env == {"KERAS_BACKEND": "tensorflow", "TF_ENABLE_ONEDNN_OPTS": "1", "TF_CPP_MIN_LOG_LEVEL": "2",
                   "TF_ENABLED_DEVICE_TYPES": "CPU"}


def test_tensorflow_sees_only_its_cpu_where_there_is_no_nvidia_device(tmp_path):
    env = {}
    hardware.quiet_tensorflow(env, _pci(tmp_path / "cpu-host", "0x8086"))
    assert env == {"TF_CPP_MIN_LOG_LEVEL": "2", "TF_ENABLED_DEVICE_TYPES": "CPU"}
    env = {}
    hardware.quiet_tensorflow(env, _pci(tmp_path / "gpu-host", "0x10de", "0x8086"))
    assert env == {"TF_CPP_MIN_LOG_LEVEL": "2"}, "a GPU host keeps TensorFlow's GPU devices"
    chosen = {"TF_CPP_MIN_LOG_LEVEL": "0", "TF_ENABLED_DEVICE_TYPES": "CPU,GPU"}
    hardware.quiet_tensorflow(chosen, str(tmp_path / "cpu-host"))
    assert chosen == {"TF_CPP_MIN_LOG_LEVEL": "0", "TF_ENABLED_DEVICE_TYPES": "CPU,GPU"}, "the user's choice stands"


def test_a_tensorflow_start_prints_no_cuda_error():
    """On this machine, GPU or not: no ``failed call to cuInit`` (an error line on every machine without a GPU)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TF_")}
    code = ("from train import hardware; hardware.quiet_tensorflow(); import tensorflow as tf; "
            "print(len(tf.config.list_logical_devices('CPU')))")
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "1"
    assert "cuInit" not in done.stderr and "E0000" not in done.stderr, done.stderr


def test_tensorflow_trains_with_onednn_on_every_cpu_unless_the_user_turns_it_off():
    # TensorFlow enables oneDNN by itself only with AVX-512; on AVX2 its own convolution gradients
    # take twice as long. The user's "0" stands.
    code = ("import os, sys\nfrom train import hardware\nhardware.prepare_environment('tensorflow')\n"
            "from tensorflow.python.util import _pywrap_util_port\nprint(_pywrap_util_port.IsMklEnabled())")
    for given, enabled in ((None, "True"), ("0", "False")):
        env = {k: v for k, v in os.environ.items() if k != "TF_ENABLE_ONEDNN_OPTS"}
        if given is not None:
            env["TF_ENABLE_ONEDNN_OPTS"] = given
        result = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True,
                                timeout=300)
        assert result.returncode == 0, result.stderr[-2000:]
        assert result.stdout.strip().splitlines()[-1] == enabled, (given, result.stdout)


def test_the_cli_parses_flags_without_loading_a_framework():
    code = ("import sys\nfrom train import cli\ncli.build_parser().parse_args(['--keras-backend', 'jax'])\n"
            "print(sorted(m for m in ('keras', 'tensorflow', 'jax') if m in sys.modules))")
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


# What a framework prints at start-up: glog's "I0000 00:00:..." prefix, a C++ source location, absl and
# the frameworks by name. None of it may reach the user of a command line.
FRAMEWORK_LINE = re.compile(r"^[IWEF]\d{4} \d\d:\d\d:\d\d|\.cc:\d+\]|absl::|InitGoogle|oneDNN|TensorFlow|tensorflow"
                            r"|XLA|cuInit|cuda|XNNPACK")


def test_a_cli_start_shows_no_framework_noise(tmp_path):
    """TensorFlow's and XLA's pre-logging lines (cuInit failures, oneDNN's notice and the like) never reach the user.

    The data folder exists but holds no train/ split, so the error comes after TensorFlow has loaded.
    TF_ENABLE_ONEDNN_OPTS=1 makes TensorFlow print its oneDNN line on every CPU, as it does by itself
    on AVX-512 ones, so this machine's kind does not decide what is tested.
    """
    env = {k: v for k, v in os.environ.items() if k not in ("CIFAR_VERBOSE", "KERAS_BACKEND")}
    env["TF_ENABLE_ONEDNN_OPTS"] = "1"
    empty = tmp_path / "empty-data"
    empty.mkdir()
    result = subprocess.run([sys.executable, "-m", "train", "--data", str(empty), "--output", str(tmp_path / "out"),
                             "--keras-backend", "tensorflow"],
                            cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.splitlines()
    assert lines and lines[-1] == "error: no train/ folder (expected train/<class>/<images>)", result.stderr
    assert [line for line in lines if FRAMEWORK_LINE.search(line)] == [], "framework start-up lines reached the user"
    # The same run with CIFAR_VERBOSE=1 shows what was filtered, so the check above saw a real load.
    verbose = subprocess.run([sys.executable, "-m", "train", "--data", str(empty), "--output", str(tmp_path / "out"),
                              "--keras-backend", "tensorflow"],
                             cwd=REPO, env={**env, "CIFAR_VERBOSE": "1", "TF_CPP_MIN_LOG_LEVEL": "0"},
                             capture_output=True, text=True, timeout=300)
    assert verbose.returncode == 2
    assert "oneDNN custom operations are on" in verbose.stderr, verbose.stderr


@pytest.mark.parametrize("line", [
    # AVX2-only AMD EPYC (this project's development machines)
    b"WARNING: All log messages before absl::InitializeLog() is called are written to STDERR\n",
    b"I0000 00:00:1796114471.685249    3741 cudart_stub.cc:31] Could not find cuda drivers on your machine, GPU will not be used.\n",
    b"I0000 00:00:1796114471.761381    3741 cpu_feature_guard.cc:227] This TensorFlow binary is optimized to use "
    b"available CPU instructions in performance-critical operations.\n",
    b"To enable the following instructions: AVX2 FMA, in other operations, rebuild TensorFlow with the appropriate "
    b"compiler flags.\n",
    # AVX-512 / AMX Intel machines: oneDNN is on by default there
    b"I0000 00:00:1796114480.630824    3787 port.cc:153] oneDNN custom operations are on. You may see slightly "
    b"different numerical results due to floating-point round-off errors from different computation orders. To turn "
    b"them off, set the environment variable `TF_ENABLE_ONEDNN_OPTS=0`.\n",
    b"To enable the following instructions: AVX512_FP16 AVX_VNNI AMX_TILE AMX_INT8 AMX_BF16, in other operations, "
    b"rebuild TensorFlow with the appropriate compiler flags.\n",
])
def test_the_quiet_filter_knows_the_start_up_lines_of_both_cpu_kinds(line):
    assert quiet.NOISE.search(line)


@pytest.mark.parametrize("line", [
    b"error: no train/ folder (expected train/<class>/<images>)\n",
    b"F0000 00:00:1796114480.630824    3787 onednn_util.cc:12] Check failed: oneDNN primitive creation\n",
    b"Traceback (most recent call last):\n",
])
def test_the_quiet_filter_passes_errors(line):
    assert not quiet.NOISE.search(line)


# Runs a command-line module as `python -m` does and reports its exit code and which frameworks it loaded.
_RUN_MODULE = """
import json, runpy, sys
module = sys.argv.pop(1)
try:
    runpy.run_module(module, run_name="__main__", alter_sys=True)
    code = 0
except SystemExit as exit:
    code = exit.code
print(json.dumps({"code": code, "loaded": sorted(m for m in ("keras", "tensorflow", "jax") if m in sys.modules)}))
"""


#: A bad input for each stage: its flag, its name under tmp_path, what is there (nothing, a file or a folder), and
#: the one line the stage answers, naming the input's path.
BAD_INPUTS = {
    "train: missing data": ("--data", "no-such-data", None, "error: data path {path!r} does not exist"),
    "train: not data": ("--data", "notes.txt", "file",
                        "error: {path!r} is neither a folder, a .zip, nor a CIFAR-10 binary tarball"),
    "export: missing run": ("--run", "no-such-run", None, "error: run directory {path} does not exist"),
    "export: unfinished run": ("--run", "run", "folder", "error: no manifest.json in {path} (is training finished?)"),
}
#: Where each stage would write: its flag, and a name under tmp_path.
OUTPUTS = {"train": ("--output", "out"), "export": ("--model-dir", "models")}


def _bad_input(kind, tmp_path):
    flag, name, there, line = BAD_INPUTS[kind]
    stage = kind.split(":")[0]
    path = tmp_path / name
    if there == "file":
        path.write_text("hello")
    elif there == "folder":
        path.mkdir()
    output_flag, output_name = OUTPUTS[stage]
    output = tmp_path / output_name
    return [stage, flag, str(path), output_flag, str(output)], line.format(path=str(path)), output


@pytest.mark.parametrize("kind", list(BAD_INPUTS))
def test_bad_input_is_one_line_before_any_framework_loads(kind, tmp_path):
    argv, expected, output = _bad_input(kind, tmp_path)
    env = {k: v for k, v in os.environ.items() if k not in ("CIFAR_VERBOSE", "KERAS_BACKEND")}
    result = subprocess.run([sys.executable, "-c", _RUN_MODULE, *argv], cwd=REPO, env=env,
                            capture_output=True, text=True, timeout=120)
    report = json.loads(result.stdout.splitlines()[-1])
    assert report == {"code": 2, "loaded": []}, result.stderr
    assert result.stderr.splitlines() == [expected]
    assert not output.exists(), "nothing is written for bad input"
