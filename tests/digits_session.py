"""The digits model on the device: the model, its data and the session that test_session.py and
test_session_storage.py open (auto-compilation after RECORDS recorded runs)."""

from pathlib import Path

import numpy as np

from onebuild import Session
from onebuild.npz import read_npz

DIGITS = Path(__file__).parent.parent / "examples" / "digits"
SHAPES = {"input": [1, 1, 8, 8]}
RECORDS = 12


def digits_session(workspace, records: int = RECORDS) -> Session:
    session = Session(DIGITS / "digits.onnx", workspace=workspace, input_shapes=SHAPES)
    session.set_odc_param_minmax_records_count(records)
    return session


def digits_data(name: str, key: str = "input") -> np.ndarray:
    """`examples/digits/data/<name>.npz`'s array `key`."""
    return read_npz(DIGITS / "data" / f"{name}.npz")[key]
