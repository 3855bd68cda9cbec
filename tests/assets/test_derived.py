"""Derived assets (avbench/assets/derived.py): tiny-cpu-wide's target, rebuilt from its recipe
into a cache, exactly, or refused in one line."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from avbench.assets import derived
from avbench.errors import AssetError

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
safetensors_torch = pytest.importorskip("safetensors.torch")

REPO = Path(__file__).resolve().parents[2]
RECIPE = derived.recipe("tiny-wide")
SOURCE = RECIPE.source_dir
SOURCE_UNITS = 384
PROMPTS = (
    "Janet sells 16 - 3 - 4 = 9 duck eggs a day.",
    "def add(a, b):\n    return a + b",
    "<s><|user|>\nWhat is 2 + 3?\n<|assistant|>\n",
)


@pytest.fixture(scope="module")
def wide(tmp_path_factory) -> Path:
    """The real recipe, derived once into this module's cache (about 1.5 s)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("AVBENCH_CACHE", str(tmp_path_factory.mktemp("cache")))
        return derived.ensure("tiny-wide")


def small(**update) -> derived.WideRecipe:
    """The recipe at a small width, its hash unchecked unless given."""
    return RECIPE.model_copy(update={"width": 1024, "sha256": ""} | update)


def one_line(exc: pytest.ExceptionInfo) -> str:
    msg = str(exc.value)
    assert "\n" not in msg and "Traceback" not in msg
    return msg


def logits(path: Path) -> list:
    torch.set_num_threads(1)
    model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    tok = transformers.AutoTokenizer.from_pretrained(SOURCE)
    with torch.no_grad():
        return [model(tok(p, return_tensors="pt").input_ids).logits for p in PROMPTS]


def test_the_real_recipe_derives_to_its_recorded_hash(wide: Path):
    assert RECIPE.sha256 and derived.file_sha256(wide / derived.WEIGHTS) == RECIPE.sha256
    assert wide.name == "target" and wide.parent.name == f"tiny-wide-{RECIPE.key()}"
    assert wide.parents[1].name == "derived"
    assert sorted(p.name for p in wide.parent.iterdir()) == ["target"]  # no temp dir left


def test_the_widened_model_is_the_source_plus_new_units(wide: Path):
    config = json.loads((wide / "config.json").read_text())
    source_config = json.loads((SOURCE / "config.json").read_text())
    assert config == source_config | {"intermediate_size": RECIPE.width}
    for name in derived.COPIED:
        assert (wide / name).read_bytes() == (SOURCE / name).read_bytes()
    new, old = (safetensors_torch.load_file(d / derived.WEIGHTS) for d in (wide, SOURCE))
    assert set(new) == set(old) and all(w.dtype == torch.bfloat16 for w in new.values())
    grown = 4 * 3 * 128 * (RECIPE.width - SOURCE_UNITS)  # 4 layers x gate, up, down
    assert sum(w.numel() for w in new.values()) == sum(w.numel() for w in old.values()) + grown
    assert sum(w.numel() for w in new.values()) == 38_208_640
    for name, w in old.items():
        if name == "model.norm.weight":
            assert torch.equal(new[name], w * RECIPE.logit_scale)
        elif ".mlp." not in name:
            assert torch.equal(new[name], w), name
        elif "down_proj" in name:
            assert new[name].shape == (128, RECIPE.width)
            assert torch.equal(new[name][:, :SOURCE_UNITS], w)
            ratio = _rms(new[name][:, SOURCE_UNITS:]) / _rms(w)
            assert ratio == pytest.approx(RECIPE.epsilon, rel=0.01), name
        else:
            assert new[name].shape == (RECIPE.width, 128)
            assert torch.equal(new[name][:SOURCE_UNITS], w)
            assert _rms(new[name][SOURCE_UNITS:]) / _rms(w) == pytest.approx(1, rel=0.01), name


def _rms(w) -> float:
    return float(w.double().pow(2).mean().sqrt())


@pytest.mark.slow
def test_derivation_is_deterministic_on_any_instruction_set(wide: Path, tmp_path: Path):
    """A second derivation, in another process on torch's plain (non-AVX) CPU kernels, writes
    the same bytes: the hash recorded on one machine holds on another with this torch."""
    again = tmp_path / "again" / "target"
    code = f"from pathlib import Path; from avbench.assets import derived; derived.derive(derived.recipe('tiny-wide'), Path({str(again)!r}))"  # fmt: skip
    env = os.environ | {"ATEN_CPU_CAPABILITY": "default", "PYTHONPATH": str(REPO)}
    subprocess.run([sys.executable, "-c", code], env=env, cwd=REPO, check=True, timeout=120)
    assert (again / derived.WEIGHTS).read_bytes() == (wide / derived.WEIGHTS).read_bytes()


@pytest.mark.parametrize("width", [1024, RECIPE.width])
def test_epsilon_zero_computes_exactly_what_the_source_does(width: int, tmp_path: Path):
    dest = derived.derive(small(width=width, epsilon=0.0, logit_scale=1.0), tmp_path / "target")
    for got, want in zip(logits(dest), logits(SOURCE), strict=True):
        assert torch.equal(got, want)


def test_the_logit_scale_multiplies_every_logit_exactly(tmp_path: Path):
    """The wide target at epsilon 0 is its drafter at temperature 1 / logit_scale, bit for bit."""
    assert RECIPE.logit_scale == 4
    dest = derived.derive(small(epsilon=0.0), tmp_path / "target")
    for got, want in zip(logits(dest), logits(SOURCE), strict=True):
        assert torch.equal(got, want * RECIPE.logit_scale)


