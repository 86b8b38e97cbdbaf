"""Which backend and hardware training picks, decided before Keras, TensorFlow or JAX is imported."""

import os
import subprocess
import sys

import pytest

from train import hardware

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


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


def test_on_a_tpu_host_jax_may_use_the_tpu_and_tensorflow_gets_the_pjrt_plugin(tmp_path):
    tpu_host = _pci(tmp_path / "tpu-host", "0x1ae0")
    env = {}
    hardware.prepare_environment("jax", environ=env, pci_root=tpu_host)
    assert "JAX_PLATFORMS" not in env
    env = {}
    hardware.prepare_environment("tensorflow", environ=env, pci_root=tpu_host)
    if hardware.installed("libtpu"):
        assert env["PJRT_DEVICE"] == "TPU" and env["NEXT_PLUGGABLE_DEVICE_USE_C_API"] == "true"
        assert env["TF_PLUGGABLE_DEVICE_LIBRARY_PATH"].endswith("libtpu.so")
    else:
        assert "PJRT_DEVICE" not in env, "no plugin to point TensorFlow at"


def test_the_cli_parses_flags_without_loading_a_framework():
    code = ("import sys\nfrom train import cli\ncli.build_parser().parse_args(['--backend', 'jax'])\n"
            "print(sorted(m for m in ('keras', 'tensorflow', 'jax') if m in sys.modules))")
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


def test_a_cli_start_shows_no_framework_noise(tmp_path):
    """TensorFlow's and XLA's pre-logging lines (cuInit failures and the like) never reach the user."""
    env = {k: v for k, v in os.environ.items() if k not in ("CIFAR_VERBOSE", "KERAS_BACKEND")}
    missing = tmp_path / "no-such-data"
    result = subprocess.run([sys.executable, "-m", "train", "--data", str(missing), "--output", str(tmp_path / "out")],
                            cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 2
    assert result.stderr.splitlines() == [f"error: data path {str(missing)!r} does not exist"]
