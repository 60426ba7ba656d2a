"""examples/ray-cluster-mi355x.yaml passes the checks `ray up` runs before touching any machine."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml

CONFIG = Path(__file__).resolve().parents[2] / "examples" / "ray-cluster-mi355x.yaml"


def _validate(cfg: dict) -> dict:
    from ray.autoscaler._private.util import prepare_config, validate_config

    prepared = prepare_config(copy.deepcopy(cfg))
    validate_config(prepared)
    return prepared


def test_ray_up_config_validates_like_ray_up():
    cfg = yaml.safe_load(CONFIG.read_text())
    prepared = _validate(cfg)
    assert prepared["provider"]["type"] == "local"
    assert prepared["docker"]["image"].startswith("vllm/vllm-openai-rocm")
    # workers expose 8 GPUs each and the ROCm devices reach the container
    assert any("--num-gpus=8" in c for c in prepared["worker_start_ray_commands"])
    assert {"--device=/dev/kfd", "--device=/dev/dri"} <= set(prepared["docker"]["run_options"])
    # zoe is installed in the image on every node, with the Ray version zoe pins
    assert "/opt/zoe" in prepared["file_mounts"]
    assert any("/opt/zoe" in c for c in prepared["setup_commands"])
    assert any("ray[default]==2.60.0" in c for c in prepared["setup_commands"])


def test_engine_images_of_the_recipes_are_the_ones_the_config_names():
    from zoe_cluster.recipes.loader import RecipeRegistry

    cfg = yaml.safe_load(CONFIG.read_text())
    images = {v.image.split(":")[0] for r in RecipeRegistry.default().all() for v in r.variants.values()}
    assert cfg["docker"]["image"].split(":")[0] in images
    text = CONFIG.read_text()
    assert all(img in text for img in images), "every engine image family is named in the config's comments"


def test_a_broken_config_is_rejected():
    cfg = yaml.safe_load(CONFIG.read_text())
    bad = copy.deepcopy(cfg)
    bad["max_workers"] = "many"
    with pytest.raises(Exception):
        _validate(bad)
    bad = copy.deepcopy(cfg)
    bad["docker"]["run_options"] = "--device=/dev/kfd"
    with pytest.raises(Exception):
        _validate(bad)
