"""`onebuild run MODEL --quantize/--codegen/--auto-compile`: onert_run's on-device compilation
through the Session, printing each switch (with cli.py and cli_recipes.py, a module that
prints)."""

from .errors import UserError

ODC_QUANTIZE = {"uint8": "U8_ASYM", "int16": "I16_SYM", "int8_wo": "WO_I8_SYM",
                "int16_wo": "WO_I16_SYM"}  # fmt: skip


def run_on_device(args) -> int:
    """onert_run's on-device compilation: record, quantize, codegen (or --auto-compile), then
    run every input sample on the resulting model."""
    import numpy as np

    from .npz import from_file, read_npz, write_npz
    from .runtime.outputs import quantized_kind, writable
    from .runtime.session import Session, default_workspace
    from .targets import check_preset, check_target, default_hw

    if args.raw:
        raise UserError("--raw does not apply to on-device compilation: its I/O is float")
    if args.codegen:  # said before anything is recorded or written
        check_target(args.codegen, args.hw)
        if not args.hw:
            _check_package_hw(args.model, args.codegen)
    elif args.hw:
        check_preset(args.hw)
    for option, path, kind in (("--qpath", args.qpath, None), ("--cpath", args.cpath, "binary")):
        if path:  # said before the model loads, in the command line's terms
            writable(path, [kind or quantized_kind(path)], option, [args.model, args.inputs])
    shapes = dict(args.input_shape or [])
    workspace = args.workspace or default_workspace(args.model)  # compiling needs one
    session = Session(args.model, workspace=workspace, input_shapes=shapes or None)
    feeds = read_npz(args.inputs)
    missing = [name for name in session.inputs if name not in feeds]
    if missing:
        raise UserError(f"{args.inputs}: no array for input(s) {', '.join(missing)}")
    count = len(feeds[next(iter(session.inputs))])
    samples = [{name: feeds[name][i] for name in session.inputs} for i in range(count)]
    if not samples:
        raise UserError(f"{args.inputs}: holds no samples")
    if args.quantize:
        session.set_quantization_type(ODC_QUANTIZE[args.quantize])
    if args.hw:  # given or not, the package's ODC_* settings hold for the rest
        session.set_hardware(args.hw)
    if args.minmax_runs is not None:
        session.set_odc_param_minmax_records_count(args.minmax_runs)
    if args.min_sqnr_db is not None:
        session.set_accuracy_gate(min_sqnr_db=args.min_sqnr_db)
    if args.qpath:
        session.set_quantized_model_path(args.qpath)
    if args.cpath:
        session.set_codegen_model_path(args.cpath)

    def run(call, *arguments):  # a data error names the data file, as the other modes do
        try:
            return call(*arguments)
        except UserError as error:
            raise from_file(str(args.inputs), error) from None

    results = []
    if args.auto_compile:
        for sample in samples:
            before = session.state
            results.append(run(session.run_with_auto_compilation, sample, args.codegen, args.pref))
            if session.state != before:
                print(f"run {len(results)}: switched {before} -> {session.state}")
    else:
        if args.quantize:
            session.set_execute_config("DUMP_MINMAX")
            for index in range(session.settings.minmax_records):
                run(session.run, samples[index % count])
            session.reset_execute_config()
            print(f"quantized ({session.settings.quant_type}): {session.quantize()}")
        if args.codegen:
            output = session.codegen(args.codegen, args.pref)
            used = session.settings
            hw = used.hw or default_hw(used.target)
            print(f"compiled ({used.target}, {hw}, {used.pref}): {output}")
    results = results or [run(session.run, sample) for sample in samples]
    outputs = {name: np.stack([r[name] for r in results]) for name in session.outputs}
    write_npz(args.outputs, outputs)
    for name, array in outputs.items():
        print(f"{name}: {array.dtype}{list(array.shape)}")
    print(f"state: {session.state}" + (f" ({session.reason})" if session.reason else ""))
    return 0


def _check_package_hw(model, codegen: str) -> None:
    """A package's ODC_HW, kept without --hw, must be a preset of the --codegen target (it
    belongs to another target: refused before the session records or writes anything)."""
    from .odc import settings_from_config
    from .runtime.package import load_package
    from .runtime.package_files import is_package
    from .targets import check_target

    if not is_package(model):
        return
    where = f"{model}: config.cfg: "
    hw = settings_from_config(load_package(model).config, where).hw
    try:
        check_target(codegen, hw, where, ("--codegen", "ODC_HW"))
    except UserError as error:
        raise UserError(f"{error}; give --hw with one of them (it replaces ODC_HW)") from None
