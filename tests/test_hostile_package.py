"""Hostile nnpackages: every case, made deterministically from a real NPU-CPU-NPU package,
runs the real CLI in a subprocess (tests/hostile_cli.py) and must fail with exit code 2 and one
error line naming the culprit, in bounded memory and time. Forged zips come from
tests/zip_forge.py; structural MANIFEST mutations are tests/test_manifest_mutations.py."""

import io
import json
import os
import random
import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from hostile_cli import Case, check_clean_failure
from zip_forge import Member, data_ranges, deflate, flipped, member, raw_zip, zeros

EXAMPLES = Path(__file__).parent.parent / "examples"
RUN = ["run", "{tmp}/pkg", "-i", "{tmp}/in.npz", "-o", "{tmp}/out.npz"]
RUN_ZIP = ["run", "{tmp}/bad.zip", "-i", "{tmp}/in.npz", "-o", "{tmp}/out.npz"]
MANIFEST = "{tmp}/pkg: MANIFEST"
ZIP = "{tmp}/bad.zip"
GiB, MiB = 1 << 30, 1 << 20


@dataclass
class Base:
    """The real package: its files (relative path -> bytes), MANIFEST, inputs, zip."""

    root: Path
    files: dict[str, bytes]
    manifest: dict
    inputs: bytes
    reference: Path


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> Base:
    from test_partition import build_statuses, mixed_model, write_project

    folder = tmp_path_factory.mktemp("hostile")
    rng = np.random.default_rng(7)
    build_statuses(write_project(folder, mixed_model(rng), rng))
    root = folder / "out/m.nnpkg"
    files = {p.relative_to(root).as_posix(): p.read_bytes() for p in root.rglob("*") if p.is_file()}
    manifest = json.loads(files["metadata/MANIFEST"])
    return Base(root, files, manifest, (folder / "eval.npz").read_bytes(), folder / "m.onnx")


# ---- building cases ---------------------------------------------------------------------------


def folder(b: Base, mentions: str, manifest=None, text=None, files=None, setup=None, argv=RUN):
    """The package as a folder `pkg`, with a changed MANIFEST (dict or text) or files."""
    content = {f"pkg/{k}": v for k, v in b.files.items()}
    if manifest is not None:
        content["pkg/metadata/MANIFEST"] = json.dumps(manifest)
    if text is not None:
        content["pkg/metadata/MANIFEST"] = text
    content["in.npz"] = b.inputs
    content.update(files or {})
    return Case("", argv, content, mentions, (2,), setup)


def raw_field(b: Base, key: str, literal: str) -> str:
    """The MANIFEST's JSON text with `key`'s value replaced by the JSON literal `literal`."""
    return json.dumps({**b.manifest, key: "@@"}).replace('"@@"', literal)


def changed(b: Base, **fields) -> dict:
    manifest = json.loads(json.dumps(b.manifest))
    manifest.update({k.replace("_", "-"): v for k, v in fields.items()})
    return manifest


def package_members(b: Base) -> list[Member]:
    return [member(f"m.nnpkg/{k}", v) for k, v in sorted(b.files.items())]


def replaced(b: Base, new: Member) -> list[Member]:
    """The package's members with one of them replaced."""
    return [new if m.name == new.name else m for m in package_members(b)]


def zipped(b: Base, mentions: str, data: bytes, argv=RUN_ZIP) -> Case:
    return Case("", argv, {"bad.zip": data, "in.npz": b.inputs}, mentions, (2,))


def good_zip(b: Base) -> bytes:
    return raw_zip(package_members(b))


def npz(**arrays) -> bytes:
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    return buffer.getvalue()


def link(path: str, target: str):
    """A setup making `path` (in the case folder) a symlink to `target` ({tmp} filled in)."""

    def setup(folder: Path) -> None:
        where = folder / path
        where.parent.mkdir(parents=True, exist_ok=True)
        if where.exists() or where.is_symlink():
            where.unlink() if not where.is_dir() or where.is_symlink() else shutil.rmtree(where)
        os.symlink(target.replace("{tmp}", str(folder)), where)

    return setup


