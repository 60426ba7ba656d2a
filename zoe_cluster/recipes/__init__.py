"""Recipes: typed model + variant descriptions loaded from recipes/*.yaml."""

from zoe_cluster.recipes.loader import (
    RecipeError,
    RecipeRegistry,
    UnknownModelError,
    load_recipe_file,
    parse_recipe,
)
from zoe_cluster.recipes.schema import (
    KERNEL_NAMES,
    Figure,
    Recipe,
    SglangVariant,
    Variant,
    VllmVariant,
)

__all__ = [
    "KERNEL_NAMES", "Figure", "Recipe", "RecipeError", "RecipeRegistry", "SglangVariant", "UnknownModelError",
    "Variant", "VllmVariant", "load_recipe_file", "parse_recipe",
]
