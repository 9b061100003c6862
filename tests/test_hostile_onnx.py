"""Hostile ONNX models through the real CLI: every one exits 2 with one line naming the file and
the node (or tensor) at fault, never a traceback (harness: tests/hostile_cli.py).

Cases are generated deterministically: each bad attribute or operand over several values and
several ops, external data references broken every way, tensors with impossible dims, wrong
attribute types, tensor names defined twice. Commands rotate over `inspect`, `import` and `run`.
"""

import io
import itertools
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import onnx
import pytest
from hostile_cli import Case, check_clean_failure
from onnx import TensorProto, helper, numpy_helper

X_SHAPE = [1, 4, 8, 8]
COMMANDS = itertools.cycle(
    [
        ["inspect", "{tmp}/m.onnx"],
        ["import", "{tmp}/m.onnx", "-o", "{tmp}/m.obir"],
        ["run", "{tmp}/m.onnx", "-i", "{tmp}/in.npz", "-o", "{tmp}/out.npz"],
    ]
)


def _inputs_npz() -> bytes:
    buffer = io.BytesIO()
    np.savez(buffer, x=np.zeros([1, *X_SHAPE], np.float32))
    return buffer.getvalue()


INPUTS = _inputs_npz()


def model_bytes(nodes, inits=(), value_info=(), opset=17, outputs=("y",), x_shape=X_SHAPE) -> bytes:
    graph = helper.make_graph(
        nodes,
        "hostile",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_shape)],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in outputs],
        [i if isinstance(i, TensorProto) else numpy_helper.from_array(*i) for i in inits],
        value_info=list(value_info),
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    return model.SerializeToString()


def case(id_, nodes, mentions, inits=(), extra_files=None, **kw) -> Case:
    files = {"m.onnx": model_bytes(nodes, inits, **kw), "in.npz": INPUTS, **(extra_files or {})}
    return Case(id_, list(next(COMMANDS)), files, "{tmp}/m.onnx: " + mentions, codes=(2,))


def node_case(id_, op, inputs=("x",), inits=(), opset=17, **attrs) -> Case:
    """x -> op (named after the case) -> y; the error must name that node."""
    name = f"bad_{id_}"
    node = helper.make_node(op, list(inputs), ["y"], name=name, **attrs)
    return case(id_, [node], f"node '{name}' ({op})", inits, opset=opset)


def _w(shape) -> tuple[np.ndarray, str]:
    return np.full(shape, 0.1, np.float32), "w"


# -- windows: Conv, ConvTranspose, MaxPool, AveragePool ----------------------------------------
WINDOW_OPS = {
    "Conv": (("x", "w"), [_w([4, 4, 3, 3])], {}),
    "ConvTranspose": (("x", "w"), [_w([4, 4, 3, 3])], {}),
    "MaxPool": (("x",), [], {"kernel_shape": [3, 3]}),
    "AveragePool": (("x",), [], {"kernel_shape": [3, 3]}),
}
BAD_WINDOWS = {
    "strides": ([0, 1], [-1, 1], [2]),
    "dilations": ([0, 1], [1, -2]),
    "pads": ([0, 0, 0, -2], [1, 1]),
    "kernel_shape": ([0, 3], [5, 5], [3]),  # [5, 5]: not W's, or wider than x
}
POOLS = ("MaxPool", "AveragePool")


def window_cases():
    for (op, (inputs, inits, base)), (attr, values) in itertools.product(
        WINDOW_OPS.items(), BAD_WINDOWS.items()
    ):
        if attr == "dilations" and op == "AveragePool":
            continue  # AveragePool has dilations from opset 19: tested below
        for i, value in enumerate(values):
            if attr == "kernel_shape" and value == [5, 5] and op in POOLS:
                value = [9, 9]
            attrs = {**base, attr: value}
            yield node_case(f"{op}_{attr}_{i}", op, inputs, inits, **attrs)
    yield node_case("AveragePool_dilations_19", "AveragePool", opset=19, kernel_shape=[3, 3],
                    dilations=[0, 1])  # fmt: skip
    for op in ("Conv", "ConvTranspose"):
        yield node_case(f"{op}_without_weight", op, ["x"])
        yield node_case(f"{op}_empty_weight_name", op, ["x", ""])
        yield node_case(f"{op}_weight_rank", op, ["x", "w"], [_w([4, 4, 3])])
        yield node_case(f"{op}_group_0", op, ["x", "w"], [_w([4, 4, 3, 3])], group=0)
    yield node_case("Conv_group_3", "Conv", ["x", "w"], [_w([3, 1, 3, 3])], group=3)
    yield node_case("MaxPool_without_kernel", "MaxPool")


