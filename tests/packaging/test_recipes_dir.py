"""Where `RecipeRegistry.default()` finds recipes: $ZOE_RECIPES_DIR, the wheel's data package, the checkout."""

from __future__ import annotations

import shutil

import pytest

from tests.conftest import REPO
from zoe_cluster.recipes import RecipeRegistry, loader


def test_an_installed_wheels_recipes_come_before_the_checkouts(tmp_path, monkeypatch):
    monkeypatch.delenv("ZOE_RECIPES_DIR", raising=False)
    shutil.copy(REPO / "recipes" / "kimi-k3.yaml", tmp_path / "kimi-k3.yaml")
    monkeypatch.setattr(loader, "BUILTIN_DIR", tmp_path)
    assert RecipeRegistry.default().names() == ["kimi-k3"]


def test_a_checkout_without_a_wheel_reads_recipes_at_its_top(monkeypatch, tmp_path):
    monkeypatch.delenv("ZOE_RECIPES_DIR", raising=False)
    monkeypatch.setattr(loader, "BUILTIN_DIR", tmp_path / "absent")
    assert loader.default_recipes_dir() == REPO / "recipes"
    assert len(RecipeRegistry.default().names()) == len(list((REPO / "recipes").glob("*.yaml")))


def test_no_recipes_anywhere_is_an_error_naming_each_place(monkeypatch, tmp_path):
    monkeypatch.delenv("ZOE_RECIPES_DIR", raising=False)
    monkeypatch.setattr(loader, "BUILTIN_DIR", tmp_path / "wheel")
    monkeypatch.setattr(loader, "CHECKOUT_DIR", tmp_path / "checkout")
    with pytest.raises(loader.RecipesNotFound, match="wheel.*installed wheel.*checkout.*source checkout"):
        RecipeRegistry.default()
    monkeypatch.setenv("ZOE_RECIPES_DIR", str(tmp_path))
    with pytest.raises(loader.RecipesNotFound, match=f"ZOE_RECIPES_DIR={tmp_path}"):
        RecipeRegistry.default()
