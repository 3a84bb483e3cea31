"""The embedded defaults ship built (verl_ext/demo/built): each build is current for this code, every file is the one
its stamp hashed, and the policies load on this machine and score inside the bands their demos learn in.

A failure names the file and the command that rebuilds it (make defaults)."""

import json
import shutil
from dataclasses import replace

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from verl_ext.demo import build
from verl_ext.demo.build import (PROFILES, SHIPPED_PROFILES, START_REWARD_BANDS, DemoAssetsError, ensure_demo_assets,
                                 make_splits, measure_start_reward)
from verl_ext.demo.stamp import MARKER_NAME


@pytest.mark.parametrize("profile", SHIPPED_PROFILES)
def test_each_shipped_file_is_the_one_its_stamp_hashed(profile):
    assets = ensure_demo_assets(profile=profile)  # refuses a changed, missing or added file, naming it
    stamp = json.loads((assets.model_path.parent / MARKER_NAME).read_text())
    assert {"model/model.safetensors", "model/tokenizer.json", "train.parquet", "build.json"} <= set(stamp["files"])
    assert stamp["profile"] == profile and "torch_cpu_capability" in stamp["float_path"]
    assert {"torch", "transformers"} <= set(stamp["versions"]) and "warm_start_seed" in stamp


@pytest.fixture
def shipped_copy(tmp_path, monkeypatch):
    """The shipped dense default copied to a folder the test may damage, which stands for the package's."""
    source = build._folder(build.SHIPPED_ROOT, "full")
    shutil.copytree(source, tmp_path / source.name)
    monkeypatch.setattr(build, "SHIPPED_ROOT", tmp_path)
    return tmp_path / source.name


def _flip_one_byte(path):
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("name", ["model/model.safetensors", "model/tokenizer.json", "train.parquet", "build.json"])
def test_a_shipped_file_changed_by_one_byte_is_refused_by_name_with_the_rebuild_command(shipped_copy, name):
    ensure_demo_assets()  # control: the copy loads as shipped
    _flip_one_byte(shipped_copy / name)
    with pytest.raises(DemoAssetsError) as error:
        ensure_demo_assets()
    message = str(error.value)
    assert f"{name} differs from its stamp" in message and build.REBUILD_SHIPPED in message, message
    assert "\n" not in message


def test_a_stale_shipped_build_is_refused_not_rebuilt(shipped_copy, monkeypatch):
    monkeypatch.setattr(build, "BUILD_VERSION", build.BUILD_VERSION + 1)  # as after a change to the task
    shipped_copy.rename(build._folder(build.SHIPPED_ROOT, "full"))
    monkeypatch.setattr(build, "_build_atomically", lambda *a: pytest.fail("rebuilt a shipped build unasked"))
    with pytest.raises(DemoAssetsError, match=f"made by other code or settings.*{build.REBUILD_SHIPPED}"):
        ensure_demo_assets()


def test_an_unshipped_profile_names_the_data_dir():
    with pytest.raises(DemoAssetsError, match="does not ship.*verl_ext.data_dir"):
        ensure_demo_assets(profile="test")


# Answers the test samples: four times the build's 64. Another processor's rounding draws other answers from the
# same policy, and the mean of 64 moves by about 0.04 (its standard error at the hybrid's 0.70); of 256, by 0.02,
# a fifth of the distance to the nearer end of the band.
SAMPLES = 256


@pytest.mark.parametrize("profile", [profile for profile in SHIPPED_PROFILES if profile in START_REWARD_BANDS])
def test_the_shipped_policy_scores_inside_its_band_here(profile):
    """The build's measurement (answers sampled at temperature 1 from its training prompts, seeded), run on this
    machine's float path: within the band in which the profile's demo learns."""
    assets = ensure_demo_assets(profile=profile)
    tokenizer = AutoTokenizer.from_pretrained(assets.tokenizer_path)
    model = AutoModelForCausalLM.from_pretrained(assets.model_path, dtype=torch.float32).eval()
    measured = replace(PROFILES[profile], eval_samples=SAMPLES)
    start_reward, _ = measure_start_reward(model, tokenizer, measured, make_splits(measured))
    low, high = START_REWARD_BANDS[profile]
    assert low <= start_reward <= high, (
        f"the shipped {profile} policy scores {start_reward:.3f} here, outside [{low}, {high}] (stamped: "
        f"{assets.report['start_reward']:.3f}); report it with lscpu's model name and flags")


def test_a_shipped_rebuild_repeats_the_seed_it_was_made_from(shipped_copy, monkeypatch):
    """`make defaults` passes no seed: each processor's float path keeps its own seeds in the band (the hybrid's on
    an AMD EPYC are not seed 0's), so a rebuild starts from the stamp's."""
    stamp = json.loads((shipped_copy / MARKER_NAME).read_text())
    (shipped_copy / MARKER_NAME).write_text(json.dumps({**stamp, "warm_start_seed": 7}))
    seeds = []
    monkeypatch.setattr(build, "_build_atomically", lambda root, final, profile, first_seed: seeds.append(first_seed))
    monkeypatch.setattr(build, "_load_built", lambda folder, fix: None)
    ensure_demo_assets(rebuild=True)
    ensure_demo_assets(rebuild=True, first_seed=2)
    assert seeds == [7, 2]
