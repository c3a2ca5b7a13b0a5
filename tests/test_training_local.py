"""The local trainer: GRPO/SFT math against hand-computed values, and real training steps.

The math tests force the built-in formulas (`use_verl=False`); `test_training_verl.py`
checks the same functions against veRL's `core_algos` in the `verl` nox session.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from openforge.training import algos
from openforge.training.batch import make_batch, response_logprobs
from openforge.training.metrics_log import read_metrics
from openforge.training.plot import write_curve
from openforge.training.policy import PolicyOptimizer, PolicyOptions, per_rollout_advantages
from openforge.types import Sample


@pytest.fixture(autouse=True)
def one_thread() -> object:
    """One intra-op thread: on a small shared CPU two threads are several times slower."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield None
    torch.set_num_threads(before)


# -- GRPO advantages ------------------------------------------------------------------------


def test_grpo_advantages_hand_computed() -> None:
    rewards = torch.tensor([1.0, 0.0, 0.0, 0.5, 0.5, 1.0])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0], [1, 1, 1], [1, 1, 0], [0, 1, 1], [1, 0, 0]],
                        dtype=torch.float32)
    groups = ["a", "a", "a", "b", "b", "c"]
    adv = algos.grpo_advantages(rewards, mask, groups, use_verl=False)
    # group a: mean 1/3, unbiased std sqrt(((2/3)^2 + 2 (1/3)^2) / 2) = sqrt(1/3)
    std_a = math.sqrt(1 / 3)
    assert adv[0, 0] == pytest.approx((2 / 3) / (std_a + 1e-6), abs=1e-6)
    assert adv[1, 0] == pytest.approx((-1 / 3) / (std_a + 1e-6), abs=1e-6)
    # group b: equal rewards -> 0 advantage; group c: a lone row keeps r / (1 + eps)
    assert torch.all(adv[3:5] == 0)
    assert adv[5, 0] == pytest.approx(1.0 / (1 + 1e-6), abs=1e-7)
    # broadcast over the response, zero where the mask is 0
    assert adv[0, 2] == 0 and adv[0, 1] == adv[0, 0]
    assert adv[2].tolist() == pytest.approx([adv[1, 0].item()] * 3)


def test_grpo_advantages_without_std() -> None:
    rewards = torch.tensor([1.0, 0.0, 0.0, 0.0])
    adv = algos.grpo_advantages(rewards, torch.ones(4, 1), ["g"] * 4, norm_by_std=False,
                                use_verl=False)
    assert adv[:, 0].tolist() == pytest.approx([0.75, -0.25, -0.25, -0.25])


def _sample(sid: str, rollout: str, task: str, reward: float, n: int = 3) -> Sample:
    return Sample(sample_id=sid, session_id=rollout, rollout_id=rollout, task_id=task,
                  prompt_ids=[1, 2], response_ids=list(range(10, 10 + n)),
                  response_mask=[1] * n, response_logprobs=[-1.0] * n, reward=reward)


def test_branches_of_one_rollout_count_once_in_the_group() -> None:
    # r1 was split into two samples (a history rewrite): it must not weigh double.
    samples = [_sample("r1/0", "r1", "t", 1.0), _sample("r1/1", "r1", "t", 1.0),
               _sample("r2/0", "r2", "t", 0.0)]
    adv = per_rollout_advantages(samples, torch.ones(3, 3), True, use_verl=False)
    expected = 0.5 / (math.sqrt(0.5) + 1e-6)  # two rollouts: mean 0.5, std sqrt(0.5)
    assert adv[0, 0] == pytest.approx(expected, abs=1e-6)
    assert adv[1, 0] == pytest.approx(expected, abs=1e-6)
    assert adv[2, 0] == pytest.approx(-expected, abs=1e-6)


# -- policy loss, KL, aggregation --------------------------------------------------------------


def _hand_policy_loss(old: float, new: float, adv: float, low: float = 0.2, high: float = 0.2,
                      c: float = 3.0) -> float:
    ratio = math.exp(new - old)
    loss = max(-adv * ratio, -adv * min(max(ratio, 1 - low), 1 + high))
    if adv < 0:
        loss = min(loss, -adv * c)
    return loss


