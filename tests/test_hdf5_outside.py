"""HDF5 calibration data is read only from the .h5 file itself: external storage, external and
soft links and virtual datasets (other files, devices, FIFOs, loops) are refused in one line."""

import os
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest

from onebuild.errors import FormatError, UserError
from onebuild.hdf5_data import iter_hdf5

SHAPE = (1, 1, 8, 8)
INPUTS = [("x", SHAPE)]


def _read(path: Path) -> list:
    return list(iter_hdf5(path, INPUTS))


def _external_storage(path: Path, tmp_path: Path) -> None:
    outside = tmp_path / "secret.bin"
    outside.write_bytes(bytes(range(256)))
    with h5py.File(path, "w") as handle:
        group = handle.create_group("value/0")
        group.create_dataset("0", shape=SHAPE, dtype="f4", external=[(str(outside), 0, 256)])


def _external_link(path: Path, tmp_path: Path) -> None:
    with h5py.File(tmp_path / "other.h5", "w") as other:
        other.create_dataset("data", data=np.ones(SHAPE, np.float32))
    with h5py.File(path, "w") as handle:
        handle.create_group("value/0")["0"] = h5py.ExternalLink(str(tmp_path / "other.h5"), "data")


def _soft_loop(path: Path, tmp_path: Path) -> None:
    with h5py.File(path, "w") as handle:
        group = handle.create_group("value/0")
        group["0"] = h5py.SoftLink("/value/0/1")
        group["1"] = h5py.SoftLink("/value/0/0")


def _virtual(path: Path, tmp_path: Path) -> None:
    with h5py.File(tmp_path / "other.h5", "w") as other:
        other.create_dataset("data", data=np.ones(SHAPE, np.float32))
    layout = h5py.VirtualLayout(shape=SHAPE, dtype="f4")
    layout[...] = h5py.VirtualSource(str(tmp_path / "other.h5"), "data", shape=SHAPE)
    with h5py.File(path, "w") as handle:
        handle.create_group("value/0").create_virtual_dataset("0", layout)


def _linked_value(path: Path, tmp_path: Path) -> None:
    with h5py.File(path, "w") as handle:
        handle.create_dataset("real/0/0", data=np.ones(SHAPE, np.float32))
        handle["value"] = h5py.SoftLink("/real")


@pytest.mark.parametrize(
    "make, words",
    [
        (_external_storage, "value/0/0 is external storage"),
        (_external_link, "value/0/0 is an external link"),
        (_soft_loop, "value/0/0 is a soft link"),
        (_virtual, "value/0/0 is a virtual dataset"),
        (_linked_value, "value is a soft link"),
    ],
)
def test_data_outside_the_file_is_refused(tmp_path, make, words):
    path = tmp_path / "calib.h5"
    make(path, tmp_path)
    with pytest.raises(FormatError) as error:
        _read(path)
    assert str(error.value).startswith(f"{path}: {words}")


def test_data_inside_the_file_is_read(tmp_path):
    path = tmp_path / "calib.h5"
    with h5py.File(path, "w") as handle:
        handle.create_dataset("value/0/0", data=np.full(SHAPE, 3, np.float32))
    [(_, batch)] = _read(path)
    assert batch["x"].shape == (1, *SHAPE) and (batch["x"] == 3).all()


def test_a_fifo_named_as_the_data_is_refused_not_waited_on(tmp_path):
    fifo = tmp_path / "calib.h5"
    os.mkfifo(fifo)
    code = (
        "import sys\nfrom onebuild.hdf5_data import iter_hdf5\n"
        "from onebuild.errors import UserError\n"
        f"try:\n    list(iter_hdf5({str(fifo)!r}, {INPUTS!r}))\n"
        "except UserError as e:\n    print(e)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    expected = f"{fifo}: is a FIFO, device or socket, not a regular file; put a file there"
    assert done.stdout.strip() == expected, done.stderr
    assert issubclass(FormatError, UserError)
