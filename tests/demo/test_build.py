"""The cached demo build (tiny `test` profile): layout, reuse, verl's dataset, clear errors."""

import json
import os
import shutil
import subprocess
import sys
import textwrap

import pandas as pd
import pytest
from omegaconf import OmegaConf
from transformers import AutoTokenizer
from verl.utils.dataset.rl_dataset import RLHFDataset

from verl_ext.demo import build, reward, task
from verl_ext.demo.build import DemoAssetsError, ensure_demo_assets


def test_assets_point_at_built_files(test_assets):
    for path in (test_assets.model_path, test_assets.train_files, test_assets.val_files):
        assert path.exists()
    assert test_assets.tokenizer_path == test_assets.model_path
    assert test_assets.reward_path == type(test_assets.reward_path)(reward.__file__).resolve()
    assert test_assets.reward_name == "compute_score"
    assert 0.0 <= test_assets.report["start_reward"] <= 1.0
    assert test_assets.report["profile"] == "test"


def test_second_call_reuses_the_cache(test_assets, monkeypatch):
    data_dir = test_assets.model_path.parent.parent
    monkeypatch.setattr(build, "_build_into", lambda *a: pytest.fail("rebuilt a cached build"))
    again = ensure_demo_assets(data_dir, profile="test")
    assert again == test_assets


def test_verl_rlhf_dataset_loads_the_parquet(test_assets, tmp_path):
    tokenizer = AutoTokenizer.from_pretrained(test_assets.tokenizer_path)
    config = OmegaConf.create(
        {"max_prompt_length": 350, "filter_overlong_prompts_workers": 1, "cache_dir": str(tmp_path / "cache")}
    )
    dataset = RLHFDataset(str(test_assets.train_files), tokenizer, config)
    assert len(dataset) == build.PROFILES["test"].train_prompts  # none filtered as too long
    row = dataset[0]
    assert row["data_source"] == task.DATA_SOURCE
    assert row["raw_prompt"][0] == {"role": "system", "content": task.HEADER}
    assert row["raw_prompt"][1]["role"] == "user"
    assert row["reward_model"]["style"] == "rule"
    assert json.loads(row["reward_model"]["ground_truth"])  # a canonical JSON object
    assert row["extra_info"] == {"index": 0, "split": "train"}
    assert row["index"] == 0