def test_policy_loss_hand_computed() -> None:
    old = torch.tensor([[-1.0, -2.0, -0.5, -3.0], [-1.0, -1.0, -1.0, 0.0]])
    new = torch.tensor([[-0.5, -2.5, -0.5, 0.0], [-2.5, -1.1, -0.9, 0.0]])
    adv = torch.tensor([[1.0, 1.0, -2.0, 5.0], [-1.0, 0.5, -0.5, 9.0]])
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 0]], dtype=torch.float32)
    loss, metrics = algos.policy_loss(old, new, adv, mask, use_verl=False)
    per = [_hand_policy_loss(old[i, j].item(), new[i, j].item(), adv[i, j].item())
           for i in range(2) for j in range(3)]
    assert loss.item() == pytest.approx(sum(per) / 6, abs=1e-6)
    kl = [(old[i, j] - new[i, j]).item() for i in range(2) for j in range(3)]
    assert metrics["ppo_kl"] == pytest.approx(sum(kl) / 6, abs=1e-6)
    # clipped where the clipped term is the larger: (0,0) ratio e^.5 > 1.2 with A>0; (1,0):
    # ratio e^-1.5 < 0.8 with A<0; and (1,2) ratio e^.1 < 1.2 is not clipped.
    assert metrics["pg_clipfrac"] == pytest.approx(2 / 6, abs=1e-6)


def test_dual_clip_bounds_negative_advantages() -> None:
    # ratio e^3 with A = -1: unclipped loss 20.1, dual clip caps it at 3.
    loss, metrics = algos.policy_loss(torch.tensor([[-4.0]]), torch.tensor([[-1.0]]),
                                      torch.tensor([[-1.0]]), torch.ones(1, 1), use_verl=False)
    assert loss.item() == pytest.approx(3.0)
    assert metrics["pg_clipfrac_lower"] == 1.0


def test_micro_batches_add_up_to_the_batch_loss() -> None:
    g = torch.Generator().manual_seed(1)
    old, new, adv = (torch.randn(6, 5, generator=g) for _ in range(3))
    mask = (torch.rand(6, 5, generator=g) > 0.3).float()
    full, _ = algos.policy_loss(old, new, adv, mask, use_verl=False)
    total = float(mask.sum())
    parts = sum(algos.policy_loss(old[i:i + 2], new[i:i + 2], adv[i:i + 2], mask[i:i + 2],
                                  batch_num_tokens=total, use_verl=False)[0]
                for i in range(0, 6, 2))
    assert float(parts) == pytest.approx(float(full), abs=1e-6)


def test_kl_estimators() -> None:
    logp, ref = torch.tensor([-1.0, -2.0]), torch.tensor([-1.5, -1.0])
    k3 = algos.kl_penalty(logp, ref, "low_var_kl", use_verl=False)
    expected = [math.exp(r - p) - (r - p) - 1 for p, r in ((-1.0, -1.5), (-2.0, -1.0))]
    assert k3.tolist() == pytest.approx(expected, abs=1e-6)
    assert algos.kl_penalty(logp, ref, "k1", use_verl=False).tolist() == pytest.approx([0.5, -1.0])
    assert algos.kl_penalty(logp, ref, "k2", use_verl=False).tolist() == pytest.approx([0.125, 0.5])
    with pytest.raises(ValueError, match="unknown KL"):
        algos.kl_penalty(logp, ref, "nope", use_verl=False)  # type: ignore[arg-type]


def test_agg_modes() -> None:
    loss = torch.tensor([[1.0, 2.0, 3.0], [4.0, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 1], [1, 0, 0]], dtype=torch.float32)
    assert algos.agg_loss(loss, mask, "token-mean", use_verl=False).item() == pytest.approx(2.5)
    assert algos.agg_loss(loss, mask, "token-sum", use_verl=False).item() == pytest.approx(10.0)
    assert algos.agg_loss(loss, mask, "seq-mean-token-sum", use_verl=False).item() == pytest.approx(5.0)
    assert algos.agg_loss(loss, mask, "seq-mean-token-mean", use_verl=False).item() == pytest.approx(3.0)


# -- a real model ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_dir() -> Path:
    from openforge.tinymodel import ensure_tiny_model

    return ensure_tiny_model()


def _options(**kw: object) -> PolicyOptions:
    base: dict[str, object] = {"learning_rate": 1e-2, "use_verl": False, "micro_batch_size": 2}
    base.update(kw)
    return PolicyOptions.model_validate(base)


def _recorded(policy: PolicyOptimizer, prompt: list[int], response: list[int], mask: list[int],
              reward: float, rollout: str, task: str = "t") -> Sample:
    """A sample whose recorded logprobs are the policy's own (an on-policy rollout)."""
    s = Sample(sample_id=rollout + "/0", session_id=rollout, rollout_id=rollout, task_id=task,
               prompt_ids=prompt, response_ids=response, response_mask=mask,
               response_logprobs=[0.0] * len(response), reward=reward)
    with torch.no_grad():
        logp, _ = response_logprobs(policy.model, s)
    s.response_logprobs = [float(x) if m else 0.0 for x, m in zip(logp, mask, strict=True)]
    return s