def test_epsilon_changes_the_function(tmp_path: Path):
    dest = derived.derive(small(logit_scale=1.0), tmp_path / "target")
    assert not any(torch.equal(a, b) for a, b in zip(logits(dest), logits(SOURCE), strict=True))


def test_a_hash_other_than_the_recorded_one_is_refused_and_nothing_is_left(tmp_path: Path):
    dest = tmp_path / "derived" / "x" / "target"
    with pytest.raises(AssetError) as exc:
        derived.derive(small(sha256="0" * 64), dest)
    msg = one_line(exc)
    assert f"{dest / derived.WEIGHTS}: sha256 " in msg and f"expected {'0' * 64}" in msg
    assert f"torch {RECIPE.torch}" in msg and "likely another torch version" in msg
    assert not dest.exists() and list(dest.parent.iterdir()) == []


@pytest.mark.parametrize("damage", ["torn", "edited"])
def test_a_torn_or_edited_cached_file_is_one_line(damage, wide: Path, tmp_path, monkeypatch):
    shutil.copytree(wide.parents[1], tmp_path / "derived")
    monkeypatch.setenv("AVBENCH_CACHE", str(tmp_path))
    path = derived.ensure("tiny-wide") / derived.WEIGHTS  # checked once: fine
    data = bytearray(path.read_bytes())
    if damage == "torn":
        data = data[: len(data) // 2]
    else:
        data[len(data) // 2] ^= 1
    path.write_bytes(bytes(data))
    with pytest.raises(AssetError) as exc:
        derived.ensure("tiny-wide")
    msg = one_line(exc)
    assert msg.startswith(f"{path}: sha256 {derived.file_sha256(path)}, expected {RECIPE.sha256}")
    assert "a torn or edited file" in msg and f"delete {path.parents[1]}" in msg


def test_a_cached_dir_missing_a_file_is_one_line(wide: Path, tmp_path, monkeypatch):
    shutil.copytree(wide.parents[1], tmp_path / "derived")
    monkeypatch.setenv("AVBENCH_CACHE", str(tmp_path))
    dest = derived.derived_dir(RECIPE)
    (dest / "tokenizer.json").unlink()
    with pytest.raises(AssetError) as exc:
        derived.ensure("tiny-wide")
    assert one_line(exc).startswith(f"{dest / 'tokenizer.json'}: missing from the derived")


def test_a_missing_source_is_one_line(tmp_path: Path):
    with pytest.raises(AssetError) as exc:
        derived.derive(small(source="tiny/nope"), tmp_path / "target")
    msg = one_line(exc)
    assert "tiny/nope/config.json: missing" in msg and "'tiny/nope'" in msg
    assert not (tmp_path / "target").exists()


def test_a_torn_source_is_one_line(tmp_path: Path, monkeypatch):
    assets = tmp_path / "assets"
    shutil.copytree(SOURCE, assets / RECIPE.source)
    weights = assets / RECIPE.source / derived.WEIGHTS
    weights.write_bytes(weights.read_bytes()[:1000])
    monkeypatch.setattr(derived, "ASSETS_DIR", assets)
    with pytest.raises(AssetError) as exc:
        derived.derive(small(), tmp_path / "target")
    assert one_line(exc).startswith(f"{weights}: cannot read the weights (")


def test_a_width_not_above_the_source_is_one_line(tmp_path: Path):
    with pytest.raises(AssetError) as exc:
        derived.derive(small(width=SOURCE_UNITS), tmp_path / "target")
    assert "width 384 is not above the source's 384 MLP units" in one_line(exc)


def test_an_unknown_recipe_lists_the_known_ones():
    with pytest.raises(AssetError) as exc:
        derived.recipe("nope")
    assert one_line(exc) == (
        "'@derived/nope': no such derived asset (recipes in derived.toml: tiny-wide)"
    )


@pytest.mark.parametrize(
    ("line", "bad_line", "message"),
    [
        ("width = 24576", "width = 0", "width: Input should be greater than 0"),
        (
            "logit_scale = 4",
            "logit_scale = 3",
            "logit_scale: Value error, expected a power of two (0.5, 1, 2, 4, ...)",
        ),
    ],
)
def test_a_bad_recipe_file_names_the_field(line, bad_line, message, tmp_path: Path, monkeypatch):
    bad = tmp_path / "derived.toml"
    text = derived.RECIPES_FILE.read_text()
    assert line in text
    bad.write_text(text.replace(line, bad_line))
    monkeypatch.setattr(derived, "RECIPES_FILE", bad)
    derived.recipes.cache_clear()
    try:
        with pytest.raises(AssetError) as exc:
            derived.recipes()
    finally:
        derived.recipes.cache_clear()
    assert one_line(exc) == f"{bad}: tiny-wide.{message}"


def test_make_setup_derives_or_checks_every_recipe(wide: Path, monkeypatch, capsys):
    """What `make setup` runs (python -m avbench.assets.derived): the path of each, or the
    error in one line with exit status 2."""
    monkeypatch.setenv("AVBENCH_CACHE", str(wide.parents[2]))
    derived.main()
    out, err = capsys.readouterr()
    assert out.startswith(f"@derived/tiny-wide: {wide} (") and err == ""
    monkeypatch.setenv("AVBENCH_CACHE", str(wide.parents[2] / "elsewhere"))
    monkeypatch.setattr(derived, "COPIED", ("nope.json",))
    with pytest.raises(SystemExit) as exit_:
        derived.main()
    assert exit_.value.code == 2
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith("avbench: deriving @derived/tiny-wide (width 24576")
    assert err[1].startswith("error: ") and "nope.json: missing" in err[1] and len(err) == 2
