"""docker/: the checks of scripts/check_images.py on the committed files, and that each names the file
when something disagrees."""

from __future__ import annotations

import sys

import pytest
import yaml

from tests.conftest import REPO

sys.path.insert(0, str(REPO / "scripts"))
import check_images  # noqa: E402

SPEC = yaml.safe_load((REPO / "docker" / "images.yaml").read_text())
IMAGES, ZOE_PYTHON = SPEC["images"], SPEC["zoe_python"]


@pytest.mark.parametrize("name", sorted(IMAGES))
def test_each_dockerfile_parses_from_its_base_on_zoes_python(name):
    assert check_images.check_dockerfile(name, IMAGES[name], ZOE_PYTHON) == []


def test_every_recipe_image_has_an_image_built_from_it():
    assert check_images.check_recipes(IMAGES) == []
    bases = {e["base"] for e in IMAGES.values()}
    assert {"vllm/vllm-openai-rocm:v0.29.0", "lmsysorg/sglang-rocm:v0.5.19-rocm720-mi35x-20260910"} <= bases


def test_a_base_tag_that_disagrees_names_the_dockerfile():
    entry = {**IMAGES["zoe-sglang-rocm"], "base": "lmsysorg/sglang-rocm:v0.5.23-rocm720-mi35x"}
    (problem,) = check_images.check_dockerfile("zoe-sglang-rocm", entry, ZOE_PYTHON)
    assert problem.startswith("docker/zoe-sglang-rocm.Dockerfile: FROM resolves to "
                              "'lmsysorg/sglang-rocm:v0.5.19-rocm720-mi35x-20260910'")


def test_a_worker_on_another_python_than_zoes_is_refused():
    problems = check_images.check_dockerfile("zoe-vllm-rocm", IMAGES["zoe-vllm-rocm"], "3.11")
    assert problems == ["docker/zoe-vllm-rocm.Dockerfile: ARG ZOE_PYTHON=3.12 but zoe_python is 3.11 "
                        "(one Python per Ray cluster)"]


def test_a_recipe_image_without_a_dockerfile_names_the_recipe():
    images = {k: v for k, v in IMAGES.items() if k != "zoe-sglang-rocm"}
    problems = check_images.check_recipes(images)
    assert problems and all(p.startswith(("recipes/deepseek-v4-pro.yaml:", "recipes/kimi-k3.yaml:")) for p in problems)
    assert "lmsysorg/sglang-rocm:v0.5.19-rocm720-mi35x-20260910 (sglang) has no image built FROM it" in problems[0]


def test_the_charts_default_images_are_the_ones_docker_builds():
    values = yaml.safe_load((REPO / "helm" / "zoe" / "values.yaml").read_text())
    assert values["image"]["repository"].rsplit("/", 1)[-1] == "zoe" and "engine" not in IMAGES["zoe"]
    repositories = values["rayCluster"]["worker"]["image"]["repositories"]
    assert sorted(repositories) == sorted(n for n, e in IMAGES.items() if "engine" in e)  # every worker image
    for name, repository in repositories.items():
        assert repository.rsplit("/", 1)[-1] == name, (
            f"helm/zoe/values.yaml: rayCluster.worker.image.repositories.{name} is {repository}, not the {name} image "
            "of docker/images.yaml")