def test_response_logprobs_match_a_full_forward(tiny_dir: Path) -> None:
    policy = PolicyOptimizer(tiny_dir, _options())
    s = Sample(sample_id="x", session_id="x", prompt_ids=[14990, 1879, 11],
               response_ids=[576, 374, 264, 1273], response_mask=[1, 0, 1, 1],
               response_logprobs=[0.0] * 4)
    with torch.no_grad():
        logp, ent = response_logprobs(policy.model, s, temperature=0.7, with_entropy=True)
        full = policy.model(input_ids=torch.tensor([s.prompt_ids + s.response_ids])).logits[0]
        ref = torch.log_softmax(full.float() / 0.7, -1)
    for t, tok in enumerate(s.response_ids):
        want = ref[len(s.prompt_ids) - 1 + t, tok].item() if s.response_mask[t] else 0.0
        assert logp[t].item() == pytest.approx(want, abs=1e-4)
    assert ent is not None and ent.shape == (3,) and bool((ent > 0).all())


def test_grpo_step_moves_probability_toward_the_rewarded_response(tiny_dir: Path) -> None:
    policy = PolicyOptimizer(tiny_dir, _options(learning_rate=3e-3))
    prompt = [14990, 1879, 11, 220]
    good, bad = [576, 374, 151645], [1273, 264, 151645]
    samples = [_recorded(policy, prompt, good, [1, 1, 1], 1.0, "r1"),
               _recorded(policy, prompt, bad, [1, 1, 1], 0.0, "r2"),
               _recorded(policy, prompt, good, [1, 1, 1], 1.0, "r3"),
               _recorded(policy, prompt, bad, [1, 1, 1], 0.0, "r4")]
    before_good = sum(samples[0].response_logprobs)
    before_bad = sum(samples[1].response_logprobs)
    for _ in range(3):
        metrics = policy.grpo_step(samples)
    after_good = sum(_recorded(policy, prompt, good, [1, 1, 1], 1.0, "x").response_logprobs)
    after_bad = sum(_recorded(policy, prompt, bad, [1, 1, 1], 0.0, "y").response_logprobs)
    assert after_good > before_good and after_bad < before_bad
    assert metrics["groups_with_signal"] == 1.0 and metrics["tokens"] == 12.0
    assert metrics["entropy"] > 0 and metrics["grad_norm"] > 0


def test_ppo_epochs_and_mini_batches_take_several_clipped_updates_per_step(tiny_dir: Path) -> None:
    """2 epochs x 2 mini-batches: four optimizer updates in one training step; after the
    first, the policy differs from the recorded one (ppo_kl, clipping) and it has moved
    further toward the rewarded response than one update moves it."""
    prompt = [14990, 1879, 11, 220]
    good, bad = [576, 374, 151645], [1273, 264, 151645]

    def gain(**options: object) -> tuple[float, dict[str, float]]:
        policy = PolicyOptimizer(tiny_dir, _options(learning_rate=3e-4, **options))
        samples = [_recorded(policy, prompt, response, [1, 1, 1], reward, f"r{i}")
                   for i, (response, reward) in enumerate(((good, 1.0), (bad, 0.0)) * 2)]
        before = sum(samples[0].response_logprobs)
        metrics = policy.grpo_step(samples)
        assert policy.step == 1
        after = sum(_recorded(policy, prompt, good, [1, 1, 1], 1.0, "x").response_logprobs)
        return after - before, metrics

    one, one_metrics = gain()
    four, four_metrics = gain(ppo_epochs=2, ppo_mini_batches=2)
    assert one_metrics["updates"] == 1.0 and four_metrics["updates"] == 4.0
    assert one_metrics["ppo_kl"] == pytest.approx(0.0, abs=1e-6)
    assert abs(four_metrics["ppo_kl"]) > 1e-6
    assert four > one > 0


def test_frozen_embeddings_stay_put_while_the_layers_learn(tiny_dir: Path) -> None:
    """`train_embeddings: false` leaves the (tied) embedding matrix exactly as it was."""
    policy = PolicyOptimizer(tiny_dir, _options(train_embeddings=False))
    embedding = policy.model.get_input_embeddings().weight
    before = {k: v.clone() for k, v in policy.model.state_dict().items()}
    prompt = [14990, 1879]
    samples = [_recorded(policy, prompt, [576, 374], [1, 1], 1.0, "r0"),
               _recorded(policy, prompt, [1273, 264], [1, 1], 0.0, "r1")]
    assert policy.grpo_step(samples)["grad_norm"] > 0
    after = policy.model.state_dict()
    frozen = [k for k in after if after[k].data_ptr() == embedding.data_ptr()]
    assert frozen and all(torch.equal(before[k], after[k]) for k in frozen)
    assert any(not torch.equal(before[k], after[k]) for k in after if k not in frozen)


def test_masked_tokens_get_no_gradient(tiny_dir: Path) -> None:
    """Observation tokens (mask 0) must not be trained on: an all-observation batch is a no-op."""
    policy = PolicyOptimizer(tiny_dir, _options())
    before = {k: v.clone() for k, v in policy.model.state_dict().items()}
    s = Sample(sample_id="o", session_id="o", rollout_id="o", task_id="t", prompt_ids=[1, 2],
               response_ids=[3, 4], response_mask=[0, 0], response_logprobs=[0.0, 0.0], reward=1.0)
    metrics = policy.sft_step([s])
    assert metrics["tokens"] == 0.0
    after = policy.model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)