# -- block and window sizes, axes, indices -----------------------------------------------------
def size_cases():
    for op in ("DepthToSpace", "SpaceToDepth"):
        for value in (0, -2, 3):
            yield node_case(f"{op}_blocksize_{value}", op, blocksize=value)
        yield node_case(f"{op}_without_blocksize", op)
    for value in (0, -3):
        yield node_case(f"LRN_size_{value}", "LRN", size=value)
    yield node_case("LRN_without_size", "LRN")


def axis_cases():
    yield node_case("Concat_without_axis", "Concat", ["x", "x"])
    for value in (4, -5):
        yield node_case(f"Concat_axis_{value}", "Concat", ["x", "x"], axis=value)
    for value in (99, -99):
        yield node_case(f"Flatten_axis_{value}", "Flatten", axis=value)
    for op in ("Softmax", "LogSoftmax", "Split", "Gather", "ArgMax"):
        inputs = ["x", "i"] if op == "Gather" else ["x"]
        inits = [(np.asarray([0], np.int64), "i")] if op == "Gather" else []
        yield node_case(f"{op}_axis_9", op, inputs, inits, axis=9)
    for value in (5,):
        yield node_case(f"Transpose_perm_{value}", "Transpose", perm=[0, 1, 2, value])


def index_cases():
    for axis, indices in ((1, [4]), (1, [-5]), (1, [[0, 100]]), (2, [0, 1, -9])):
        data = (np.asarray(indices, np.int64), "i")
        yield node_case(f"Gather_index_{axis}_{indices}", "Gather", ["x", "i"], [data], axis=axis)
    table = (np.arange(3, dtype=np.float32), "t")
    yield case(
        "Gather_constant_table_index",
        [
            helper.make_node("Gather", ["t", "i"], ["g"], name="bad_lookup"),
            helper.make_node("Add", ["x", "g"], ["y"], name="add"),
        ],
        "node 'bad_lookup' (Gather)",
        [table, (np.asarray([5], np.int64), "i")],
    )


# -- operands: shapes, sizes and element types the op cannot take ------------------------------
def _i64(*values):
    return np.asarray(values, np.int64)


def _f32(*values):
    return np.asarray(values, np.float32)


