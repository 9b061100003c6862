"""Hostile files through the real CLI (harness: tests/hostile_cli.py): npz inputs of `run` on a
float IR file, a quantized IR file and a `.tvn`; `.tvn` and IR files re-sealed with a valid
checksum around wrong JSON types and out-of-range values, through `inspect` and `run`; recipe
builds whose calibration data is hostile. Every case must fail in one line naming the file (and
where it says so, the field, input or sample), under the harness's address-space limit.

The valid base artifacts are built once per module with the CLI (`onebuild import` of the
digits model, `onebuild build` of a copy of examples/digits_npu.toml); cases are generated
deterministically from them.
"""

import dataclasses
import functools
import hashlib
import io
import json
import re
import shutil
import struct
import warnings
import zipfile
import zlib
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from hostile_cli import Case, check_clean_failure, materialize, run_cli

from onebuild.npz import npz_bytes

ROOT = Path(__file__).parent.parent
DIGITS = ROOT / "examples" / "digits"
BASE: dict[str, Path] = {}  # filled by the `base` fixture: d.obir, q.obir, m.tvn, ok.npz
DETAILS: dict[str, str] = {}  # case id -> what its error line must name besides the file


def _case(id: str, argv: list[str], setup, mentions: str, detail: str, codes=(2,)) -> Case:
    DETAILS[id] = detail
    return Case(id, argv, setup=setup, mentions=mentions, codes=codes)


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("base")
    shutil.copytree(DIGITS, folder / "digits")
    recipe = (ROOT / "examples" / "digits_npu.toml").read_text()
    recipe = recipe.replace('"../build/digits_npu"', '"build"').replace('"../out/', '"out/')
    (folder / "npu.toml").write_text(recipe)
    for argv in (
        ["import", "digits/digits.onnx", "-o", "d.obir", "--input-shape", "input=1,1,8,8"],
        ["build", "npu.toml"],
    ):
        result = run_cli(argv, folder)
        assert result.returncode == 0, result.stderr.decode()
    BASE.update(
        {
            "d.obir": folder / "d.obir",
            "q.obir": folder / "build" / "quantize.obir",
            "m.tvn": folder / "build" / "codegen.tvn",
            "ok.npz": folder / "ok.npz",
            "digits": folder / "digits",
        }
    )
    (folder / "ok.npz").write_bytes(npz_bytes({"input": _samples()}))
    return BASE


# -- npz and npy builders ----------------------------------------------------------------------
def _samples(n: int = 3) -> np.ndarray:
    return (np.arange(n * 64, dtype=np.float32).reshape(n, 1, 1, 8, 8) % 17) / 16


def _npy(array: np.ndarray, header: dict | None = None, version=(1, 0)) -> bytes:
    """A .npy file; `header` replaces the header dict (written verbatim, as numpy would)."""
    buffer = io.BytesIO()
    if header is None:
        # writing only: object arrays become hostile fixtures onebuild must refuse to read
        np.lib.format.write_array(buffer, array, version=version, allow_pickle=True)
        return buffer.getvalue()
    text = repr(header).encode("latin1")
    text += b" " * (-(len(text) + 11) % 64) + b"\n"
    return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(text)) + text + array.tobytes()


def _zip(members: list[tuple[str, bytes]], method: int = zipfile.ZIP_STORED) -> bytes:
    buffer = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # duplicate names are the point of one case
        with zipfile.ZipFile(buffer, "w", compression=method) as archive:
            for name, data in members:
                archive.writestr(zipfile.ZipInfo(name, (1980, 1, 1, 0, 0, 0)), data)
    return buffer.getvalue()


def _patch_zip(data: bytes, **fields) -> bytes:
    """Overwrite fields of the first member's local header and central directory entry:
    `flag`, `method`, `crc`, `size` (uncompressed) in both."""
    data = bytearray(data)
    central = data.rindex(b"PK\x01\x02")
    for at, offsets in ((0, (6, 8, 14, 22)), (central, (8, 10, 16, 24))):
        for key, offset in zip(("flag", "method", "crc", "size"), offsets):
            if key in fields:
                fmt = "<I" if key in ("crc", "size") else "<H"
                struct.pack_into(fmt, data, at + offset, fields[key])
    return bytes(data)