def test_kl_to_reference_is_reported_and_grows(tiny_dir: Path) -> None:
    policy = PolicyOptimizer(tiny_dir, _options(kl_coef=0.1, learning_rate=5e-3))
    prompt = [14990, 1879]
    samples = [_recorded(policy, prompt, [576, 374], [1, 1], r, f"r{i}")
               for i, r in enumerate((1.0, 0.0))]
    samples[1].response_ids = [1273, 264]
    first = policy.grpo_step(samples)
    second = policy.grpo_step(samples)
    assert first["kl_ref"] == pytest.approx(0.0, abs=1e-6)  # step 1 starts at the reference
    assert second["kl_ref"] > 0


def test_sft_lowers_the_nll_and_checkpoints_resume(tiny_dir: Path, tmp_path: Path) -> None:
    policy = PolicyOptimizer(tiny_dir, _options(learning_rate=1e-2))
    demo = Sample(sample_id="d", session_id="d", prompt_ids=[14990, 1879, 11],
                  response_ids=[576, 374, 99, 264, 151645], response_mask=[1, 1, 0, 1, 1],
                  response_logprobs=[0.0] * 5)
    losses = [policy.sft_step([demo])["sft_loss"] for _ in range(5)]
    assert losses[-1] < losses[0] * 0.8
    path = policy.save(tmp_path / "step-5")
    assert (path / "tokenizer.json").exists() and (path / "config.json").exists()
    resumed = PolicyOptimizer(path, _options(learning_rate=1e-2))
    resumed.load_trainer_state(path)
    assert resumed.step == 5
    for key, value in policy.model.state_dict().items():
        assert torch.equal(value, resumed.model.state_dict()[key])
    # The optimizer's moments came back too: the next step is identical.
    a, b = policy.sft_step([demo]), resumed.sft_step([demo])
    assert a["sft_loss"] == pytest.approx(b["sft_loss"], abs=1e-6)


def test_make_batch_pads_and_keeps_rewards() -> None:
    batch = make_batch([_sample("a", "a", "t", 1.0, n=2), _sample("b", "b", "t", 0.0, n=4)])
    assert batch.mask.tolist() == [[1, 1, 0, 0], [1, 1, 1, 1]]
    assert batch.rewards.tolist() == [1.0, 0.0] and batch.num_tokens == 6


