"""Values quantized per channel on the TRIX NPU (`quantize.activation_granularity = "channel"`,
issue 17 + 19): a convolution whose output has a zero point and clamp per channel, a lookup
table per channel ([C, 256], its rows loaded with each tile's channels), and a depthwise
convolution whose input is centered (and padded) by each channel's zero point. Each runs
bit-exactly with the integer reference on both presets, on tiny SRAMs that force tiles, and
through the .tvn encoding (`test_trix_ops.check`); the same programs with the zero points of
one channel used for all do not (so the checks see a dropped per-channel zero point)."""

import dataclasses
import json

import numpy as np
import pytest
from test_structural_mutations import _tvn_resealed, _tvn_sections, _with_json
from test_trix_ops import check
from test_trix_sim import assert_bit_exact

from onebuild.errors import FormatError, ModelError, UserError
from onebuild.graph_ir.interpreter import Interpreter
from onebuild.graph_ir.ir import Graph, Node
from onebuild.graph_ir.quant.calibrate import calibrate
from onebuild.graph_ir.quant.config import QuantConfig
from onebuild.graph_ir.quant.quantize_graph import quantize_graph
from onebuild.targets import load_target
from onebuild.targets.host_cpu import HostCpu
from onebuild.targets.placement import Options, place
from onebuild.targets.trix_sim.codegen import generate
from onebuild.targets.trix_sim.hardware import load_hardware
from onebuild.targets.trix_sim.lower import lower, unsupported
from onebuild.targets.trix_sim.opcodes import LOAD, STORE
from onebuild.targets.trix_sim.perf import estimate
from onebuild.targets.trix_sim.simulator import Simulator
from onebuild.targets.trix_sim.tvn import HEADER, LAYERS, decode, encode


