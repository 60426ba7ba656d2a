"""Load recipe files into `Recipe` models, with errors that name the file, the field path and why."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import yaml
from pydantic import ValidationError

from zoe_cluster.recipes.schema import VARIANT_ENGINES, Recipe


class RecipeError(ValueError):
    """A recipe file that cannot be used; `problems` lists (field path, message) pairs."""

    def __init__(self, path: Path, problems: list[tuple[str, str]]):
        self.path = path
        self.problems = problems
        lines = [f"{path}: invalid recipe"] + [f"  {loc or '<root>'}: {msg}" for loc, msg in problems]
        super().__init__("\n".join(lines))


class RecipesNotFound(FileNotFoundError):
    """No folder with recipe files: neither $ZOE_RECIPES_DIR, the installed wheel's nor the checkout's."""


class UnknownModelError(KeyError):
    def __init__(self, name: str, known: list[str]):
        self.name, self.known = name, known
        super().__init__(f"unknown model '{name}'; known models: {', '.join(known) or '(none)'}")

    def __str__(self) -> str:  # KeyError would quote the message
        return self.args[0]


def _loc(parts: tuple) -> str:
    out = ""
    for p in parts:
        if isinstance(p, int):
            out += f"[{p}]"
        elif p in VARIANT_ENGINES and out.startswith("variants."):
            continue  # the discriminated union's tag, not a field the user wrote
        else:
            out += ("." if out else "") + str(p)
    return out


def parse_recipe(data: object, path: Path) -> Recipe:
    if not isinstance(data, dict):
        raise RecipeError(path, [("", f"expected a mapping at the top level, got {type(data).__name__}")])
    try:
        return Recipe.model_validate(data)
    except ValidationError as e:
        raise RecipeError(path, [(_loc(err["loc"]), err["msg"]) for err in e.errors()]) from None


def load_recipe_file(path: str | Path) -> Recipe:
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as e:
        raise RecipeError(path, [("", f"cannot read: {e.strerror}")]) from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise RecipeError(path, [(where, f"YAML syntax: {getattr(e, 'problem', e)}")]) from None
    recipe = parse_recipe(data, path)
    if recipe.name != path.stem:
        raise RecipeError(path, [("name", f"'{recipe.name}' must match the file name '{path.stem}'")])
    return recipe


BUILTIN_DIR = Path(__file__).resolve().with_name("builtin")
"""Where an installed wheel keeps the built-in recipes (the data package `zoe_cluster.recipes.builtin`)."""
CHECKOUT_DIR = Path(__file__).resolve().parents[2] / "recipes"
"""Where a source checkout (or an editable install) keeps them: recipes/ at the top of the repository."""


def default_recipes_dir() -> Path:
    """$ZOE_RECIPES_DIR, else the recipes shipped in the wheel, else the recipes/ folder of this checkout.

    Raises RecipesNotFound naming every place looked at when none holds a recipe file, so an install
    without recipes fails loudly instead of listing no models."""
    env = os.environ.get("ZOE_RECIPES_DIR")
    if env:
        if not any(Path(env).glob("*.yaml")):
            raise RecipesNotFound(f"ZOE_RECIPES_DIR={env}: no recipe files (*.yaml) there")
        return Path(env)
    for folder in (BUILTIN_DIR, CHECKOUT_DIR):
        if any(folder.glob("*.yaml")):
            return folder
    raise RecipesNotFound(
        f"no recipe files (*.yaml) in {BUILTIN_DIR} (installed wheel) or {CHECKOUT_DIR} (source checkout); "
        "set ZOE_RECIPES_DIR to a folder of recipes"
    )


@dataclass(frozen=True)
class RecipeRegistry:
    """The recipes of one folder, loaded on demand."""

    root: Path

    @classmethod
    def default(cls) -> "RecipeRegistry":
        return cls(default_recipes_dir())

    def names(self) -> list[str]:
        return sorted(p.stem for p in self.root.glob("*.yaml"))

    def get(self, name: str) -> Recipe:
        path = self.root / f"{name}.yaml"
        if not path.is_file():
            raise UnknownModelError(name, self.names())
        return load_recipe_file(path)

    def all(self) -> list[Recipe]:
        return [self.get(n) for n in self.names()]