def test_svg_plot_without_matplotlib(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import builtins

    real_import = builtins.__import__

    def no_matplotlib(name: str, *args: object, **kwargs: object) -> object:
        if name.startswith("matplotlib"):
            raise ImportError(name)
        return real_import(name, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(builtins, "__import__", no_matplotlib)
    out = write_curve(tmp_path / "curve", {"reward": [(0, 0.1), (1, 0.5), (2, 0.8)]}, "r")
    assert out.suffix == ".svg"
    text = out.read_text()
    assert text.startswith("<svg") and text.count("<circle") == 3


def test_metrics_log_skips_a_torn_line(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    path.write_text(json.dumps({"step": 1, "reward_mean": 0.5}) + "\n{\"step\": 2, \"rew")
    assert read_metrics(path) == [{"step": 1, "reward_mean": 0.5}]


# -- the trainer plugin, online and from the CLI ---------------------------------------------------


def test_online_grpo_updates_the_engine_stamps_versions_and_resumes(
        tmp_path: Path, tiny_dir: Path) -> None:
    from openforge import plugins
    from openforge.config import TrainConfig
    from openforge.store import Store

    out = tmp_path / "train"
    config = TrainConfig.model_validate({
        "steps": 1, "learning_rate": 1e-3,
        "run": {"environment": "demo", "tasks": [], "k": 2, "concurrency": 2,
                "harness_options": {"max_steps": 1, "max_tokens": 12},
                "sampling": {"max_tokens": 12}},
        "options": {"output_dir": str(out), "tasks_per_step": 1, "use_verl": False,
                    "tensorboard": False}})
    trainer = plugins.create("trainer", "local")
    trainer.train(config)
    records = read_metrics(out / "metrics.jsonl")
    assert [r["step"] for r in records] == [1]
    assert records[0]["rollouts"] == 2 and records[0]["weight_version"] == "1"
    assert records[0]["tokens"] > 0 and records[0]["entropy"] > 0
    assert (out / "checkpoints" / "step-1" / "model.safetensors").exists()
    assert list(out.glob("reward_curve.*"))
    # Resume: the second run continues at step 1 and its rollouts were served by version 1.
    trainer.train(config.model_copy(update={"steps": 2}))
    records = read_metrics(out / "metrics.jsonl")
    assert [r["step"] for r in records] == [1, 2]
    with Store(out / "rollouts" / "store.sqlite") as store:
        versions = {c.weight_version for c in store.iter_calls(run_id="train-step1")}
        first = {c.weight_version for c in store.iter_calls(run_id="train-step0")}
    assert versions == {"1"} and first == {"0"}


def test_cli_errors_are_one_line(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from openforge.cli import cli

    runner = CliRunner()
    result = runner.invoke(cli, ["train", "--recipe", "nope"])
    assert result.exit_code != 0 and "unknown recipe 'nope'" in result.output
    result = runner.invoke(cli, ["train", "--set", "algorithm=sft",
                                 "--set", f"options.output_dir={tmp_path}"])
    assert result.exit_code != 0 and "sft needs demonstrations" in result.output
    result = runner.invoke(cli, ["train", "--set", "options.bogus=1"])
    assert result.exit_code != 0 and "trainer 'local' option bogus: not a known option" in result.output
    assert "Traceback" not in result.output


def test_verl_backend_dry_run_writes_its_files_without_verl(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from openforge.cli import cli

    out = tmp_path / "verl"
    result = CliRunner().invoke(cli, ["train", "--backend", "verl", "--set", "steps=5",
                                      "--set", f"options.output_dir={out}",
                                      "--set", "options.dry_run=true"])
    assert result.exit_code == 0, result.output
    command = (out / "command.sh").read_text()
    assert "verl.trainer.main_ppo" in command and "trainer.total_training_steps=5" in command
    assert (out / "train.parquet").exists() and (out / "agent_loops.yaml").exists()


def test_a_batch_without_signal_leaves_the_weights_alone(tiny_dir: Path) -> None:
    """Equal rewards in every group: no advantage, so no update, even with Adam's momentum."""
    policy = PolicyOptimizer(tiny_dir, _options(learning_rate=1e-2))
    prompt = [14990, 1879]
    mixed = [_recorded(policy, prompt, [576, 374], [1, 1], r, f"r{i}") for i, r in enumerate((1.0, 0.0))]
    policy.grpo_step(mixed)  # a real update: Adam now has momentum
    before = {k: v.clone() for k, v in policy.model.state_dict().items()}
    flat = [_recorded(policy, prompt, [576, 374], [1, 1], 1.0, f"s{i}") for i in range(2)]
    metrics = policy.grpo_step(flat)
    assert metrics["skipped"] == 1.0 and metrics["grad_norm"] == 0.0 and policy.step == 2
    after = policy.model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)


@pytest.mark.parametrize("family", ["clean", "archive", "tally", "empty", "count", "delete"])
def test_demo_family_checker_passes_the_right_command_only(tmp_path, family):
    """Each demo family's checker (and the composed family's, for the families it is made of)
    passes the teacher's right command and fails its plausible mistake and a workspace left as
    is, in every split."""
    import subprocess

    from openforge.training import demo_tasks

    families = [family, "clean"] if family == "tally" else [family]
    env = demo_tasks.FamilyEnvironment(families=families, train_per_family=4,
                                       validation_per_family=2, test_per_family=2)
    tasks = list(env.tasks())
    assert {t.split for t in tasks} >= {"train", "validation"}
    for task in tasks:
        inst = demo_tasks._parse_id(task.id)
        attempts = {"right": inst.arguments, "untouched": None, "wrong": inst.wrong}
        if inst.family == "compose":  # each half alone fails
            left, right = inst.arguments["command"].split(" && ", 1)
            attempts.update(only_clean={"command": left}, only_tally={"command": right})
        for label, arguments in attempts.items():
            if label == "wrong" and arguments is None:
                continue
            ws = tmp_path / f"{task.id}-{label}"
            ws.mkdir()
            env.prepare(task, ws)
            if arguments is not None:
                assert inst.tool == "shell"
                subprocess.run(["/bin/sh", "-c", arguments["command"]], cwd=ws, check=True)
            verdict = env.check(task, ws, env.final_state(task, ws))
            assert verdict.passed is (label == "right"), (task.id, label, verdict.details)


def test_demo_splits_validation_repeats_train_commands_and_test_needs_new_ones():
    """Validation and test prompts name files no train task uses. Validation asks for
    commands the teacher demonstrates; every test task needs a command that no train task
    contains (a held-out family/file-type pair, or two skills composed), built only from
    parts that training shows."""
    from openforge.training import demo_tasks

    env = demo_tasks.FamilyEnvironment(families=["clean", "archive", "tally", "empty"],
                                       train_per_family=10, validation_per_family=3,
                                       test_per_family=3, pool_size=5)
    split = {name: list(env.tasks(name)) for name in demo_tasks.SPLITS}
    assert [len(split[n]) for n in demo_tasks.SPLITS] == [40, 12, 12]
    assert {t.data["family"] for t in split["test"]} == {"archive", "tally", "empty", "compose"}

    def name_of(task):
        return task.id.split("-")[1]

    def command_of(task):
        return demo_tasks._parse_id(task.id).arguments["command"]

    train_names = {name_of(t) for t in split["train"]}
    train_commands = {command_of(t) for t in split["train"]}
    for held in ("validation", "test"):
        assert train_names and not train_names & {name_of(t) for t in split[held]}
        assert not {t.prompt for t in split["train"]} & {t.prompt for t in split[held]}
    assert {command_of(t) for t in split["validation"]} <= train_commands
    assert not {command_of(t) for t in split["test"]} & train_commands
    # Each part of a test command occurs in training: a glob's file type in another
    # family's command, an operation with other file types.
    train_text = " ".join(train_commands)
    for task in split["test"]:
        ext = task.id.split("-")[3]
        assert f"*.{ext}" in train_text, task.id
    assert len({t.prompt for t in split["train"]}) == len(split["train"])
    # Every train family's file types are balanced (round-robin), none held out is trained.
    for family, held_out in demo_tasks.HELD_OUT_TYPES.items():
        types = [t.id.split("-")[3] for t in split["train"] if t.data["family"] == family]
        assert held_out not in types and max(map(types.count, set(types))) - min(
            map(types.count, set(types))) <= 1


def test_demo_splits_refuse_an_unknown_split():
    from openforge.training import demo_tasks

    with pytest.raises(ValueError, match="unknown split 'dev'; the demo families have train"):
        demo_tasks.instances("dev")


def test_the_teacher_calls_each_harnesss_own_shell_tool(tmp_path):
    """The demonstrations use the harness's shell tool and its argument name (Codex's
    `exec_command` / `cmd`), with the same commands; a harness the teacher does not know,
    or a non-shell family outside `mini`, is refused with a message."""
    import yaml

    from openforge.training import demo_tasks
    from openforge.training.recipes import DemoRecipe

    env = demo_tasks.FamilyEnvironment(train_per_family=2, families=["clean", "archive"])
    tasks = list(env.tasks("train"))
    mini = yaml.safe_load(demo_tasks.teacher_script(tasks, tmp_path / "m.yaml").read_text())
    codex = yaml.safe_load(demo_tasks.teacher_script(tasks, tmp_path / "c.yaml",
                                                     harness="codex").read_text())
    assert [e["match"] for e in mini] == [e["match"] for e in codex]
    for m, c in zip(mini, codex, strict=True):
        [m_call], [c_call] = m["replies"][0]["tool_calls"], c["replies"][0]["tool_calls"]
        assert m_call["name"] == "shell" and c_call["name"] == "exec_command"
        assert c_call["arguments"] == {"cmd": m_call["arguments"]["command"]}
    with pytest.raises(ValueError, match="knows the shell tool of mini, codex"):
        demo_tasks.teacher_script(tasks, tmp_path / "x.yaml", harness="opencode")
    writes = list(demo_tasks.FamilyEnvironment(train_per_family=1, families=["write"]).tasks())
    with pytest.raises(ValueError, match="needs mini's write_file tool"):
        demo_tasks.teacher_script(writes, tmp_path / "w.yaml", harness="codex")
    with pytest.raises(ValueError, match="harness 'opencode'"):
        DemoRecipe(harness="opencode")


def test_noisy_teacher_demonstrates_the_mistake_on_its_share_of_each_family(tmp_path):
    """`teacher_accuracy` 0.5: per family, half the train tasks get the right command and half
    the plausible mistake, in the scripted engine's script."""
    import yaml

    from openforge.training import demo_tasks

    env = demo_tasks.FamilyEnvironment(families=["clean", "tally"], train_per_family=6)
    tasks = list(env.tasks("train"))
    script = yaml.safe_load(demo_tasks.teacher_script(tasks, tmp_path / "t.yaml", 0.5).read_text())
    assert len(script) == 12
    by_family: dict[str, list[bool]] = {}
    for task, entry in zip(tasks, script, strict=True):
        inst = demo_tasks._parse_id(task.id)
        sent = entry["replies"][0]["tool_calls"][0]["arguments"]
        assert sent in (inst.arguments, inst.wrong)
        by_family.setdefault(inst.family, []).append(sent == inst.arguments)
    assert {family: sum(flags) for family, flags in by_family.items()} == {"clean": 3, "tally": 3}
    perfect = yaml.safe_load(demo_tasks.teacher_script(tasks, tmp_path / "p.yaml").read_text())
    assert all(e["replies"][0]["tool_calls"][0]["arguments"] == demo_tasks._parse_id(t.id).arguments
               for t, e in zip(tasks, perfect, strict=True))


def test_metrics_log_writes_tensorboard_scalars_readable_by_tensorboard(tmp_path):
    """With tensorboard installed, each step's numbers land as scalars TensorBoard reads back."""
    pytest.importorskip("tensorboard", reason="in the test extra: pip install -e '.[test]'")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from openforge.training.metrics_log import MetricsLog, read_metrics

    log = MetricsLog(tmp_path)
    assert log.has_tensorboard
    for step, reward in ((1, 0.25), (2, 0.75)):
        log.log({"phase": "grpo", "step": step, "reward_mean": reward, "kl": float("nan"),
                 "note": "text is not a scalar"})
    log.close()
    assert [m["reward_mean"] for m in read_metrics(tmp_path / "metrics.jsonl")] == [0.25, 0.75]
    events = EventAccumulator(str(tmp_path / "tensorboard"))
    events.Reload()
    scalars = events.Scalars("grpo/reward_mean")
    assert [(s.step, s.value) for s in scalars] == [(1, 0.25), (2, 0.75)]
    assert "grpo/note" not in events.Tags()["scalars"]


def test_grpo_adam_adopts_sft_variances_with_zero_momentum(tiny_dir: Path, tmp_path: Path) -> None:
    """The RL phase's Adam keeps the SFT's second moments (step sizes proportional to the
    gradient), starts with zero momentum and takes its own learning rate."""
    sft = PolicyOptimizer(tiny_dir, _options(learning_rate=1e-2))
    demo = Sample(sample_id="d", session_id="d", prompt_ids=[14990, 1879, 11],
                  response_ids=[576, 374, 151645], response_mask=[1, 1, 1],
                  response_logprobs=[0.0] * 3)
    for _ in range(3):
        sft.sft_step([demo])
    path = sft.save(tmp_path / "sft")
    rl = PolicyOptimizer(path, _options(learning_rate=1e-4))
    rl.adopt_second_moments(path)
    assert rl.step == 0 and rl.optimizer.param_groups[0]["lr"] == 1e-4
    before = {id(p): s for p, s in sft.optimizer.state.items()}
    names = dict(sft.model.named_parameters())
    for name, param in rl.model.named_parameters():
        state = rl.optimizer.state[param]
        if "exp_avg_sq" not in state:
            continue
        saved = before[id(names[name])]
        assert torch.equal(state["exp_avg_sq"], saved["exp_avg_sq"])
        assert not state["exp_avg"].any()


def test_demo_recipe_runs_every_phase_end_to_end(tmp_path: Path) -> None:
    """`openforge train --recipe demo` at toy size: the noisy teacher's demonstrations go
    through the gateway and are exported, SFT clones them, GRPO updates the engine in place,
    and both held-out evaluations, the plot and summary.json are written."""
    from click.testing import CliRunner

    from openforge.cli import cli

    out = tmp_path / "demo"
    result = CliRunner().invoke(cli, [
        "train", "--recipe", "demo", "--set", f"output_dir={out}", "--set", "model=tiny",
        "--set", "families=[clean,tally]", "--set", "train_per_family=2",
        "--set", "validation_per_family=1", "--set", "test_per_family=1",
        "--set", "teacher_accuracy=0.5", "--set", "sft_epochs=1", "--set", "grpo_steps=1",
        "--set", "tasks_per_step=2", "--set", "k=2", "--set", "eval_k=1",
        "--set", "max_tokens=48"])
    assert result.exit_code == 0, result.output
    output = " ".join(result.output.split())
    assert "4 demonstrations, pass rate 0.50" in output
    assert "4 train, 2 validation, 2 test tasks" in output
    summary = json.loads((out / "summary.json").read_text())
    assert summary["grpo_steps"] == 1 and set(summary["timings_s"]) == {"teacher", "sft", "grpo"}
    assert summary["test_tasks"] == 2 and set(summary["test_by_family"]) == {"tally", "compose"}
    for split in ("validation", "test"):
        assert f"{split} mean reward: SFT {summary[f'{split}_reward_sft']:.3f}" in output
        assert 0.0 <= summary[f"{split}_gain_se"] <= 1.0
    assert (out / "demos-samples" / "data.parquet").exists()
    assert list(out.glob("reward_curve.*"))
    grpo = [m for m in read_metrics(out / "grpo" / "metrics.jsonl") if m.get("phase") == "grpo"]
    assert len(grpo) == 1 and str(grpo[0]["weight_version"]) == "1"


def test_paired_gain_averages_each_tasks_attempts_and_gives_the_standard_error() -> None:
    """The gain is the mean of per-task changes (a task's attempts averaged first); its
    standard error is their sample standard deviation over sqrt(tasks). Hand-computed."""
    from openforge.runner import AttemptRecord
    from openforge.training.recipes import paired_gain
    from openforge.training.rollouts import StepRollouts

    def step(rewards: dict[str, list[float]]) -> StepRollouts:
        return StepRollouts(records=[
            AttemptRecord(task_id=task, attempt=i, rollout_id=f"{task}{i}", session_id="s",
                          status="ok", reward=reward)
            for task, values in rewards.items() for i, reward in enumerate(values)])

    before = step({"a": [0.0, 0.0], "b": [1.0, 0.0], "c": [0.0, 0.0]})
    # An infrastructure failure is not scored: task c's mean after is its one scored attempt.
    after = step({"a": [1.0, 1.0], "b": [1.0, 1.0], "c": [0.0]})
    after.records.append(AttemptRecord(task_id="c", attempt=1, rollout_id="c1", session_id="s",
                                       status="infra_error"))
    gain, se = paired_gain(before, after)
    diffs = [1.0, 0.5, 0.0]
    mean = sum(diffs) / 3
    sd = (sum((d - mean) ** 2 for d in diffs) / 2) ** 0.5
    assert gain == pytest.approx(0.5) and se == pytest.approx(sd / 3 ** 0.5)
    assert paired_gain(step({}), after) == (0.0, 0.0)


def test_the_learning_gate_fails_below_its_threshold(tmp_path: Path, capsys) -> None:
    """`bench_train_demo.py --min-validation-gain G` (and `--min-test-gain G`) exits 1
    (REGRESSION) when that split's gain is below G and 0 when it is not; a gain cannot
    exceed 1, so 1.01 always fails and -1.01 never does. With `eval_splits=[validation]`
    the test split is not evaluated at all."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "bench_train_demo", Path(__file__).parent.parent / "benchmarks" / "bench_train_demo.py")
    assert spec and spec.loader
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    toy = ["model=tiny", "families=[clean,tally]", "train_per_family=2",
           "validation_per_family=1", "test_per_family=1", "sft_epochs=1", "grpo_steps=1",
           "tasks_per_step=2", "k=2", "eval_k=1"]
    argv = ["--output-dir", str(tmp_path / "gate"), *(a for kv in toy for a in ("--set", kv))]
    assert bench.main([*argv, "--min-validation-gain", "1.01"]) == 1
    out = capsys.readouterr().out
    assert "REGRESSION: validation gain" in out and "test gain" not in out
    resumed = [*argv, "--set", "fresh=false"]
    assert bench.main([*resumed, "--min-validation-gain", "-1.01", "--min-test-gain", "1.01"]) == 1
    out = capsys.readouterr().out
    assert "ok: validation gain" in out and "REGRESSION: test gain" in out
    assert bench.main([*resumed, "--min-validation-gain", "-1.01", "--min-test-gain", "-1.01"]) == 0
    out = capsys.readouterr().out
    assert "ok: validation gain" in out and "ok: test gain" in out
    # `nox -s learn` evaluates only the split it gates; gating one left out is refused
    # before anything runs.
    only = [*resumed, "--set", "eval_splits=[validation]"]
    assert bench.main([*only, "--min-test-gain", "0"]) == 2
    assert "the test split is not in eval_splits ['validation']" in capsys.readouterr().err
    assert bench.main([*only, "--min-validation-gain", "-1.01"]) == 0
    out = capsys.readouterr().out
    assert "[eval final] validation" in out and "ok: validation gain" in out
    assert not [line for line in out.splitlines()
                if "] test mean reward" in line or line.startswith(("test mean", '  "test_'))]


def test_evaluations_draw_common_random_numbers_so_unchanged_weights_gain_exactly_zero(
        tmp_path: Path) -> None:
    """The recipe's two evaluations sample attempt j of a task with the same seed: with a
    learning rate of 0 (weights unchanged) every evaluated attempt's completions are the
    same at both checkpoints, so the gains are exactly 0, while two attempts of one task
    still draw differently (the sampling is random, only repeated)."""
    from openforge.store import Store
    from openforge.training.recipes import run_recipe

    out = tmp_path / "lr0"
    summary = run_recipe("demo", None, [
        f"output_dir={out}", "model=tiny", "families=[clean,tally]", "train_per_family=2",
        "validation_per_family=1", "test_per_family=1", "sft_epochs=1", "grpo_steps=1",
        "tasks_per_step=2", "k=2", "eval_k=2", "grpo_learning_rate=0.0", "max_tokens=24"])
    with Store(out / "rollouts" / "store.sqlite") as store:
        def completions(run_id: str) -> dict[tuple[str, int], list[list[int]]]:
            return {(s.task_id, int(s.metadata["attempt"])):
                    [c.completion_ids for c in store.list_calls(s.id)]
                    for s in store.list_sessions(run_id)}

        for split in ("validation", "test"):
            before, after = completions(f"{split}-sft"), completions(f"{split}-final")
            assert len(before) == 2 * summary[f"{split}_tasks"] and before == after
            assert summary[f"{split}_gain"] == 0.0
            for task in {t for t, _ in before}:
                assert before[(task, 0)] != before[(task, 1)]