@functools.cache
def _bomb() -> bytes:
    """2 MiB of deflate that expands to a 2 GiB float32 array (a valid zip, correct CRC)."""
    chunk, total = 1 << 24, 1 << 31
    header = io.BytesIO()
    shape = ((total - 128) // 4,)
    np.lib.format.write_array_header_1_0(
        header, {"descr": "<f4", "fortran_order": False, "shape": shape}
    )
    first = header.getvalue() + b"\0" * (chunk - len(header.getvalue()))
    packer = zlib.compressobj(9, zlib.DEFLATED, -15)
    parts = [packer.compress(first) + packer.flush(zlib.Z_FULL_FLUSH)]
    zeros = packer.compress(b"\0" * chunk) + packer.flush(zlib.Z_FULL_FLUSH)
    parts += [zeros] * (total // chunk - 1) + [packer.flush()]
    crc = zlib.crc32(first)
    for _ in range(total // chunk - 1):
        crc = zlib.crc32(b"\0" * chunk, crc)
    body, name = b"".join(parts), b"input.npy"
    local = struct.pack("<4sHHHHHIIIHH", b"PK\x03\x04", 20, 0, 8, 0, 33, crc, len(body), total,
                        len(name), 0) + name  # fmt: skip
    central = struct.pack("<4sHHHHHHIIIHHHHHII", b"PK\x01\x02", 20, 20, 0, 8, 0, 33, crc,
                          len(body), total, len(name), 0, 0, 0, 0, 0, 0) + name  # fmt: skip
    end = struct.pack("<4sHHHHIIH", b"PK\x05\x06", 0, 0, 1, 1, len(central),
                      len(local) + len(body), 0)  # fmt: skip
    return local + body + central + end


X = _samples()
GOOD_NPY = _npy(X)
C_ORDER = {"descr": "<f4", "fortran_order": False}
EVIL_HEADER = GOOD_NPY[:10] + b"{'descr': __import__('os').getcwd()}".ljust(117) + b"\n"


def _header(**header) -> bytes:
    """An npz whose one member has the header dict `header` (and the samples' data)."""
    return _zip([("input.npy", _npy(X, header))])


def _with_value(index: tuple, value) -> np.ndarray:
    x = _samples()
    x[index] = value
    return x


# (id, content, what the error must name besides the file, or "" for the file alone)
NPZ_CASES: list[tuple[str, Callable[[], bytes], str]] = [
    ("empty-file", lambda: b"", "not an npz"),
    ("random-bytes", lambda: bytes(range(256)) * 4, "not an npz"),
    ("npy-named-npz", lambda: GOOD_NPY, "single .npy"),
    ("zero-samples", lambda: npz_bytes({"input": np.zeros((0, 1, 1, 8, 8), np.float32)}), "0 "),
    ("no-arrays", lambda: _zip([]), "no arrays"),
    ("scalar", lambda: npz_bytes({"input": np.float32(1)}), "shape"),
    ("duplicate-member", lambda: _zip([("input.npy", GOOD_NPY)] * 2), "twice"),
    ("not-npy-member", lambda: _zip([("input.txt", b"1 2 3")]), "input.txt"),
    ("directory-member", lambda: _zip([("input.npy/", b"")]), "input.npy/"),
    ("object-dtype", lambda: _zip([("input.npy", _npy(np.array([1, "a"], object)))]), "object"),
    ("structured-dtype", lambda: _zip([("input.npy", _npy(np.zeros(3, "i4,f4")))]), "dtype"),
    ("datetime-dtype", lambda: _zip([("input.npy", _npy(np.zeros(3, "M8[s]")))]), "dtype"),
    ("truncated-member", lambda: _zip([("input.npy", GOOD_NPY[:500])]), "truncated"),
    ("trailing-bytes", lambda: _zip([("input.npy", GOOD_NPY + b"\0" * 64)]), "needs"),
    ("truncated-zip", lambda: npz_bytes({"input": X})[:700], ""),
    ("bad-crc", lambda: _patch_zip(npz_bytes({"input": X}), crc=1234), "input.npy"),
    ("encrypted-flag", lambda: _patch_zip(npz_bytes({"input": X}), flag=1), "encrypted"),
    ("unknown-compression", lambda: _patch_zip(npz_bytes({"input": X}), method=99), ""),
    ("lying-size", lambda: _patch_zip(npz_bytes({"input": X}), size=1 << 30), "declares"),
    ("header-missing-shape", lambda: _header(descr="<f4", fortran_order=False), "header"),
    ("header-extra-key", lambda: _header(**C_ORDER, shape=X.shape, evil=1), "header"),
    ("header-negative-dim", lambda: _header(**C_ORDER, shape=(-3, 1, 1, 8, 8)), "shape"),
    ("header-overflowing-shape", lambda: _header(**C_ORDER, shape=(1 << 40,) * 3), ""),
    ("header-bad-descr", lambda: _header(descr="<q9", fortran_order=False, shape=X.shape), ""),
    ("header-call", lambda: _zip([("input.npy", EVIL_HEADER)]), "header"),
    (
        "header-fortran-not-bool",
        lambda: _header(descr="<f4", fortran_order="yes", shape=X.shape),
        "header",
    ),
    ("wrong-input-name", lambda: npz_bytes({"image": X}), "input"),
    ("wrong-shape", lambda: npz_bytes({"input": X.reshape(3, 64)}), "shape"),
    ("string-dtype", lambda: npz_bytes({"input": np.full((3, 1, 1, 8, 8), "1.5")}), "dtype"),
    ("zip-bomb", lambda: _bomb(), "1.0 GiB"),
]
NON_FINITE = [
    ("nan-sample-2", lambda: npz_bytes({"input": _with_value((2, 0, 0, 3, 3), np.nan)}),
     "sample 2"),
    ("inf-sample-1", lambda: npz_bytes({"input": _with_value((1, 0, 0, 0, 0), np.inf)}),
     "sample 1"),
    ("minus-inf-sample-0", lambda: npz_bytes({"input": _with_value((0,), -np.inf)}), "sample 0"),
]  # fmt: skip
MODELS = {"float": "d.obir", "quantized": "q.obir", "tvn": "m.tvn"}


def _run_case(kind: str, name: str, content: Callable[[], bytes], detail: str) -> Case:
    def setup(folder: Path) -> None:
        (folder / "x.npz").write_bytes(content())

    argv = ["run", f"@{MODELS[kind]}", "-i", "{tmp}/x.npz", "-o", "{tmp}/y.npz"]
    return _case(f"run-{kind}-{name}", argv, setup, "x.npz", detail)


# Cases about the data's meaning run against every model; the rest (the file itself is broken)
# are the same whatever reads them, so each runs against one model, in turn.
PER_MODEL = {
    "zero-samples",
    "scalar",
    "wrong-input-name",
    "wrong-shape",
    "string-dtype",
    "zip-bomb",
}
RUN_CASES = [
    _run_case(kind, *case)
    for i, case in enumerate(NPZ_CASES)
    for kind in (MODELS if case[0] in PER_MODEL else [list(MODELS)[i % 3]])
]
RUN_CASES += [_run_case(kind, *case) for case in NON_FINITE for kind in ("quantized", "tvn")]


def _check(case: Case, base: dict, folder: Path) -> str:
    """Run `case` with `@NAME` arguments replaced by the base artifact NAME; the error line
    must also name the case's detail."""
    detail = DETAILS[case.id]
    argv = [str(base[a[1:]]) if a.startswith("@") else a for a in case.argv]
    case = dataclasses.replace(case, argv=argv)
    line = _build_failure(case, folder) if argv[0] == "build" else check_clean_failure(case, folder)
    assert detail in line, f"{case.id}: expected {detail!r} in: {line}"
    return line


PROGRESS = re.compile(r"^\[[^\]]+\] [^:]+: ")  # the build's per-step progress lines


def _build_failure(case: Case, folder: Path) -> str:
    """check_clean_failure for `onebuild build`, whose step progress lines ("[calibrate]
    r.toml: running") also go to stderr: they are set aside, the rest is checked the same way."""
    argv = materialize(case, folder)
    result = run_cli(argv, folder)
    stderr = result.stderr.decode(errors="replace")
    context = f"{case.id}: onebuild {' '.join(argv)} -> exit {result.returncode}\n{stderr}"
    assert result.returncode in case.codes and "Traceback" not in stderr, context
    lines = [line for line in stderr.splitlines() if line.strip() and not PROGRESS.match(line)]
    assert len(lines) == 1 and lines[0].startswith("onebuild: error: "), context
    assert case.mentions in lines[0], context
    return lines[0]


@pytest.mark.parametrize("case", RUN_CASES, ids=lambda c: c.id)
def test_hostile_npz_inputs(case, base, tmp_path):
    _check(case, base, tmp_path)


def test_fortran_order_and_big_endian_inputs_read_as_their_values(base, tmp_path):
    """Not hostile, just unusual: same outputs as the plain C-order little-endian file."""
    files = {
        "c.npz": npz_bytes({"input": X}),
        "f.npz": _zip([("input.npy", _npy(np.asfortranarray(X)))]),
        "b.npz": _zip([("input.npy", _npy(X.astype(">f4")))]),
    }
    outputs = []
    for name, data in files.items():
        (tmp_path / name).write_bytes(data)
        argv = ["run", str(base["m.tvn"]), "-i", name, "-o", f"{name}.out.npz"]
        assert run_cli(argv, tmp_path).returncode == 0
        outputs.append((tmp_path / f"{name}.out.npz").read_bytes())
    assert outputs[0] == outputs[1] == outputs[2]


# -- .tvn and IR files re-sealed around bad fields ---------------------------------------------
def _reseal_tvn(data: bytes, edit: Callable[[dict, dict], None]) -> bytes:
    """Decode the META and LAYERS JSON of a .tvn, let `edit(meta, layers)` change them, and
    rebuild the file with a valid checksum (the layout of docs/tvn-format.md)."""
    count = struct.unpack_from("<I", data, 8)[0]
    sections = []
    for i in range(count):
        kind, _, offset, size = struct.unpack_from("<IIQQ", data, 16 + 24 * i)
        sections.append([kind, data[offset : offset + size]])
    trees = {kind: json.loads(blob) for kind, blob in sections if kind in (1, 3)}
    edit(trees[1], trees[3])
    for section in sections:
        if section[0] in trees:
            section[1] = json.dumps(trees[section[0]], sort_keys=True).encode()
    start = -(-(16 + 24 * count) // 16) * 16
    table, body = b"", b""
    for kind, blob in sections:
        table += struct.pack("<IIQQ", kind, 0, start + len(body), len(blob))
        body += blob + b"\0" * (-len(blob) % 16)
    content = data[:16] + table
    content += b"\0" * (start - len(content)) + body
    return content + hashlib.sha256(content).digest()


def _reseal_ir(data: bytes, edit: Callable[[dict], None]) -> bytes:
    _, _, _, length, offset, size = struct.unpack_from("<8sIIQQQ", data)
    header = json.loads(data[40 : 40 + length])
    edit(header)
    text = json.dumps(header, sort_keys=True, separators=(",", ":")).encode()
    start = -(-(40 + len(text)) // 64) * 64
    body = struct.pack("<8sIIQQQ", data[:8], 1, 0, len(text), start, size) + text
    body += b"\0" * (start - len(body)) + data[offset : offset + size]
    return body + hashlib.sha256(body).digest()


def _set(path: str, value, *more) -> Callable:
    """An edit setting the dotted `path` (list indices as numbers; `M.`/`L.` pick a .tvn's
    META or LAYERS) to `value` (`...` deletes the key), then the further (path, value) pairs."""
    pairs = [(path, value), *zip(more[::2], more[1::2])]

    def edit(*trees) -> None:
        for path, value in pairs:
            keys = [int(k) if k.isdigit() else k for k in path.split(".")]
            node = trees[1] if keys[0] == "L" else trees[0]
            rest = keys[1:] if keys[0] in ("M", "L") else keys
            for key in rest[:-1]:
                node = node[key]
            if value is ...:
                del node[rest[-1]]
            else:
                node[rest[-1]] = value

    return edit


TVN_EDITS = [
    ("zero-point-out-of-range", "L.tensors.input.zero_point", 300, "zero_point"),
    ("negative-dim", "L.tensors.input.dims", [1, -1, 8, 8], "dims"),
    ("huge-dims", "L.tensors.input.dims", [1 << 40, 1 << 40, 1, 1], "dims"),
    ("scale-zero", "L.tensors.input.scale", 0.0, "scale"),
    ("scale-string", "L.tensors.input.scale", "0.1", "scale"),
    ("dtype-float", "L.tensors.input.dtype", "float32", "dtype"),
    ("stride-zero", "L.layers.0.attrs.strides", [0, 1], "strides"),
    ("negative-pad", "L.layers.0.attrs.pads", [-1, 0, 0, 0], "pads"),
    ("group-bool", "L.layers.0.attrs.group", True, "group"),
    ("x-zero-point-range", "L.layers.0.attrs.x_zero_point", 1000, "x_zero_point"),
    ("qmin-above-qmax", "L.layers.0.attrs.qmin", 9, "qmin", "L.layers.0.attrs.qmax", 3),
    ("no-layers", "L.layers", [], "layers"),
    ("unknown-tensor", "L.layers.0.inputs", ["ghost"], "inputs"),
    ("dict-as-name", "L.layers.0.name", {"a": 1}, "name"),
    ("dict-as-input-name", "L.inputs", [{"x": 1}], "inputs"),
    ("negative-array-offset", "L.layers.0.arrays.weights.0", -16, "arrays"),
    ("negative-arena", "L.arena_bytes", -1, "arena_bytes"),
    ("deleted-dram", "L.tensors.input.dram", ..., "dram"),
    ("added-key", "L.tensors.input.extra", 1, "extra"),
    ("meta-hardware-number", "M.hardware", 5, "hardware"),
    ("unknown-preset", "M.hardware", "trix-xxl", "trix-xxl"),
]
IR_EDITS = [
    ("empty-graphs", "graphs", [], "graphs"),
    ("no-outputs", "graphs.0.outputs", [], "outputs"),
    ("missing-value", "graphs.0.nodes.1.inputs.0", "ghost", "ghost"),
    ("dict-as-name", "graphs.0.nodes.1.inputs.0", {"x": 1}, "inputs"),
    ("negative-dim", "graphs.0.inputs.0.shape", [1, -1, 8, 8], "shape"),
    ("int64-overflow", "graphs.0.inputs.0.shape", [1 << 40, 1 << 40, 1 << 40], "shape"),
    ("too-large", "graphs.0.inputs.0.shape", [1, 1, 1 << 20, 1 << 20], "shape"),
    ("stride-zero", "graphs.0.nodes.1.attrs.strides", [0, 1], "strides"),
    ("zero-point-range", "graphs.0.nodes.0.attrs.zero_point", [300], "zero_point"),
    ("weight-zero-point", "graphs.0.constants.0.quant.zero_point.0", 200, "zero_point"),
    ("negative-nbytes", "graphs.0.constants.0.nbytes", -1, "nbytes"),
    ("offset-outside", "graphs.0.constants.0.offset", 1 << 40, "offset"),
    ("version-string", "version", "1", "version"),
    ("attrs-list", "graphs.0.nodes.1.attrs", [], "attrs"),
    ("deleted-op", "graphs.0.nodes.1.op", ..., "op"),
    ("unknown-op", "graphs.0.nodes.1.op", "Bogus", "Bogus"),
    ("added-key", "graphs.0.extra", 1, "extra"),
    ("duplicate-name", "graphs.0.nodes.1.outputs.0.name", "input", "twice"),
    ("scale-zero", "graphs.0.nodes.0.attrs.scale", [0.0], "scale"),
    ("qmin-above-qmax", "graphs.0.nodes.1.attrs.qmin", 9, "qmin", "graphs.0.nodes.1.attrs.qmax", 3),
    ("per-channel-count", "graphs.0.nodes.1.attrs.multiplier", [1, 2, 3], "multiplier"),
    ("dtype-number", "graphs.0.inputs.0.dtype", 5, "dtype"),
]


def _file_case(kind: str, name: str, edit: Callable, detail: str, command: str) -> Case:
    target = "bad.tvn" if kind == "tvn" else "bad.obir"

    def setup(folder: Path) -> None:
        data = BASE["m.tvn" if kind == "tvn" else "q.obir"].read_bytes()
        resealed = _reseal_tvn(data, edit) if kind == "tvn" else _reseal_ir(data, edit)
        (folder / target).write_bytes(resealed)
        (folder / "ok.npz").write_bytes(BASE["ok.npz"].read_bytes())

    argv = ["inspect", target] if command == "inspect" else ["run", target, "-i", "ok.npz",
                                                               "-o", "y.npz"]  # fmt: skip
    return _case(f"{command}-{kind}-{name}", argv, setup, target, detail)


FILE_CASES = [
    _file_case(kind, name, _set(path, value, *more), detail, command)
    for kind, edits in (("tvn", TVN_EDITS), ("ir", IR_EDITS))
    for i, (name, path, value, detail, *more) in enumerate(edits)
    for command in (("inspect", "run") if i % 3 == 0 else ("inspect",) if i % 2 else ("run",))
]


def _raw_case(kind: str, name: str, change: Callable[[bytes], bytes], detail: str) -> Case:
    target = "bad.tvn" if kind == "tvn" else "bad.obir"

    def setup(folder: Path) -> None:
        source = BASE["m.tvn" if kind == "tvn" else "q.obir"].read_bytes()
        with open(folder / target, "wb") as handle:
            handle.write(change(source))
            if change is _sparse:
                handle.truncate(3 << 29)  # 1.5 GiB, no disk blocks

    return _case(f"inspect-{kind}-{name}", ["inspect", target], setup, target, detail)


def _sparse(data: bytes) -> bytes:
    """The file's first 64 bytes; `setup` then extends it to 1.5 GiB of (sparse) zeros."""
    return data[:64]


def _flip(data: bytes) -> bytes:
    return data[:100] + bytes([data[100] ^ 0x20]) + data[101:]


RAW_CASES = [
    _raw_case(kind, name, change, detail)
    for kind in ("tvn", "ir")
    for name, change, detail in (
        ("flipped-byte", _flip, "checksum"),
        ("truncated", lambda d: d[: len(d) // 2], ""),
        ("empty", lambda d: d[:4], ""),
        ("huge-sparse", _sparse, ""),
    )
]


@pytest.mark.parametrize("case", FILE_CASES + RAW_CASES, ids=lambda c: c.id)
def test_hostile_tvn_and_ir_files(case, base, tmp_path):
    _check(case, base, tmp_path)


# -- recipe builds with hostile calibration data -----------------------------------------------
RECIPE = """
[import]
source = "{digits}/digits.onnx"
input_shapes = {{ input = [1, 1, 8, 8] }}
[optimize]
[quantize]
calibration = "{calibration}"
"""
CALIBRATION = [
    ("zero-samples", NPZ_CASES[3][1], "bad.npz"),
    ("npy-named-npz", NPZ_CASES[2][1], "single .npy"),
    ("duplicate-member", NPZ_CASES[6][1], "twice"),
    ("object-dtype", NPZ_CASES[9][1], "object"),
    ("truncated-member", NPZ_CASES[12][1], "truncated"),
    ("zip-bomb", _bomb, "1.0 GiB"),
    ("nan", NON_FINITE[0][1], "sample 2"),
    ("overflowing-3e38", lambda: npz_bytes({"input": _with_value((1, 0, 0, 4, 4), 3e38)}),
     "sample 1"),
    ("lying-size", NPZ_CASES[18][1], "declares"),
]  # fmt: skip


def _build_case(name: str, content: Callable[[], bytes], detail: str, folder_data: bool) -> Case:
    calibration = "calib" if folder_data else "bad.npz"

    def setup(folder: Path) -> None:
        target = folder / "calib" / "bad.npz" if folder_data else folder / "bad.npz"
        target.parent.mkdir(exist_ok=True)
        target.write_bytes(content())
        digits = BASE["digits"]
        (folder / "r.toml").write_text(RECIPE.format(digits=digits, calibration=calibration))

    name = f"build-{'folder-' if folder_data else ''}{name}"
    return _case(name, ["build", "r.toml"], setup, "bad.npz", detail, codes=(2,))


BUILD_CASES = [_build_case(*case, folder_data=False) for case in CALIBRATION]
BUILD_CASES += [_build_case(*CALIBRATION[i], folder_data=True) for i in (0, 6, 7)]


def _npy_in_folder(folder: Path) -> None:
    (folder / "calib").mkdir()
    (folder / "calib" / "a.npz").write_bytes(npz_bytes({"input": X}))
    (folder / "calib" / "bad.npy").write_bytes(_npy(np.array([{"a": 1}, 2], object)))
    digits = BASE["digits"]
    (folder / "r.toml").write_text(RECIPE.format(digits=digits, calibration="calib"))


BUILD_CASES.append(
    _case("build-folder-object-npy", ["build", "r.toml"], _npy_in_folder, "bad.npy", "pickle")
)  # fmt: skip


@pytest.mark.parametrize("case", BUILD_CASES, ids=lambda c: c.id)
def test_hostile_calibration_data(case, base, tmp_path):
    _check(case, base, tmp_path)


def test_corpus_size():
    total = len(RUN_CASES) + len(FILE_CASES) + len(RAW_CASES) + len(BUILD_CASES)
    assert 80 <= total <= 150, total