def test_fresh_process_loads_model_and_tokenizer(test_assets, tmp_path):
    """What verl's workers do: load the folder in a new process; ids and template must match."""
    probe = 'Record:\n- name: alice\n{"name": "alice", "age": 31}\n\n'
    script = textwrap.dedent(
        f"""
        import json, sys
        from transformers import AutoModelForCausalLM, AutoTokenizer
        path = sys.argv[1]
        tok = AutoTokenizer.from_pretrained(path)
        model = AutoModelForCausalLM.from_pretrained(path)
        messages = [{{"role": "user", "content": "hi"}}]
        print(json.dumps({{
            "class": type(tok).__name__,
            "ids": tok({probe!r}, add_special_tokens=False)["input_ids"],
            "chat": tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False),
            "model_type": model.config.model_type,
            "vocab_size": model.config.vocab_size,
            "len_tokenizer": len(tok),
            "max_positions": model.config.max_position_embeddings,
            "dtype": str(model.dtype),
            "eos": model.generation_config.eos_token_id == tok.eos_token_id,
        }}))
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", script, str(test_assets.model_path)], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    loaded = json.loads(result.stdout.strip().splitlines()[-1])
    local = AutoTokenizer.from_pretrained(test_assets.tokenizer_path)
    assert loaded["ids"] == local(probe, add_special_tokens=False)["input_ids"]
    assert loaded["chat"] == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    assert loaded["model_type"] == "qwen2"
    assert loaded["vocab_size"] == loaded["len_tokenizer"]
    assert loaded["max_positions"] >= 1024
    assert loaded["dtype"] == "torch.float32"
    assert loaded["eos"]


@pytest.fixture
def cache_copy(test_assets, tmp_path):
    """A private copy of the built cache that a test may damage."""
    folder = test_assets.model_path.parent
    shutil.copytree(folder, tmp_path / folder.name)
    return tmp_path, tmp_path / folder.name


@pytest.mark.parametrize(
    "damage, cause",
    [
        (lambda f: (f / build.MARKER_NAME).unlink(), "incomplete"),
        (lambda f: (f / build.MARKER_NAME).write_text("{not json"), "unreadable"),
        (lambda f: (f / build.MARKER_NAME).write_text("[1, 2]"), "unreadable"),
        (lambda f: (f / "model" / "model.safetensors").unlink(), "missing model/model.safetensors"),
        (lambda f: (f / build.REPORT_NAME).write_text("{"), "build.json differs from its stamp"),
        (lambda f: (f / "model" / "stray.bin").write_bytes(b"x"), "model/stray.bin is not in its stamp"),
    ],
)
def test_damaged_cache_gives_cause_and_fix(cache_copy, damage, cause):
    data_dir, folder = cache_copy
    damage(folder)
    with pytest.raises(DemoAssetsError) as error:
        ensure_demo_assets(data_dir, profile="test")
    message = str(error.value)
    assert cause in message and "--rebuild" in message
    assert "\n" not in message


def test_stale_cache_is_rebuilt(cache_copy):
    data_dir, folder = cache_copy
    (folder / build.MARKER_NAME).write_text('{"version": 0}')  # as if built by an older verl_ext
    assets = ensure_demo_assets(data_dir, profile="test")
    assert json.loads((folder / build.MARKER_NAME).read_text())["version"] == build.BUILD_VERSION
    assert assets.train_files.exists()


def test_rebuild_repairs_a_damaged_cache_and_leaves_no_scratch(cache_copy):
    data_dir, folder = cache_copy
    (folder / build.MARKER_NAME).unlink()
    assets = ensure_demo_assets(data_dir, profile="test", rebuild=True)
    assert assets.train_files.exists()
    assert ensure_demo_assets(data_dir, profile="test") == assets
    assert sorted(name for name in os.listdir(data_dir) if not name.endswith(".lock")) == [folder.name]


def test_a_build_another_process_finished_is_not_built_again(test_assets, tmp_path):
    """Two processes on one data_dir (two runs, two test workers) build it once: the second waits for the first's
    lock, then loads that build."""
    final = tmp_path / test_assets.model_path.parent.name
    load = f"from verl_ext.demo.build import ensure_demo_assets; ensure_demo_assets({str(tmp_path)!r}, profile='test')"
    with build._build_lock(tmp_path, final):
        waiter = subprocess.Popen([sys.executable, "-c", load], stderr=subprocess.PIPE, text=True, cwd=tmp_path)
        assert "waiting for it" in waiter.stderr.readline()  # it reached the lock
        shutil.copytree(test_assets.model_path.parent, final)  # this process's build
        built = final.stat().st_ino
    assert waiter.wait(timeout=120) == 0, waiter.stderr.read()
    assert final.stat().st_ino == built  # loaded, not built again and swapped in


def test_unwritable_data_dir_gives_cause_and_fix(tmp_path):
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    with pytest.raises(DemoAssetsError, match="writable --data-dir"):
        ensure_demo_assets(blocker / "data", profile="test")


def test_unknown_profile_is_rejected(tmp_path):
    with pytest.raises(ValueError, match="unknown profile"):
        ensure_demo_assets(tmp_path, profile="huge")


def test_cli_prints_the_paths(test_assets, capsys):
    data_dir = test_assets.model_path.parent.parent
    assert build.main(["--data-dir", str(data_dir), "--profile", "test"]) == 0
    lines = dict(line.split("=", 1) for line in capsys.readouterr().out.splitlines())
    assert lines["model_path"] == str(test_assets.model_path)
    assert lines["train_files"] == str(test_assets.train_files)
    assert lines["reward_name"] == "compute_score"


def test_cli_reports_errors_in_one_line(tmp_path, capsys):
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    assert build.main(["--data-dir", str(blocker), "--profile", "test"]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "\n" not in err


def test_a_build_can_continue_from_another(test_assets, monkeypatch):
    """The long profile's mechanics at test size: the record-list task, warm-started from the test build's policy
    and tokenizer, and stale when that build is."""
    from dataclasses import replace

    from safetensors.torch import load_file

    long = replace(build.PROFILES["long"], train_prompts=4, val_prompts=2, sft_examples=20,
                   shape=build.PROFILES["test"].shape, eval_samples=2, max_answer_tokens=8,
                   sft=build.SFTConfig(record_only_steps=1, full_prompt_steps=1, batch_size=2, warmup_steps=1),
                   init_from="test")
    monkeypatch.setitem(build.PROFILES, "test_long", long)
    data_dir = test_assets.model_path.parent.parent
    assets = ensure_demo_assets(data_dir, profile="test_long")
    assert (assets.model_path / "tokenizer.json").read_text() == (test_assets.model_path / "tokenizer.json").read_text()
    base, tuned = load_file(test_assets.model_path / "model.safetensors"), load_file(assets.model_path / "model.safetensors")
    assert set(base) == set(tuned) and any(not (base[k] == tuned[k]).all() for k in base)  # continued, then trained
    row = pd.read_parquet(assets.train_files).iloc[0]
    assert row["prompt"][0]["content"] == task.LIST_HEADER
    assert isinstance(json.loads(row["reward_model"]["ground_truth"]), list)
    tokenizer = AutoTokenizer.from_pretrained(assets.tokenizer_path)
    beyond_the_built = assets.prompt_ids(8)[6:]  # 4 train + 2 val prompts, then new examples of the same task
    assert all("Records:" in tokenizer.decode(ids) for ids in beyond_the_built)
    stamp = build.current_stamp(data_dir, "test_long")
    monkeypatch.setitem(build.PROFILES, "test", replace(build.PROFILES["test"], seed=1))
    assert build.current_stamp(data_dir, "test_long") != stamp  # a base built with other settings makes it stale


def test_a_rebuilt_base_makes_the_build_continued_from_it_stale(cache_copy, monkeypatch):
    from dataclasses import replace

    data_dir, base = cache_copy
    monkeypatch.setitem(build.PROFILES, "test_next", replace(build.PROFILES["test"], init_from="test"))
    ensure_demo_assets(data_dir, profile="test_next")  # a build at test size, stamped with its base's stamp
    assert build._is_current(data_dir, "test_next", fix="")
    stamp = json.loads((base / build.MARKER_NAME).read_text())
    (base / build.MARKER_NAME).write_text(json.dumps({**stamp, "warm_start_seed": 7}))  # as a rebuild stamps anew
    assert build._is_current(data_dir, "test", fix="")  # the base is still current
    assert not build._is_current(data_dir, "test_next", fix="")  # what continued from the old one is not


def test_a_warm_start_outside_its_band_is_refused_and_not_kept(tmp_path, monkeypatch):
    # the test profile has no band; give it one its tiny warm start cannot reach
    monkeypatch.setitem(build.START_REWARD_BANDS, "test", (1.5, 2.0))
    with pytest.raises(DemoAssetsError, match=r"start reward of [0-9.]+, outside \[1.5, 2.0\].*--first-seed 3"):
        ensure_demo_assets(tmp_path, profile="test")
    assert not (tmp_path / f"demo-v{build.BUILD_VERSION}-test").exists()
    assert not list(tmp_path.glob(".demo-*.building-*"))  # no scratch left behind


def test_a_stalled_warm_start_starts_again_from_the_next_seed(tmp_path, monkeypatch):
    # every seed's warm start stalls: the build tries each, then refuses, keeping nothing
    monkeypatch.setitem(build.FORMATION_CHECKS, "test", build.FormationCheck(step=1, max_loss=0.0))
    with pytest.raises(DemoAssetsError) as error:
        ensure_demo_assets(tmp_path, profile="test")
    message = str(error.value)
    assert f"refused from each of {build.WARM_START_ATTEMPTS} seeds" in message and "\n" not in message
    assert all(f"seed {seed}: loss " in message for seed in range(build.WARM_START_ATTEMPTS))
    assert f"--first-seed {build.WARM_START_ATTEMPTS}" in message and "report it" in message  # the fix
    assert not list(tmp_path.glob("demo-*")) and not list(tmp_path.glob(".demo-*.building-*"))

    # the first seed's stalls (the check refuses it), the second's is kept
    warm_start = build._warm_start

    def first_seed_stalls(root, profile, splits, seed_offset):
        checks = {"test": build.FormationCheck(step=1, max_loss=0.0)} if seed_offset == 0 else {}
        monkeypatch.setattr(build, "FORMATION_CHECKS", checks)
        return warm_start(root, profile, splits, seed_offset)

    monkeypatch.setattr(build, "_warm_start", first_seed_stalls)
    report = ensure_demo_assets(tmp_path, profile="test").report
    assert report["warm_start_seed"] == 1 and len(report["refused_warm_starts"]) == 1
    assert report["refused_warm_starts"][0].startswith("seed 0: loss ")


def test_a_build_searches_seeds_from_the_first_one_it_is_given(tmp_path, monkeypatch):
    monkeypatch.setitem(build.FORMATION_CHECKS, "test", build.FormationCheck(step=1, max_loss=0.0))
    with pytest.raises(DemoAssetsError) as error:
        ensure_demo_assets(tmp_path, profile="test", first_seed=5)
    tried = [f"seed {seed}: loss " in str(error.value) for seed in range(5 + build.WARM_START_ATTEMPTS + 1)]
    assert tried == [False] * 5 + [True] * build.WARM_START_ATTEMPTS + [False]
    monkeypatch.setitem(build.FORMATION_CHECKS, "test", None)
    assert ensure_demo_assets(tmp_path, profile="test", first_seed=5).report["warm_start_seed"] == 5


@pytest.mark.parametrize("profile,start_reward,refused", [
    # full: 0.52 and 0.68, the two processors measured (docs/running.md); below, a warm start that did not take;
    # above, no room for the demo's learning bar
    ("full", 0.39, True), ("full", 0.52, False), ("full", 0.68, False), ("full", 0.86, True),
    # hybrid (its recipe on 8 prompts): 0.676 and 0.748, builds whose demo learned (+0.157, +0.158); 0.587, one that
    # learned +0.099; 0.35 and 0.48, late-formed copying; 0.86, no room (docs/design-notes.md, "The hybrid default")
    ("hybrid", 0.35, True), ("hybrid", 0.48, True), ("hybrid", 0.587, True), ("hybrid", 0.676, False),
    ("hybrid", 0.748, False), ("hybrid", 0.86, True),
])
def test_each_build_s_band(profile, start_reward, refused):
    assert (build.outside_band(profile, start_reward) is not None) == refused


def test_the_hybrid_build_at_test_size(tmp_path, monkeypatch):
    """demo_cpu_hybrid's build at test size: a Qwen3.5-shaped policy (Gated DeltaNet and full attention) warm-starts,
    is saved and loads back as that architecture."""
    from dataclasses import replace

    hybrid = replace(build.PROFILES["hybrid"], train_prompts=4, val_prompts=2, sft_examples=20, eval_samples=2,
                     max_answer_tokens=8, shape=replace(build.PROFILES["hybrid"].shape, hidden_size=64),
                     sft=build.SFTConfig(record_only_steps=1, full_prompt_steps=1, batch_size=2, warmup_steps=1))
    monkeypatch.setitem(build.PROFILES, "test_hybrid", hybrid)
    assets = ensure_demo_assets(tmp_path, profile="test_hybrid")
    config = json.loads((assets.model_path / "config.json").read_text())
    assert config["model_type"] == "qwen3_5_text"
    assert config["layer_types"] == ["linear_attention"] * 3 + ["full_attention"]  # Qwen3.5's pattern