def channel_graph(
    rng, channels=7, size=(9, 11), table="HardSwish", kernel=3, stride=1, residual=False
):
    """Conv 1x1 (BatchNorm-folded: output channels spanning 300x; with no table, a fused
    clip to [-0.5, 2]) -> [table] -> depthwise kernel x kernel conv (undoing the spread)
    [-> + another 1x1 conv of the input, with `residual`] -> Conv 1x1, quantized to uint8 with
    per-channel activations on the depthwise edge; calibrated on smooth images (sums of
    sines)."""
    gamma = rng.permutation(np.geomspace(1 / 17, 17, channels)).astype(np.float32)
    graph = Graph("channels")
    x = graph.add_input("x", np.float32, (1, 3, *size))

    def conv(value, weights, group=1, pad=0, step=1, clip=None):
        w = graph.add_constant(weights.astype(np.float32))
        b = graph.add_constant(rng.normal(0, 0.1, len(weights)).astype(np.float32))
        attrs = {"strides": [step] * 2, "dilations": [1, 1], "pads": [pad] * 4, "group": group}
        if clip is not None:
            attrs["clip"] = clip
        return graph.make_node("Conv", [value, w, b], attrs).output

    if residual:
        shortcut = conv(x, rng.normal(0, 0.5, (channels, 3, 1, 1)), step=stride)
    pointwise = rng.normal(0, 0.5, (channels, 3, 1, 1)) * gamma[:, None, None, None]
    mid = conv(x, pointwise, clip=[-0.5, 2.0] if table is None else None)
    if table is not None:
        mid = graph.make_node(table, [mid]).output
    taps = rng.normal(0, 0.5, (channels, 1, kernel, kernel)) / gamma[:, None, None, None]
    mid = conv(mid, taps, group=channels, pad=kernel // 2, step=stride)
    if residual:  # the depthwise conv's output stage adds it (fusion.py: the later producer)
        mid = graph.make_node("Add", [shortcut, mid]).output
    graph.outputs = [conv(mid, rng.normal(0, 0.4, (5, channels, 1, 1)))]
    rows, cols = np.meshgrid(np.arange(size[0]), np.arange(size[1]), indexing="ij")
    phases = rng.uniform(0, 2 * np.pi, (8, 3, 1, 1))
    images = np.sin(0.7 * rows + phases) * np.cos(0.5 * cols - phases)
    data = {"x": images[:, None].astype(np.float32)}
    stats = calibrate(graph, data)
    config = QuantConfig(
        "uint8", activation_granularity="channel", input_type="uint8", output_type="uint8"
    )
    return quantize_graph(
        graph, stats.ranges_for("uint8"), config, channel_ranges=stats.channel_ranges
    )


def _per_channel_layers(quantized: Graph) -> dict[str, Node]:
    """The nodes that read or write a value quantized per channel."""
    values = [v for n in quantized.nodes for v in (*n.inputs, n.output)]
    names = {v.name for v in values if not v.is_const and v.quant and v.quant.axis is not None}
    return {n.name: n for n in quantized.nodes if names & {v.name for v in (*n.inputs, n.output)}}


@pytest.mark.parametrize("table", ["HardSwish", "Sigmoid", None])
@pytest.mark.parametrize("channels, size, kernel, stride", [
    (7, (9, 11), 3, 1),
    (19, (13, 5), 5, 2),
    (33, (6, 17), 3, 2),
])  # fmt: skip
def test_depthwise_edge_is_bit_exact(rng, table, channels, size, kernel, stride):
    quantized = channel_graph(rng, channels, size, table, kernel, stride)
    layers = _per_channel_layers(quantized)
    ops = sorted(n.op for n in layers.values())
    # the last 1x1 conv reads the depthwise output per channel where its folded weights
    # gain by it (`channel_activations._pays`): lowered as well
    last = next(n for n in reversed(quantized.nodes) if n.op == "QConv")
    convs = ["QConv"] * (3 if last.name in layers else 2)
    assert ops == ([*convs, "QLookup"] if table else convs)
    producer = next(n for n in layers.values() if n.op == "QConv" and n.attrs["group"] == 1)
    assert len(set(producer.attrs["y_zero_point"])) > 1  # the zero points differ
    check(quantized, rng)


def _dropped(program, key: str):
    """The program with one channel's zero point used for every channel in attribute
    `key` of every layer that holds them per channel."""
    for layer in program.layers:
        value = layer.attrs.get(key)
        if isinstance(value, list):
            layer.attrs[key] = [value[0]] * len(value)
    return program


def test_a_depthwise_conv_with_a_fused_residual_add(rng):
    """The depthwise conv that centers each input channel by its zero point runs a residual
    Add in its output stage (`epilogue`), bit-exactly."""
    quantized = channel_graph(rng, 11, (13, 10), "HardSwish", residual=True)
    hw = load_hardware("trix-m")
    module = generate(lower(quantized, hw), hw)
    (depthwise,) = [layer for layer in module.layers if layer.attrs.get("group", 1) > 1]
    assert module.layers[depthwise.attrs["epilogue"]].kind == "add"
    check(quantized, rng)


@pytest.mark.parametrize("key", ["x_zero_point", "y_zero_point"])
def test_a_dropped_per_channel_zero_point_is_seen(rng, key):
    """Each per-channel zero point decides the output: the program with channel 0's zero
    point for all channels gives other codes than the integer reference."""
    quantized = channel_graph(rng, 9, (7, 9), "HardSwish")
    hw = load_hardware("trix-m")
    module = generate(_dropped(lower(quantized, hw), key), hw)
    feeds = {"x": rng.integers(0, 256, (1, 3, 7, 9)).astype(np.uint8)}
    want = Interpreter(quantized).run(feeds)
    got, _ = Simulator(module, hw).run(feeds)
    assert not all(np.array_equal(got[name], want[name]) for name in want)


def test_tables_per_channel_count_their_bytes(rng):
    """A [C, 256] table is DMAed once, the rows of each tile's channels with the tile: the
    lookup layer's simulated DRAM traffic is its input, its output and the C x 256 table
    bytes (with `memory`, which keeps no tensor in SRAM), as the performance model
    estimates."""
    quantized = channel_graph(rng, 21, (5, 7), "Sigmoid")
    hw = load_hardware("trix-s")
    program = lower(quantized, hw)
    (lookup,) = [layer for layer in program.layers if layer.kind == "lookup"]
    assert lookup.arrays["table"].shape == (21, 256)
    module = generate(program, hw, "memory")
    index = program.layers.index(lookup)
    table_at = module.arrays[(index, "table")]
    loads = module.code[(module.code[:, 0] == LOAD) & (module.code[:, 1] == index)]
    from_table = loads[(loads[:, 2] >= table_at) & (loads[:, 2] < table_at + 21 * 256)]
    assert int((from_table[:, 4] * from_table[:, 5]).sum()) == 21 * 256
    report = assert_bit_exact(quantized, hw, "memory", rng)
    assert report["layers"][lookup.name]["dram_bytes"] == 21 * 256 + 2 * 21 * 5 * 7
    assert estimate(program, hw)["layers"][lookup.name]["dram_bytes"] == 21 * 256 + 2 * 21 * 35


def test_the_edge_falls_back_whole(rng):
    """When one layer of a per-channel edge cannot run on the NPU (a depthwise kernel above
    max_kernel), every layer touching its values stays on the CPU with the reason, so no NPU
    program has an input or output quantized per channel."""
    quantized = channel_graph(rng, 5, (15, 15), "HardSwish", kernel=13)
    hw = load_hardware("trix-m")
    layers = _per_channel_layers(quantized)
    reasons = {name: unsupported(node, hw) for name, node in layers.items()}
    region = "value quantized per channel must run on the NPU"
    for name, node in layers.items():
        deep = node.op == "QConv" and node.inputs[1].shape[2] == 13
        assert any(("max_kernel" if deep else region) in why for why in reasons[name]), name
    with pytest.raises(ModelError, match="quantized per channel"):
        lower(quantized, hw)


def test_int16_per_channel_values_stay_on_the_cpu(rng):
    """Only 8-bit values quantized per channel are lowered (a table per channel of int16
    codes would take 128 KB each)."""
    quantized = channel_graph(rng, 5, (5, 5), None)
    node = next(n for n in _per_channel_layers(quantized).values() if n.inputs[0].quant.axis)
    value = node.inputs[0]
    value.dtype = np.dtype("int16")
    why = " ".join(unsupported(node, load_hardware("trix-m")))
    assert "must be 8-bit" in why


def test_tvn_version_5_and_older_files_without_per_channel_codes(rng):
    """Files are written as version 6 (tests/test_trix_rows.py); a version 4 header on
    per-channel codes is refused, a version 4 file without them still loads."""
    hw = load_hardware("trix-m")
    data = encode(generate(lower(channel_graph(rng, 6, (5, 6), "HardSwish"), hw), hw))
    assert HEADER.unpack_from(data)[1] == 6
    decode(data)
    with pytest.raises(FormatError, match="per-channel codes before version 5"):
        decode(_with_version(data, 4))
    per_tensor = encode(generate(lower(_per_tensor(rng), hw), hw))
    decode(_with_version(per_tensor, 4))


def _per_tensor(rng) -> Graph:
    graph = Graph("plain")
    x = graph.add_input("x", np.float32, (1, 3, 5, 6))
    graph.outputs = [graph.make_node("HardSwish", [x]).output]
    data = {"x": rng.normal(0, 1, (4, 1, 3, 5, 6)).astype(np.float32)}
    config = QuantConfig("uint8", input_type="uint8", output_type="uint8")
    return quantize_graph(graph, calibrate(graph, data).ranges, config)


def _with_version(data: bytes, version: int) -> bytes:
    """The file with another header version (its checksum made again)."""
    import hashlib

    magic, _, flags, count, reserved = HEADER.unpack_from(data)
    content = HEADER.pack(magic, version, flags, count, reserved) + data[HEADER.size : -32]
    return content + hashlib.sha256(content).digest()


@pytest.mark.parametrize("stride", [1, 2])
def test_cascaded_through_a_per_channel_edge(rng, stride):
    """Conv -> depthwise conv -> conv in row stripes (cascade.py): the per-channel
    intermediate never goes to DRAM (its layer stores nothing), and the stripes requantize
    and center it per channel, bit-exactly."""
    quantized = channel_graph(rng, 7, (40, 41), None, stride=stride)
    hw = load_hardware("trix-s")
    module = generate(lower(quantized, hw), hw, "memory")
    stores = module.code[module.code[:, 0] == STORE]
    assert module.layers[0].kind == "conv" and 0 not in set(stores[:, 1].tolist())
    assert_bit_exact(quantized, hw, "memory", rng)


@dataclasses.dataclass(frozen=True)
class _SkewedCpu(HostCpu):
    """A host CPU on which the nodes named in `free` cost nothing and those in `slow` a
    second each."""

    free: frozenset = frozenset()
    slow: frozenset = frozenset()

    def node_us(self, node) -> float:
        if node.name in self.free:
            return 0.0
        return 1e6 if node.name in self.slow else super().node_us(node)


def test_the_cost_partition_never_cuts_a_per_channel_edge(rng):
    """With the layers before the table slow on the CPU, those after it free and handoffs
    free, the cheapest cut would hand the table's per-channel output to the CPU; the minimum
    cut never hands a value quantized per channel between backends, so every part's inputs
    and outputs are per tensor and every NPU part lowers."""
    quantized = channel_graph(rng, 9, (31, 29), "HardSwish", residual=True)  # a cut after
    ops = [n.op for n in quantized.nodes]
    head = {n.name for n in quantized.nodes[: ops.index("QLookup") + 1]}
    tail = {n.name for n in quantized.nodes} - head
    cpu = _SkewedCpu(handoff_us=0.0, free=frozenset(tail), slow=frozenset(head))
    options = Options(accelerator="trix", hw="trix-m", strategy="cost")
    placement = place(quantized, "m", load_target("trix_sim"), options, cpu)
    assert len(placement.partitioning.parts) == 2  # the cut is somewhere in the middle
    hw = load_hardware("trix-m")
    for part in placement.partitioning.parts:
        for value in [*part.graph.inputs, *part.graph.outputs]:
            assert len(value.quant.scale) == 1, value.name
        if part.backend == "trix":
            lower(part.graph, hw)


def _shorter(layers: list[dict]) -> None:
    conv = next(layer for layer in layers if isinstance(layer["attrs"]["y_zero_point"], list))
    conv["attrs"]["y_zero_point"].pop()


def _on_a_full_conv(layers: list[dict]) -> None:
    conv = next(layer for layer in layers if layer["attrs"].get("group") == 1)
    conv["attrs"]["x_zero_point"] = [0] * 6  # the input has 3 channels, the output 6


def _out_of_range(layers: list[dict]) -> None:
    depthwise = next(layer for layer in layers if layer["attrs"].get("group", 1) > 1)
    depthwise["attrs"]["x_zero_point"][-1] = 256


def _clamps_crossed(layers: list[dict]) -> None:  # each in range, qmin above qmax
    conv = next(layer for layer in layers if isinstance(layer["attrs"].get("qmax"), list))
    conv["attrs"]["qmin"][0], conv["attrs"]["qmax"][0] = 200, 100


def _mixed_forms(layers: list[dict]) -> None:  # one zero point, clamps per channel
    conv = next(layer for layer in layers if isinstance(layer["attrs"].get("qmax"), list))
    conv["attrs"]["y_zero_point"] = conv["attrs"]["y_zero_point"][0]


@pytest.mark.parametrize("strategy", ["capability", "cost"])
@pytest.mark.parametrize(
    "pin",
    [
        {"opcode": {"QLookup": "cpu"}},
        {"opcode": {"_": "trix", "QLookup": "cpu"}},  # a blanket mapping gives way
        {"opname": "depthwise"},
    ],
)
def test_a_node_mapped_to_the_cpu_takes_its_per_channel_edge_along(rng, strategy, pin):
    """opcode/opname maps that send one layer of a per-channel edge to the CPU send the whole
    edge (each other layer says why), so every NPU part still lowers; mapping layers of one
    edge to both backends is a one-line user error."""
    quantized = channel_graph(rng, 9, (11, 13), "HardSwish")
    layers = _per_channel_layers(quantized)
    if "opname" in pin:
        depthwise = next(n for n in layers if layers[n].op == "QConv" and n != _first(layers))
        pin = {"opname": {depthwise: "cpu"}}
    options = Options(accelerator="trix", hw="trix-m", strategy=strategy, **pin)
    placement = place(quantized, "m", load_target("trix_sim"), options, HostCpu())
    assert all(placement.backend_of[name] == "cpu" for name in layers), placement.backend_of
    tied = [f for f in placement.fallbacks if "tie it to node" in " ".join(f["reasons"])]
    assert tied, placement.fallbacks
    for part in placement.partitioning.parts:
        if part.backend == "trix":
            lower(part.graph, load_hardware("trix-m"))
    first = _first(layers)
    both = {"opname": {first: "trix", next(n for n in layers if n != first): "cpu"}}
    with pytest.raises(UserError, match="share values quantized per channel"):
        place(quantized, "m", load_target("trix_sim"), Options("trix", "trix-m", **both))


def _first(layers: dict) -> str:
    return next(iter(layers))


@pytest.mark.parametrize(
    "mutation, says",
    [
        (_shorter, "entries"),
        (_on_a_full_conv, "x_zero_point"),
        (_out_of_range, "out of range"),
        (_clamps_crossed, "is above qmax"),
        (_mixed_forms, "all lists or all integers"),
    ],
)
def test_bad_per_channel_codes_are_one_line_errors(rng, mutation, says):
    """Per-channel lists of the wrong length, on a layer that cannot take them, out of the
    code range or with crossed clamps: a FormatError naming the file and the attribute."""
    hw = load_hardware("trix-m")
    data = encode(generate(lower(channel_graph(rng, 6, (5, 6), "HardSwish"), hw), hw))
    sections = _tvn_sections(data)
    tree = json.loads(dict(sections)[LAYERS])
    mutation(tree["layers"])
    with pytest.raises(
        FormatError, match=r"m\.tvn: not a valid \.tvn file: layers\[\d\]\.attrs"
    ) as error:
        decode(_tvn_resealed(_with_json(sections, LAYERS, tree)), "m.tvn")
    assert says in str(error.value)


@pytest.mark.parametrize("shape", [[6, 1, 1, 1], [6, 1, 3, 1], [6, 2, 3, 3]])
def test_depthwise_weights_must_fit_the_kernel_and_groups(rng, shape):
    """Weights whose shape contradicts the layer's kernel or group are refused (a depthwise
    conv with 1x1 weights under a 3x3 kernel used to run, silently wrong)."""
    hw = load_hardware("trix-m")
    data = encode(generate(lower(channel_graph(rng, 6, (5, 6), "HardSwish"), hw), hw))
    sections = _tvn_sections(data)
    tree = json.loads(dict(sections)[LAYERS])
    depthwise = next(layer for layer in tree["layers"] if layer["attrs"].get("group", 1) > 1)
    depthwise["arrays"]["weights"][2] = shape
    with pytest.raises(FormatError, match="weights do not match"):
        decode(_tvn_resealed(_with_json(sections, LAYERS, tree)), "m.tvn")