def operand_cases():
    w = np.full((4, 4, 3, 3), 0.1, np.float32)
    for name, op, inputs, inits, attrs in [
        ("Pad_crops_everything", "Pad", ["x", "p"], {"p": _i64(0, 0, -20, 0, 0, 0, 0, 0)}, {}),
        ("Resize_scale_0", "Resize", ["x", "", "s"], {"s": _f32(1, 1, 0, 1)}, {}),
        ("Resize_scale_negative", "Resize", ["x", "", "s"], {"s": _f32(1, 1, -2, 1)}, {}),
        ("Resize_sizes_0", "Resize", ["x", "", "", "s"], {"s": _i64(1, 4, 0, 8)}, {}),
        ("Resize_sizes_short", "Resize", ["x", "", "", "s"], {"s": _i64(1, 4)}, {}),
        ("Split_negative", "Split", ["x", "s"], {"s": _i64(6, -2)}, {"axis": 1}),
        ("Tile_negative", "Tile", ["x", "r"], {"r": _i64(1, -1, 1, 1)}, {}),
        ("Tile_short", "Tile", ["x", "r"], {"r": _i64(1, 2)}, {}),
        ("ConvTranspose_output_padding", "ConvTranspose", ["x", "w"], {"w": w},
         {"output_padding": [-1, 0]}),
        ("Conv_bias_size", "Conv", ["x", "w", "b"], {"w": w, "b": _f32(1, 2)}, {}),
        ("BatchNormalization_scale_size", "BatchNormalization", ["x", "s", "s", "s", "s"],
         {"s": _f32(1, 1, 1)}, {}),
        ("InstanceNormalization_scale_size", "InstanceNormalization", ["x", "s", "s"],
         {"s": _f32(1, 2)}, {}),
        ("LayerNormalization_scale_shape", "LayerNormalization", ["x", "s"],
         {"s": _f32(1, 2, 3)}, {}),
        ("Unsqueeze_repeated_axis", "Unsqueeze", ["x", "a"], {"a": _i64(0, 0)}, {}),
        ("Slice_lengths_differ", "Slice", ["x", "s", "e"], {"s": _i64(0, 0), "e": _i64(1)}, {}),
        ("Slice_repeated_axis", "Slice", ["x", "s", "e", "a"],
         {"s": _i64(0, 0), "e": _i64(1, 1), "a": _i64(1, 1)}, {}),
        ("MaxPool_pads_wider_than_kernel", "MaxPool", ["x"], {},
         {"kernel_shape": [2, 2], "pads": [2, 2, 2, 2]}),
        ("Where_float_condition", "Where", ["x", "x", "x"], {}, {}),
        ("Gather_float_indices", "Gather", ["x", "i"], {"i": _f32(1)}, {"axis": 1}),
        ("Add_float_and_int64", "Add", ["x", "i"], {"i": _i64(1)}, {}),
        ("Cast_to_unknown_type", "Cast", ["x"], {}, {"to": 999}),
    ]:  # fmt: skip
        yield node_case(name, op, inputs, [(a, n) for n, a in inits.items()], **attrs)
    for name, op, operands in [
        ("Range_delta_0", "Range", [np.float32(0), np.float32(5), np.float32(0)]),
        ("Range_too_long", "Range", [np.float32(0), np.float32(1e12), np.float32(1)]),
        ("ConstantOfShape_negative", "ConstantOfShape", [_i64(-1, 8)]),
        ("ConstantOfShape_absurd", "ConstantOfShape", [_i64(1 << 40, 1 << 40)]),
    ]:
        names = [f"c{i}" for i in range(len(operands))]
        nodes = [
            helper.make_node(op, names, ["k"], name=f"bad_{name}"),
            helper.make_node("Add", ["x", "k"], ["y"], name="add"),
        ]
        inits = [(np.asarray(a), n) for a, n in zip(operands, names)]
        yield case(name, nodes, f"node 'bad_{name}' ({op})", inits)


# -- wrong attribute types ---------------------------------------------------------------------
def _attr(name, value, kind) -> onnx.AttributeProto:
    """An attribute of an explicit type (helper.make_attribute infers it from the value)."""
    attr = helper.make_attribute(name, value)
    assert attr.type == kind
    return attr


TYPE_CASES = [
    ("Conv", ["x", "w"], [_w([4, 4, 3, 3])], "strides", [1.0, 1.0]),
    ("Conv", ["x", "w"], [_w([4, 4, 3, 3])], "group", 1.0),
    ("Conv", ["x", "w"], [_w([4, 4, 3, 3])], "auto_pad", [1]),
    ("Concat", ["x", "x"], [], "axis", 1.0),
    ("Flatten", ["x"], [], "axis", "1"),
    ("Gather", ["x", "i"], [(np.asarray([0], np.int64), "i")], "axis", [1]),
    ("LeakyRelu", ["x"], [], "alpha", "0.1"),
    ("Cast", ["x"], [], "to", "float"),
    ("MaxPool", ["x"], [], "kernel_shape", "3,3"),
    ("Transpose", ["x"], [], "perm", [0.0, 1.0, 2.0, 3.0]),
    ("DepthToSpace", ["x"], [], "blocksize", 2.0),
    ("LRN", ["x"], [], "size", 2.5),
    ("Softmax", ["x"], [], "axis", [1]),
    ("Elu", ["x"], [], "alpha", [1.0]),
]


