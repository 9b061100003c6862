"""Unique tensor names for the writers (ONNX, circle/tflite)."""


def fresh_name(names: set[str], base: str) -> str:
    """`base`, or `base_N` with the smallest N not in `names`; the result is added to `names`."""
    name, counter = base, 0
    while name in names:
        counter += 1
        name = f"{base}_{counter}"
    names.add(name)
    return name