def chain(*setups):
    def setup(folder: Path) -> None:
        for step in setups:
            step(folder)

    return setup


def copy_outside(relative: str, name: str):
    """A setup copying the package file `relative` out of the package, to {tmp}/name."""
    return lambda folder: shutil.copy(folder / "pkg" / relative, folder / name)


TVN, CPU = "m.part.00001_trix.tvn", "m.part.00002_cpu.circle"


def manifest_cases():
    deep = 100_000
    yield "deep-array", lambda b: folder(b, MANIFEST, text="[" * deep + "]" * deep)
    yield "deep-object", lambda b: folder(b, MANIFEST, text='{"a":' * deep + "1" + "}" * deep)
    yield "deep-in-models", lambda b: folder(b, MANIFEST, changed(b, models=[[[[[[[]]]]]]] * 2))
    yield "deep-40", lambda b: folder(b, MANIFEST, text="[" * 40 + "]" * 40)
    yield "version-5000-digits", lambda b: folder(b, MANIFEST, changed(b, major_version="1" * 5000))
    yield (
        "version-5000-digit-int",
        lambda b: folder(b, MANIFEST, text=raw_field(b, "major-version", "9" * 5000)),
    )
    yield "version-arabic-digit", lambda b: folder(b, MANIFEST, changed(b, major_version="\u0661"))
    yield (
        "version-infinity",
        lambda b: folder(b, MANIFEST, text=raw_field(b, "patch-version", "Infinity")),
    )
    yield "not-utf8", lambda b: folder(b, MANIFEST, text=b"\xff\xfe{\x00}")
    yield "null", lambda b: folder(b, MANIFEST, text="null")
    yield "too-large", lambda b: folder(b, MANIFEST, text=" " * (2 * MiB) + "{}")
    yield (
        "duplicate-key",
        lambda b: folder(
            b, MANIFEST, text=json.dumps(b.manifest)[:-1] + f', "models": ["{CPU}"]}}'
        ),
    )
    yield "models-dict", lambda b: folder(b, MANIFEST, changed(b, models={"a": TVN}))
    yield "models-empty", lambda b: folder(b, MANIFEST, changed(b, models=[]))
    yield (
        "models-2000",
        lambda b: folder(b, MANIFEST, changed(b, models=[TVN] * 2000, model_types=["tvn"] * 2000)),
    )
    yield "types-length", lambda b: folder(b, MANIFEST, changed(b, model_types=["tvn"]))
    yield "types-int", lambda b: folder(b, MANIFEST, changed(b, model_types=["tvn", 5, "tvn"]))
    yield (
        "types-long-name",
        lambda b: folder(b, MANIFEST, changed(b, model_types=["tvn", "x" * 100_000, "tvn"])),
    )
    yield "configs-10000", lambda b: folder(b, MANIFEST, changed(b, configs=["config.cfg"] * 10000))
    yield (
        "model-configs-null",
        lambda b: folder(b, MANIFEST, changed(b, model_configs=["", None, ""])),
    )
    yield "pkg-outputs-twice", lambda b: folder(b, MANIFEST, changed(b, pkg_outputs=["2:0:0"] * 2))
    yield "pkg-outputs-negative", lambda b: folder(b, MANIFEST, changed(b, pkg_outputs=["-1:0:0"]))
    yield (
        "pkg-outputs-huge-index",
        lambda b: folder(b, MANIFEST, changed(b, pkg_outputs=["99999999999999999999:0:0"])),
    )
    yield (
        "pkg-outputs-5000-digits",
        lambda b: folder(b, MANIFEST, changed(b, pkg_outputs=["2:0:" + "7" * 5000])),
    )
    yield (
        "pkg-inputs-100000",
        lambda b: folder(b, MANIFEST, changed(b, pkg_inputs=["0:0:0"] * 100_000)),
    )
    yield "connect-dict", lambda b: folder(b, MANIFEST, changed(b, model_connect={"from": "0:0:0"}))
    yield (
        "connect-from-int",
        lambda b: folder(b, MANIFEST, changed(b, model_connect=[{"from": 5, "to": ["1:0:0"]}])),
    )
    yield (
        "connect-100000-targets",
        lambda b: folder(
            b, MANIFEST, changed(b, model_connect=[{"from": "0:0:0", "to": ["1:0:0"] * 100_000}])
        ),
    )
    yield (
        "connect-unicode-digits",
        lambda b: folder(
            b, MANIFEST, changed(b, model_connect=[{"from": "\u0660:0:0", "to": ["1:0:0"]}])
        ),
    )
    yield "connect-subgraph", lambda b: folder(
        b, MANIFEST, changed(b, model_connect=[
            {"from": "0:1:0", "to": ["1:0:0"]}, {"from": "1:0:0", "to": ["2:0:0"]}])
    )  # fmt: skip