def type_cases():
    for op, inputs, inits, attr, value in TYPE_CASES:
        name = f"bad_{op}_{attr}_type"
        node = helper.make_node(op, inputs, ["y"], name=name)
        if op == "MaxPool" and attr != "kernel_shape":
            node.attribute.append(helper.make_attribute("kernel_shape", [3, 3]))
        if op == "LRN" and attr != "size":
            node.attribute.append(helper.make_attribute("size", 3))
        node.attribute.append(helper.make_attribute(attr, value))
        yield case(f"{op}_{attr}_as_{type(value).__name__}", [node], f"node '{name}'", inits)
    tensor_as_string = helper.make_node("Constant", [], ["k"], name="bad_constant")
    tensor_as_string.attribute.append(helper.make_attribute("value", "abc"))
    yield case(
        "Constant_value_as_string",
        [tensor_as_string, helper.make_node("Add", ["x", "k"], ["y"], name="add")],
        "node 'bad_constant' (Constant)",
    )
    untyped = helper.make_node("Relu", ["x"], ["y"], name="bad_untyped")
    untyped.attribute.add(name="alpha")
    yield case("Relu_untyped_attribute", [untyped], "node 'bad_untyped' (Relu)")
    untyped = helper.make_node("LeakyRelu", ["x"], ["y"], name="bad_untyped_alpha")
    untyped.attribute.add(name="alpha")
    yield case("LeakyRelu_untyped_alpha", [untyped], "node 'bad_untyped_alpha' (LeakyRelu)")
    negative = TensorProto(name="v", data_type=TensorProto.FLOAT, dims=[-1, 2], raw_data=b"")
    bad_tensor = helper.make_node("Constant", [], ["k"], name="bad_tensor", value=negative)
    yield case(
        "Constant_tensor_negative_dims",
        [bad_tensor, helper.make_node("Add", ["x", "k"], ["y"], name="add")],
        "node 'bad_tensor' (Constant)",
    )


# -- external data and stored tensors ----------------------------------------------------------
def _external(location="w.bin", dims=(4,), **entries) -> TensorProto:
    tensor = TensorProto(name="w", data_type=TensorProto.FLOAT, dims=list(dims))
    tensor.data_location = TensorProto.EXTERNAL
    for key, value in {"location": location, **entries}.items():
        tensor.external_data.add(key=key, value=value)
    return tensor


def _weight_case(id_, tensor, data=b"\0" * 16, mention="tensor 'w'") -> Case:
    nodes = [helper.make_node("Add", ["x", "w"], ["y"], name="add")]
    return case(id_, nodes, mention, [tensor], {"w.bin": data})


def tensor_cases():
    yield _weight_case("external_empty_file", _external(), b"")
    for key in ("offset", "length"):
        for value in ("abc", "-8", "1.5", "²"):
            yield _weight_case(f"external_{key}_{value!r}", _external(**{key: value}))
    yield _weight_case("external_offset_past_end", _external(offset="1000000"))
    yield _weight_case("external_length_short", _external(length="8"))
    yield _weight_case("external_nul_in_location", _external(location="w\0.bin"))
    yield _weight_case("external_outside_folder", _external(location="../w.bin"))
    yield _weight_case("external_missing", _external(location="nothing.bin"))
    yield _weight_case("external_negative_dims", _external(dims=(-4,)))
    yield _weight_case("external_absurd_dims", _external(dims=(1 << 40, 1 << 40)))
    for dims in ((-1, 4), (4, -4), (1 << 31, 1 << 31, 4)):
        raw = TensorProto(name="w", data_type=TensorProto.FLOAT, dims=list(dims))
        raw.raw_data = b"\0" * 16
        yield _weight_case(f"raw_dims_{dims}", raw)


