"""Model assets derived from the shipped ones on first use: too big to ship, exact to rebuild.

A recipe in ``derived.toml`` (next to this file) names a shipped model and how to widen it. The
first use (``@derived/<name>`` in a pair, or ``python -m avbench.assets.derived``, which
``make setup`` runs) builds a complete Hugging Face model directory into the cache, atomically,
and checks the sha256 of its weights against the one recorded with the recipe; later uses check
the cached file again (once per process and file version). torch and safetensors are imported
only to derive.

Widening (``widen``): every layer's MLP grows from I to W units. The new gate and up rows draw
uniformly with the root mean square of that layer's existing rows; the new down_proj columns
draw the same way times ``epsilon`` at the existing down_proj's scale. With epsilon 0 the new
units add exact zeros and the model computes what the source does. ``logit_scale`` multiplies
the final norm's weight: a power of two, so the logits are exactly the source's times it (the
source at temperature 1 / logit_scale), a sharper target whose disagreement with its drafter
grows where the drafter is unsure. Uniform, not normal: torch's
CPU normal sampler gives other values on another instruction set (DEFAULT vs AVX2, after bf16
rounding too), while its uniform draws are 24-bit integers times 2^-24, the same everywhere; the
affine map after them is one correctly rounded float32 operation. Each unit's pre-activation sums
128 such weights, so it is near-normal all the same.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import shutil
import sys
import tempfile
import time
import tomllib
from collections.abc import Mapping
from functools import cache
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from avbench.errors import AssetError

if TYPE_CHECKING:
    import torch

ASSETS_DIR = Path(__file__).parent
RECIPES_FILE = ASSETS_DIR / "derived.toml"
PREFIX = "@derived/"
WEIGHTS = "model.safetensors"
# Copied from the source as they are: the tokenizer with its chat template, generation defaults.
COPIED = ("generation_config.json", "tokenizer.json", "tokenizer_config.json")
_MLP = re.compile(r"model\.layers\.(\d+)\.mlp\.(gate|up|down)_proj\.weight")
_FINAL_NORM = "model.norm.weight"
_HASH_CHUNK = 1 << 20


class WideRecipe(BaseModel):
    """How one derived model is made from a shipped one; ``sha256`` is what it must hash to."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    name: str
    source: str  # a model dir under avbench/assets/
    width: int = Field(gt=0, le=1 << 20)  # MLP units per layer after widening
    epsilon: float = Field(ge=0)  # scale of the new down_proj columns, relative to the old ones
    logit_scale: float = 1.0  # the final norm's weight times this power of two
    seed: int = Field(ge=0)
    # bf16 like the shipped assets: the cast is exact for the source and round-to-nearest-even
    # (deterministic) for the draws; it keeps epsilon-sized weights to 2^-9 relative, as float32
    # would keep them to 2^-24, and halves the file.
    dtype: Literal["bfloat16", "float32"] = "bfloat16"
    sha256: str = Field(pattern=r"^([0-9a-f]{64})?$")  # of model.safetensors; "": not checked
    torch: str  # the torch version the hash was recorded with (named when it differs)

    @field_validator("logit_scale")
    @classmethod
    def _power_of_two(cls, value: float) -> float:
        # only a power of two scales every logit exactly (bf16 weight and float32 arithmetic)
        if value <= 0 or math.frexp(value)[0] != 0.5:
            raise ValueError("expected a power of two (0.5, 1, 2, 4, ...)")
        return value

    @property
    def ref(self) -> str:
        return PREFIX + self.name

    @property
    def source_dir(self) -> Path:
        return ASSETS_DIR / self.source

    def key(self) -> str:
        """Short hash of what the derived bytes depend on: the recipe and the source's weights."""
        inputs = self.model_dump(
            include={"source", "width", "epsilon", "logit_scale", "seed", "dtype"}
        )
        inputs["source_sha256"] = file_sha256(self.source_file(WEIGHTS))
        return hashlib.sha256(json.dumps(inputs, sort_keys=True).encode()).hexdigest()[:12]

    def source_file(self, name: str) -> Path:
        path = self.source_dir / name
        if not path.is_file():
            raise AssetError(
                f"{path}: missing; recipe {self.name} ({RECIPES_FILE}) derives from the shipped "
                f"model dir {self.source!r}, which needs {name}"
            )
        return path


def cache_root() -> Path:
    """``$AVBENCH_CACHE``, else ``~/.cache/avbench`` (where ``make vllm-src`` unpacks too)."""
    return Path(os.environ.get("AVBENCH_CACHE") or Path.home() / ".cache" / "avbench").expanduser()