def path_cases():
    def models(b, first):
        return changed(b, models=[first, *b.manifest["models"][1:]])

    yield "model-dotdot", lambda b: folder(b, MANIFEST, models(b, "../x.tvn"))
    yield "model-nul", lambda b: folder(b, MANIFEST, models(b, "a\u0000b.tvn"))
    yield "model-5000-chars", lambda b: folder(b, MANIFEST, models(b, "a" * 5000))
    yield "model-drive", lambda b: folder(b, MANIFEST, models(b, "C:/x.tvn"))
    yield "model-dot", lambda b: folder(b, MANIFEST, models(b, "."))
    yield "model-directory", lambda b: folder(b, "models[0] 'metadata'", models(b, "metadata"))
    yield "model-missing", lambda b: folder(b, "models[0] 'gone.tvn'", models(b, "gone.tvn"))
    yield (
        "model-symlink-loop",
        lambda b: folder(
            b, "models[0] 'loop.tvn'", models(b, "loop.tvn"), setup=link("pkg/loop.tvn", "loop.tvn")
        ),
    )
    yield "model-symlink-cycle", lambda b: folder(
        b, "models[0] 'a.tvn'", models(b, "a.tvn"),
        setup=chain(link("pkg/a.tvn", "b.tvn"), link("pkg/b.tvn", "a.tvn")),
    )  # fmt: skip
    yield "model-link-outside", lambda b: folder(
        b, f"models[0] '{TVN}' points outside",
        setup=chain(copy_outside(TVN, "outside.tvn"), link(f"pkg/{TVN}", "{tmp}/outside.tvn")),
    )  # fmt: skip
    yield (
        "model-link-dev-zero",
        lambda b: folder(
            b, f"models[0] '{TVN}' points outside", setup=link(f"pkg/{TVN}", "/dev/zero")
        ),
    )
    yield "model-fifo", lambda b: folder(
        b, "models[0] 'fifo.tvn' is not a regular file", models(b, "fifo.tvn"),
        setup=lambda f: os.mkfifo(f / "pkg/fifo.tvn"),
    )  # fmt: skip
    yield "manifest-link-outside", lambda b: folder(
        b, "'metadata/MANIFEST' points outside",
        setup=chain(copy_outside("metadata/MANIFEST", "MANIFEST"),
                    link("pkg/metadata/MANIFEST", "{tmp}/MANIFEST")),
    )  # fmt: skip
    yield "metadata-link-outside", lambda b: folder(
        b, "'metadata/MANIFEST' points outside",
        setup=chain(lambda f: shutil.copytree(f / "pkg/metadata", f / "meta"),
                    link("pkg/metadata", "{tmp}/meta")),
    )  # fmt: skip
    yield (
        "manifest-symlink-loop",
        lambda b: folder(
            b,
            "'metadata/MANIFEST' is a symbolic link loop",
            setup=link("pkg/metadata/MANIFEST", "MANIFEST"),
        ),
    )
    yield "manifest-directory", lambda b: folder(
        b, "'metadata/MANIFEST' is not a regular file",
        setup=chain(lambda f: (f / "pkg/metadata/MANIFEST").unlink(),
                    lambda f: (f / "pkg/metadata/MANIFEST").mkdir()),
    )  # fmt: skip
    yield "config-link-outside", lambda b: folder(
        b, "'metadata/config.cfg' points outside",
        setup=chain(copy_outside("metadata/config.cfg", "config.cfg"),
                    link("pkg/metadata/config.cfg", "{tmp}/config.cfg")),
    )  # fmt: skip
    yield "model-config-link-outside", lambda b: folder(
        b, "'metadata/m.part.00002_cpu.cfg' points outside",
        setup=chain(copy_outside("metadata/m.part.00002_cpu.cfg", "c.cfg"),
                    link("pkg/metadata/m.part.00002_cpu.cfg", "{tmp}/c.cfg")),
    )  # fmt: skip
    yield "config-fifo", lambda b: folder(
        b, "'metadata/config.cfg' is not a regular file",
        setup=chain(lambda f: (f / "pkg/metadata/config.cfg").unlink(),
                    lambda f: os.mkfifo(f / "pkg/metadata/config.cfg")),
    )  # fmt: skip
    yield (
        "config-5mb",
        lambda b: folder(
            b, "metadata/config.cfg", files={"pkg/metadata/config.cfg": "A=1\n" * (5 * MiB // 4)}
        ),
    )
    yield (
        "config-backend-mismatch",
        lambda b: folder(
            b, "models[0]", files={"pkg/metadata/m.part.00001_trix.cfg": "BACKENDS=cpu\n"}
        ),
    )
    yield (
        "type-mismatch",
        lambda b: folder(b, "models[0]", changed(b, models=[CPU, CPU, "m.part.00003_trix.tvn"])),
    )
    for name in (TVN, CPU):
        yield (
            f"truncated-{name}",
            lambda b, n=name: folder(
                b, f"'{n}'", files={f"pkg/{n}": b.files[n][: len(b.files[n]) // 2]}
            ),
        )
        yield (
            f"flipped-{name}",
            lambda b, n=name: folder(
                b, f"'{n}'", files={f"pkg/{n}": flipped(b.files[n], len(b.files[n]) // 2)}
            ),
        )
        yield f"empty-{name}", lambda b, n=name: folder(b, f"'{n}'", files={f"pkg/{n}": b""})
    yield (
        "package-symlink-loop",
        lambda b: Case("", RUN, {"in.npz": b.inputs}, "{tmp}/pkg", (2,), link("pkg", "pkg")),
    )
    yield (
        "folder-without-manifest",
        lambda b: Case("", RUN, {"in.npz": b.inputs, "pkg/x.tvn": b.files[TVN]}, "{tmp}/pkg", (2,)),
    )


def zip_cases():
    for _i, name in enumerate(["metadata/MANIFEST", TVN, CPU, "metadata/config.cfg"]):

        def flip_member(b, name=name):
            data = good_zip(b)
            start, end = data_ranges(data)[f"m.nnpkg/{name}"]
            return zipped(b, ZIP, flipped(data, (start + end) // 2))

        yield f"zip-flip-{name.replace('/', '-')}", flip_member
    for seed in range(3):

        def flip_random(b, seed=seed):
            data = good_zip(b)
            start, end = random.Random(seed).choice(sorted(data_ranges(data).values()))
            return zipped(b, ZIP, flipped(data, random.Random(seed).randrange(start, end - 1)))

        yield f"zip-flip-seed{seed}", flip_random
    yield "zip-flip-local-signature", lambda b: zipped(b, ZIP, flipped(good_zip(b), 1))
    yield (
        "zip-flip-central-signature",
        lambda b: zipped(b, ZIP, flipped(good_zip(b), good_zip(b).rindex(b"PK\x01\x02") + 2)),
    )
    yield (
        "zip-flip-end-signature",
        lambda b: zipped(b, ZIP, flipped(good_zip(b), good_zip(b).rindex(b"PK\x05\x06") + 2)),
    )
    for fraction in (0, 0.5):
        yield (
            f"zip-truncated-{fraction}",
            lambda b, f=fraction: zipped(
                b, "truncated or corrupt zip", good_zip(b)[: max(4, int(len(good_zip(b)) * f))]
            ),
        )
    for cut in (1, 23):
        yield (
            f"zip-truncated-minus-{cut}",
            lambda b, c=cut: zipped(b, "truncated or corrupt zip", good_zip(b)[:-c]),
        )
    yield "zip-bomb-3gib", lambda b: zipped(b, "over the package limit", bomb(b, 3 * GiB))
    yield "zip-bomb-1gib-ratio", lambda b: zipped(b, "zip bomb", bomb(b, GiB))
    yield "zip-bomb-64x16mib", lambda b: zipped(b, "zip bomb", raw_zip(
        [*package_members(b), *(Member(f"m.nnpkg/p{i}", *zeros(16 * MiB), 16 * MiB)
                                for i in range(64))]
    ))  # fmt: skip
    yield "zip-lying-size", lambda b: zipped(b, "m.nnpkg/pad", raw_zip(
        [*package_members(b), Member("m.nnpkg/pad", zeros(GiB)[0], 12345, 1000)]
    ))  # fmt: skip
    yield "zip-short-member", lambda b: zipped(b, "m.nnpkg/pad", raw_zip(
        [*package_members(b), Member("m.nnpkg/pad", deflate(bytes(1000))[:-3], 0, 10 * MiB)]
    ))  # fmt: skip
    yield "zip-duplicate-member", lambda b: zipped(b, "appears more than once", raw_zip(
        [*package_members(b), member("m.nnpkg/metadata/MANIFEST", b"{}")]
    ))  # fmt: skip
    yield "zip-duplicate-normalized", lambda b: zipped(b, "appears more than once", raw_zip(
        [*package_members(b), member("m.nnpkg/./metadata/MANIFEST", b"{}")]
    ))  # fmt: skip
    yield "zip-member-dotdot", lambda b: zipped(b, "points outside", raw_zip(
        [member("../evil", b"x"), *package_members(b)]
    ))  # fmt: skip
    yield "zip-encrypted", lambda b: zipped(b, "encrypted", raw_zip(
        [*package_members(b)[:-1], member("m.nnpkg/z", b"x", flags=1)]
    ))  # fmt: skip
    yield "zip-unknown-method", lambda b: zipped(b, "unsupported compression", raw_zip(
        [*package_members(b), member("m.nnpkg/z", b"x", method=99)]
    ))  # fmt: skip
    yield "zip-symlink-member", lambda b: zipped(b, "symbolic link", raw_zip(replaced(
        b, member("m.nnpkg/metadata/MANIFEST", b"", data=b"/etc/passwd", method=0, mode=0o120777)
    )))  # fmt: skip
    yield "zip-5000-members", lambda b: zipped(b, "members (at most", raw_zip(
        [*package_members(b), *(member(f"m.nnpkg/f{i}", b"") for i in range(5000))]
    ))  # fmt: skip
    yield (
        "zip-claims-65535-entries",
        lambda b: zipped(b, "members (at most", raw_zip(package_members(b), entries=65535)),
    )
    yield "zip-empty", lambda b: zipped(b, "no metadata/MANIFEST", raw_zip([]))
    yield "zip-without-manifest", lambda b: zipped(b, "no metadata/MANIFEST", raw_zip(
        [m for m in package_members(b) if not m.name.endswith("MANIFEST")]
    ))  # fmt: skip
    yield "zip-deep-manifest", lambda b: zipped(b, f"{ZIP}: MANIFEST", raw_zip(
        replaced(b, member("m.nnpkg/metadata/MANIFEST", b"[" * 100_000))
    ))  # fmt: skip


def bomb(b: Base, size: int) -> bytes:
    """The package plus one member of `size` zero bytes stored in about size / 1000 bytes."""
    stream, crc = zeros(size)
    return raw_zip([*package_members(b), Member("m.nnpkg/pad.bin", stream, crc, size)])


def other_cases():
    x = np.random.default_rng(1).random((3, 1, 3, 12, 12)).astype(np.float32)
    with_nan, with_inf = x.copy(), x.copy()
    with_nan[1, 0, 2, 3, 4] = np.nan
    with_inf[2, 0, 0, 0, 0] = -np.inf
    yield (
        "input-nan",
        lambda b: folder(
            b,
            "input 'x' sample 1 contains NaN or Inf (nan at [0, 2, 3, 4]",
            files={"in.npz": npz(x=with_nan)},
        ),
    )
    yield (
        "input-inf",
        lambda b: folder(
            b, "input 'x' sample 2 contains NaN or Inf (-inf", files={"in.npz": npz(x=with_inf)}
        ),
    )
    yield (
        "input-strings",
        lambda b: folder(b, "input 'x'", files={"in.npz": npz(x=np.full((1, 1, 3, 12, 12), "a"))}),
    )
    digits = ["run", str(EXAMPLES / "digits/digits.onnx"), "--input-shape", "input=1,1,8,8",
              "-i", "{tmp}/d.npz", "-o", "{tmp}/o.npz", "--auto-compile"]  # fmt: skip
    d = npz(input=np.zeros((2, 1, 1, 8, 8), np.float32))
    yield (
        "workspace-is-a-file",
        lambda b: Case(
            "", [*digits, "--workspace", "{tmp}/ws"], {"ws": "x", "d.npz": d}, "{tmp}/ws", (2,)
        ),
    )
    yield (
        "workspace-under-a-file",
        lambda b: Case(
            "",
            [*digits, "--workspace", "{tmp}/ws/inner"],
            {"ws": "x", "d.npz": d},
            "{tmp}/ws",
            (2,),
        ),
    )
    verify = ["verify", "{tmp}/bad.zip", "--reference", "REF", "-i", "{tmp}/in.npz"]

    def verify_case(b, data):
        return zipped(b, ZIP, data, [a.replace("REF", str(b.reference)) for a in verify])

    yield (
        "verify-flipped-zip",
        lambda b: verify_case(
            b, flipped(good_zip(b), sum(data_ranges(good_zip(b))[f"m.nnpkg/{TVN}"]) // 2)
        ),
    )
    yield "verify-bomb", lambda b: verify_case(b, bomb(b, 3 * GiB))
    yield (
        "inspect-truncated-zip",
        lambda b: zipped(
            b, "truncated or corrupt zip", good_zip(b)[:-30], ["inspect", "{tmp}/bad.zip"]
        ),
    )
    yield "inspect-link-outside", lambda b: folder(
        b, "points outside", argv=["inspect", "{tmp}/pkg"],
        setup=chain(copy_outside("metadata/MANIFEST", "MANIFEST"),
                    link("pkg/metadata/MANIFEST", "{tmp}/MANIFEST")),
    )  # fmt: skip
    yield (
        "inspect-duplicate-outputs",
        lambda b: folder(
            b, MANIFEST, changed(b, pkg_outputs=["2:0:0"] * 2), argv=["inspect", "{tmp}/pkg"]
        ),
    )


CASES = [
    (name, build)
    for source in (manifest_cases, path_cases, zip_cases, other_cases)
    for name, build in source()
]


@pytest.mark.parametrize("name, build", CASES, ids=[name for name, _ in CASES])
def test_hostile_package_fails_cleanly(base, tmp_path, name, build):
    case = build(base)
    case.id = name
    check_clean_failure(case, tmp_path)
    assert not (tmp_path / "out.npz").exists()


def test_the_corpus_is_sound(base, tmp_path):
    """The unmodified package, as a folder and as a hand-written zip, runs: each case fails for
    what it changed."""
    from hostile_cli import materialize, run_cli

    for case in (folder(base, ""), zipped(base, "", good_zip(base))):
        argv = materialize(case, tmp_path)
        result = run_cli(argv, tmp_path)
        assert result.returncode == 0, result.stderr.decode()
        assert (tmp_path / "out.npz").exists()
        (tmp_path / "out.npz").unlink()
    assert 60 <= len(CASES) <= 120