# -- names defined twice; graph structure ------------------------------------------------------
def structure_cases():
    relu = helper.make_node("Relu", ["x"], ["y"], name="first")
    yield case(
        "output_defined_twice",
        [relu, helper.make_node("Neg", ["x"], ["y"], name="second")],
        "node 'second' (Neg) writes 'y'",
    )
    yield case(
        "node_overwrites_input",
        [helper.make_node("Relu", ["x"], ["x"], name="clobber"), relu],
        "node 'clobber' (Relu) writes 'x'",
    )
    weight = (np.ones(4, np.float32), "w")
    yield case(
        "node_overwrites_initializer",
        [helper.make_node("Relu", ["x"], ["w"], name="clobber_w"), relu],
        "node 'clobber_w' (Relu) writes 'w'",
        [weight],
    )
    yield case("initializer_twice", [relu], "initializer 'w'", [weight, weight])
    yield case(
        "reads_undefined",
        [helper.make_node("Add", ["x", "ghost"], ["y"], name="reader")],
        "node 'reader' (Add) reads 'ghost'",
    )
    relu_only = {"m.onnx": model_bytes([relu], x_shape=[1, -4, 8, 8]), "in.npz": INPUTS}
    for i, (shape, mentions) in enumerate(
        (([], "{tmp}/m.onnx: input"), (["--input-shape", "x=1,-4,8,8"], "--input-shape"))
    ):
        yield Case(f"input_dim_minus_4_{i}", ["inspect", "{tmp}/m.onnx", *shape], relu_only,
                   mentions, codes=(2,))  # fmt: skip
    yield node_case("Add_one_input", "Add", ["x"])
    yield node_case("Relu_two_inputs", "Relu", ["x", "x"])
    yield node_case("Sum_empty_input", "Sum", ["x", ""])


CASES = [
    c
    for c in itertools.chain(
        window_cases(), size_cases(), axis_cases(), index_cases(), operand_cases(), type_cases(),
        tensor_cases(),
        structure_cases(),
    )
    if c is not None
]  # fmt: skip


def test_corpus_size_and_ids_are_unique():
    assert 80 <= len(CASES) <= 150
    assert len({c.id for c in CASES}) == len(CASES)


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory) -> dict[str, BaseException | None]:
    """Every case run once, a few subprocesses at a time (each waits mostly on its process)."""

    def run(hostile: Case) -> BaseException | None:
        try:
            check_clean_failure(hostile, tmp_path_factory.mktemp("hostile"))
        except BaseException as error:  # reported by the case's own test
            return error
        return None

    with ThreadPoolExecutor(max_workers=4) as pool:
        return dict(zip((c.id for c in CASES), pool.map(run, CASES)))


@pytest.mark.parametrize("hostile", CASES, ids=[c.id for c in CASES])
def test_hostile_onnx_fails_cleanly(hostile, outcomes):
    error = outcomes[hostile.id]
    if error is not None:
        raise error


def test_valid_edge_cases_still_import(tmp_path):
    """No false rejections: legal extremes of the same attributes import and run."""
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"], name="c", kernel_shape=[3, 3], pads=[0] * 4),
        helper.make_node("MaxPool", ["c"], ["p"], name="p", kernel_shape=[1, 1], strides=[9, 9]),
        helper.make_node("Flatten", ["p"], ["f"], name="f", axis=4),
        helper.make_node("Flatten", ["f"], ["g"], name="g", axis=-2),
        helper.make_node("Gather", ["g", "i"], ["y"], name="gather", axis=1),
    ]
    inits = [_w([4, 4, 3, 3]), (np.asarray([0, -1], np.int64), "i")]
    unknown = [helper.make_tensor_value_info("c", TensorProto.FLOAT, [-1, -4, 0, None])]
    files = {"m.onnx": model_bytes(nodes, inits, value_info=unknown), "in.npz": INPUTS}
    from hostile_cli import materialize, run_cli

    argv = materialize(Case("valid", ["run", "{tmp}/m.onnx", "-i", "{tmp}/in.npz", "-o",
                                      "{tmp}/o.npz"], files), tmp_path)  # fmt: skip
    result = run_cli(argv, tmp_path)
    assert result.returncode == 0, result.stderr.decode()