def derived_dir(recipe: WideRecipe) -> Path:
    return cache_root() / "derived" / f"{recipe.name}-{recipe.key()}" / "target"


@cache
def recipes() -> dict[str, WideRecipe]:
    try:
        data = tomllib.loads(RECIPES_FILE.read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise AssetError(f"{RECIPES_FILE}: cannot read the derived-asset recipes ({exc})") from None
    out = {}
    for name, body in data.items():
        try:
            out[name] = WideRecipe.model_validate({"name": name, **body})
        except TypeError:
            raise AssetError(f"{RECIPES_FILE}: {name}: expected a table") from None
        except ValidationError as exc:
            err = exc.errors()[0]
            field = ".".join(str(p) for p in err["loc"])
            raise AssetError(f"{RECIPES_FILE}: {name}.{field}: {err['msg']}") from None
    return out


def recipe(name: str) -> WideRecipe:
    found = recipes()
    if name not in found:
        raise AssetError(
            f"{PREFIX + name!r}: no such derived asset (recipes in {RECIPES_FILE.name}: "
            f"{', '.join(sorted(found)) or 'none'})"
        )
    return found[name]


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as fh:
        while chunk := fh.read(_HASH_CHUNK):
            h.update(chunk)
    return h.hexdigest()


# ----------------------------------------------------------------------------- widening
def _rms(w: torch.Tensor) -> float:
    """Root mean square, exactly rounded (math.fsum of exact float64 squares): a torch
    reduction's order, hence its last bit, may depend on the instruction set."""
    values = w.double().flatten().tolist()
    return math.sqrt(math.fsum(v * v for v in values) / len(values))


def _uniform(shape: tuple[int, int], rms: float, gen: torch.Generator) -> torch.Tensor:
    """Uniform on [-a, a) with root mean square ``rms`` (a = sqrt(3) rms), float32."""
    import torch

    u = torch.rand(shape, generator=gen, dtype=torch.float32)  # k * 2^-24: exact
    return (u - 0.5) * (2 * math.sqrt(3) * rms)  # the subtraction is exact, the product rounds once


def widen(state: Mapping[str, torch.Tensor], recipe: WideRecipe) -> dict[str, torch.Tensor]:
    """The source's weights with every layer's MLP widened to ``recipe.width`` units and the final
    norm scaled by ``recipe.logit_scale`` (module docstring); the first I units, and every other
    tensor, are the source's unchanged."""
    import torch

    mlp: dict[int, dict[str, torch.Tensor]] = {}
    for name, w in state.items():
        if m := _MLP.fullmatch(name):
            mlp.setdefault(int(m[1]), {})[m[2]] = w
    if not mlp or any(len(parts) != 3 for parts in mlp.values()):
        raise AssetError(
            f"{recipe.source_dir / WEIGHTS}: expected gate, up and down projections in every "
            f"layer (model.layers.<i>.mlp.*_proj.weight); found layers {sorted(mlp)}"
        )
    gen = torch.Generator(device="cpu").manual_seed(recipe.seed)
    dtype = getattr(torch, recipe.dtype)
    out = {name: w.to(dtype) for name, w in state.items()}
    for layer in sorted(mlp):  # the draws' order is the layers' order, gate, up, down
        gate, up, down = (mlp[layer][p] for p in ("gate", "up", "down"))
        units, hidden = gate.shape
        if recipe.width <= units:
            raise AssetError(
                f"recipe {recipe.name}: width {recipe.width} is not above the source's "
                f"{units} MLP units ({RECIPES_FILE})"
            )
        new = (recipe.width - units, hidden)
        prefix = f"model.layers.{layer}.mlp."
        for part, w in (("gate", gate), ("up", up)):
            out[prefix + f"{part}_proj.weight"] = torch.cat(
                [w.to(dtype), _uniform(new, _rms(w), gen).to(dtype)]
            )
        cols = _uniform((hidden, new[0]), recipe.epsilon * _rms(down), gen)
        out[prefix + "down_proj.weight"] = torch.cat([down.to(dtype), cols.to(dtype)], dim=1)
    if recipe.logit_scale != 1:
        if _FINAL_NORM not in state:
            raise AssetError(
                f"{recipe.source_dir / WEIGHTS}: logit_scale needs the final norm's weight "
                f"({_FINAL_NORM}), which it lacks"
            )
        out[_FINAL_NORM] = (state[_FINAL_NORM].float() * recipe.logit_scale).to(dtype)
    return out


# ----------------------------------------------------------------------------- derivation
def _mismatch(recipe: WideRecipe, path: Path, actual: str, cause: str) -> AssetError:
    try:  # read from the installed metadata: checking a cached file does not import torch
        installed = metadata.version("torch")
    except metadata.PackageNotFoundError:
        installed = "not installed"
    return AssetError(
        f"{path}: sha256 {actual}, expected {recipe.sha256} (recipe {recipe.name} in "
        f"{RECIPES_FILE}, recorded with torch {recipe.torch}; this is torch {installed}): {cause}"
    )


def derive(recipe: WideRecipe, dest: Path) -> Path:
    """Write the derived model dir ``dest`` (config.json with the new width, the weights, the
    source's tokenizer and generation config) into a temp dir beside it, check its hash, then
    rename it into place: ``dest`` is complete or absent. Returns ``dest``."""
    try:
        import torch
        from safetensors import SafetensorError
        from safetensors.torch import load_file, save_file
    except ImportError as exc:
        raise AssetError(
            f"deriving {recipe.ref} needs torch and safetensors ({exc}); install vLLM or "
            "avbench[trace]"
        ) from None
    config = json.loads(recipe.source_file("config.json").read_text(encoding="utf-8"))
    copied = [recipe.source_file(name) for name in COPIED]
    try:
        state = load_file(recipe.source_file(WEIGHTS))
    except (SafetensorError, OSError) as exc:
        raise AssetError(
            f"{recipe.source_dir / WEIGHTS}: cannot read the weights ({exc})"
        ) from None
    weights = widen(state, recipe)
    config["intermediate_size"] = recipe.width
    config["dtype"] = recipe.dtype

    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", dir=dest.parent))
    try:
        save_file(weights, str(tmp / WEIGHTS), metadata={"format": "pt"})
        (tmp / "config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
        for path in copied:
            shutil.copyfile(path, tmp / path.name)
        made = {"recipe": recipe.model_dump(), "torch": torch.__version__}
        (tmp / "recipe.json").write_text(json.dumps(made, indent=2) + "\n", encoding="utf-8")
        actual = file_sha256(tmp / WEIGHTS)
        if recipe.sha256 and actual != recipe.sha256:
            raise _mismatch(
                recipe, dest / WEIGHTS, actual,
                "likely another torch version (its CPU generator or bf16 rounding); trace the "
                "pair offline and record the new hash if the weights are sane",
            )  # fmt: skip
        # mkdtemp makes the dir private, safetensors the file: other users of a cache read them
        tmp.chmod(0o755)
        (tmp / WEIGHTS).chmod(0o644)
        try:
            tmp.rename(dest)
        except OSError:
            if not (dest / WEIGHTS).is_file():
                raise
            verify(recipe, dest)  # another process derived it first: keep that one
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return dest


# A cached file checked in this process, by (inode, size, mtime): rehashing ~50 MB at every
# resolution of a pair (several per cell) would cost seconds per sweep.
_verified: dict[Path, tuple[int, int, int]] = {}


def verify(recipe: WideRecipe, dest: Path) -> None:
    """A cached derived dir is complete and its weights hash to the recipe's sha256."""
    for name in ("config.json", WEIGHTS, *COPIED):
        if not (dest / name).is_file():
            raise AssetError(
                f"{dest / name}: missing from the derived {recipe.ref}; delete {dest.parent} "
                "to derive it again"
            )
    path = dest / WEIGHTS
    st = path.stat()
    stamp = (st.st_ino, st.st_size, st.st_mtime_ns)
    if _verified.get(path) == stamp or not recipe.sha256:
        return
    actual = file_sha256(path)
    if actual != recipe.sha256:
        raise _mismatch(
            recipe, path, actual,
            f"a torn or edited file, or one derived by another torch version; delete "
            f"{dest.parent} to derive it again",
        )  # fmt: skip
    _verified[path] = stamp


def ensure(name: str) -> Path:
    """The derived model dir of recipe ``name``, derived first if the cache lacks it (one line
    on stderr); checked against its recorded hash either way."""
    found = recipe(name)
    dest = derived_dir(found)
    if dest.is_dir():
        verify(found, dest)
        return dest
    print(
        f"avbench: deriving {found.ref} (width {found.width}, epsilon {found.epsilon}, logit "
        f"scale {found.logit_scale:g}, seed {found.seed}) from @assets/{found.source} into {dest} ...",
        file=sys.stderr,
        flush=True,
    )
    return derive(found, dest)


def main() -> None:
    """Derive (or check) every recipe: what ``make setup`` runs."""
    try:
        for name in recipes():
            start = time.perf_counter()
            path = ensure(name)
            print(f"{PREFIX}{name}: {path} ({time.perf_counter() - start:.1f} s)")
    except AssetError as exc:
        print(f"error: {exc}", file=sys.stderr)
        raise SystemExit(exc.exit_code) from None


if __name__ == "__main__":
    main()
