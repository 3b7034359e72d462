#!/usr/bin/env python3
"""The GRPO task of a miles job file, run by Hugging Face TRL's GRPOTrainer on the CPU: a baseline for
seconds per step and held-out accuracy, side by side with `miles run` on the same file.

    bash scripts/setup.sh --trl     # the venv /root/.venvs/trl (MILES_TRL_VENV): torch, transformers, TRL
    /root/.venvs/trl/bin/python scripts/trl_grpo.py configs/smollm2_arithmetic.yaml --steps 20

Options: --steps (default rollout.num_rollouts), --eval-every (default eval.every, else 10), --eval-max-prompts
(default eval.max_prompts; 0 = all), --eval-data (default eval.data, else DATA_eval.jsonl beside data.path when
it exists), --threads (default 2: miles runs one engine thread and one trainer thread on this 2-core
machine), --out (default runs/trl_grpo/metrics.jsonl), --seed (TRL's seed: the torch sampling RNG; default
rollout.seed), --eval-batch-size (32), --dry-run (print the mapping and the differences, then stop). After
the job file, `section.key=value` arguments override it as on `miles run`'s command line (e.g.
rollout.rollout_batch_size=2 trainer.global_batch_size=16 for a quick try).

What it does
  * Reads the job file (PyYAML; every key of configs/reference.yaml is known here, with its default), maps it
    onto a GRPOConfig (below) and prints the mapping, the named differences from miles, and any key it does
    not understand. The same goes to OUT_DIR/trl_config.json with the versions of torch, transformers, TRL.
  * Prompts: data.path in miles' own order (controller/prompt_data.cc: a Fisher-Yates shuffle per epoch driven by
    std::mt19937_64 seeded with data.seed + epoch, reimplemented here bit for bit), rollout_batch_size prompts per
    step; TRL's own shuffle is off (shuffle_dataset=False) so that it walks this order. With data
    .apply_chat_template the prompt is one user message and TRL applies the model's chat template with the
    generation prompt (miles: the same, rendered by its own Jinja engine).
  * Rewards: the job's `rewards:` list, as TRL reward functions with reward_weights = the weights (TRL sums
    weight x score before normalising, as miles does). The built-in verifiers are ported from
    controller/reward_verifiers.cc and controller/reward_text.cc (numeric, exact_match, keyword, length; regex
    with Python's `re`, not ECMAScript). The numeric verifier's "last number" (reward_text.cc last_number):
    scanned over the response's UTF-8 bytes; a number starts at an ASCII digit, or at a '.' followed by a digit
    and not preceded by one (".5"); a '-' right before it makes it negative unless the character before the '-'
    is an ASCII letter or digit ("5-3" holds 5 and 3, " -3" holds -3); after 1-3 leading digits, ",ddd" groups
    not followed by another digit are thousands separators ("1,234" is 1234; "1,2345" is 1 then 2345); then an
    optional '.' and digits (a '.' with no digit after it ends the number: "12." is 12); exponents, '+' signs
    and non-ASCII digits are not part of a number; a number beyond double's range is skipped (std::from_chars
    reports it out of range). The score is 1 when |last number - label| <= tolerance, else 0; no number (or
    answer_prefix set and absent) scores 0. The label (reward_text.cc number_label): a JSON number, or a string
    that, trimmed, with its commas removed and one leading '+' dropped, is a plain decimal; anything else is a
    reward error (the part scores 0, and the sample cannot pass). The response text is the decoded completion
    WITH its special tokens (miles' Tokenizer::decode keeps them, e.g. the closing <|im_end|>), and its length
    in tokens counts the EOS token (the engine returns it), which is what the `length` verifier sees.
  * Times every optimizer step (a TrainerCallback's on_step_begin .. on_step_end: generation, scoring, the
    forward/backward passes, the optimizer) and, inside it, TRL's generation: GRPOTrainer._generate_single_turn
    (the model.generate call on the left-padded batch, no vLLM) -> generate_s; the rest -> train_s.
    _generate_and_score_completions (generation + decoding + rewards + advantages) is timed too (gen_score_s).
  * Held-out evaluation, like miles' Evaluator (controller/evaluator.cc): the eval prompts in file order (the
    first eval.max_prompts), eval.n_samples samples each at eval.temperature (0: greedy), top_p 1, top_k 0,
    max_new_tokens = eval.max_new_tokens or rollout.max_new_tokens, scored by the job's rewards; pass@1 = the
    fraction of samples whose reward is >= eval.pass_threshold (and has no error). Before step 1, every
    --eval-every steps and after the last, batched (--eval-batch-size) with left padding, on the policy being
    trained. Its time is not part of any step's seconds.
  * Writes JSON lines to --out: per step {step, seconds, generate_s, train_s, reward_mean, accuracy (the train
    batch's fraction of samples that pass, as pass@1 does), wall_s, ...} and per evaluation {step,
    eval_pass_at_1, eval_reward_mean, eval_response_length_mean, eval_s, ...}; prints a summary at the end.

The GRPOConfig mapping (TRL 1.16.0, trl/trainer/grpo_config.py and grpo_trainer.py)
  model.path                      the policy, loaded in float32 (bf16=False, fp16=False, use_cpu=True)
  rollout.n_samples_per_prompt    num_generations
  rollout_batch_size x n_samples  generation_batch_size; per_device_train_batch_size = trainer.micro_batch_size,
                                  gradient_accumulation_steps = trainer.global_batch_size / micro_batch_size, so
                                  one optimizer step consumes global_batch_size samples; steps_per_generation =
                                  num_steps_per_rollout x gradient_accumulation_steps (one generation per rollout
                                  step); max_steps = steps x num_steps_per_rollout
  rollout.max_new_tokens          max_completion_length
  rollout.temperature/top_p/top_k temperature / top_p / top_k
  trainer.lr, min_lr, warmup_steps, decay
                                  learning_rate, and a LambdaLR that is miles' LrSchedule::at (trainer/
                                  lr_schedule.cc: warmup lr*(step+1)/warmup, then constant or cosine to min_lr over
                                  num_rollouts x num_steps_per_rollout steps), passed as the trainer's scheduler
  trainer.beta1/beta2/eps/weight_decay
                                  torch.optim.AdamW(betas, eps), weight decay on the tensors of 2+ dimensions only
                                  (trainer/adamw.cc), passed as the trainer's optimizer (also adam_beta1/adam_beta2/
                                  adam_epsilon/weight_decay in the config, for the record)
  trainer.clip_grad_norm          max_grad_norm (0: off, in both)
  algorithm.kl_coef               beta when kl_estimator is k3 (TRL's per-token KL is the k3 estimator), with
                                  use_bias_correction_kl=False (miles does not weight the KL by the ratio);
                                  kl_estimator none: beta 0, and TRL then loads no reference model at all
  algorithm.eps_clip/eps_clip_high
                                  epsilon / epsilon_high
  algorithm.dual_clip_c           delta (TRL's two-sided clip caps the ratio at delta: for A < 0 the loss is at most
                                  -delta*A with no gradient, the dual clip; for A > 0 the upper clip binds first)
  algorithm.policy_loss           importance_sampling_level: ppo -> "token", gspo -> "sequence"
  algorithm.std_normalize         scale_rewards "group" (true) / "none" (false); advantage dr_grpo: "none"
  algorithm.loss_reduction        loss_type: token_mean -> "dapo" (sum of the masked per-token losses over the whole
                                  optimizer step / its number of completion tokens: in _compute_loss,
                                  `normalizer = inputs["num_items_in_batch"] ... * current_gradient_accumulation_
                                  steps / steps_per_generation; loss = (per_token_loss * mask).sum() / normalizer`,
                                  num_items_in_batch = the generation batch's loss_mask.sum()); sample_mean ->
                                  "grpo" (per-sequence mean, mean over the micro-batch, / accumulation steps: the
                                  mean over the step's samples); constant -> "dr_grpo" when constant_normaliser =
                                  global_batch_size x max_new_tokens (TRL's fixed divisor), else a difference
  algorithm.entropy_coef          entropy_coef
  num_iterations                  1 (every sample trained on once, the miles invariant)
  others                          gradient_checkpointing=False (TRL defaults it on; it only trades time for memory),
                                  disable_dropout=True (SmolLM2 has none anyway), shuffle_dataset=False (the order
                                  above), mask_truncated_completions=False, save_strategy "no", report_to "none"

Known differences from miles' algorithm (each printed at start when the job file makes it matter)
  * On-policy by construction: TRL generates with the weights being trained and (num_iterations 1,
    steps_per_generation = gradient_accumulation_steps) uses old_logp = logp.detach(), so every ratio is exactly
    1 and the clip never binds. miles with async.mode one_step_off (this recipe) trains step k on samples drawn by
    the policy of step k-1, with old_logp = the engine's logprobs (algorithm.old_logp rollout): ratios differ
    from 1 and the clip can bind. async.mode async, max_weight_staleness, stale_policy,
    update_weights_interval have no TRL equivalent either; TRL's timing is sequential (generate, then train), so
    its seconds per step are generate + train where miles overlaps them.
  * Dynamic sampling: rollout.filter_zero_variance with over_sampling_batch_size (ask for more prompts, keep the
    first rollout_batch_size groups whose rewards are not all equal) has no equivalent: TRL trains every group,
    including those with zero advantage (which add tokens to the token-mean denominator but no gradient). As
    miles launches over_sampling_batch_size prompts a step, the prompt order matches miles' for step 1 at most.
  * Advantages: TRL divides by (std + 1e-4), miles by (std + 1e-6) (both the unbiased n-1 group std); the same
    up to ~1e-4 relative with 0/1 rewards. reinforce_pp / reinforce_pp_baseline (token-level whitening over the
    batch) have no TRL equivalent.
  * Sampling: each side has its own RNG (miles: per (seed, step, prompt, sample) streams; TRL: torch's global
    generator seeded with --seed), so the samples differ. TRL computes logprobs at the sampling temperature
    (logits / T); miles' old_logp and trainer logp are untempered (identical at temperature 1).
  * Precision: both generate and train in float32 on the CPU (miles' own kernels; here PyTorch's, SDPA attention,
    the HF KV cache). TRL pads prompts (left) and completions (right) within a batch; miles packs.
  * rollout.stop strings, rollout.environment / max_turns / function (multi-turn, custom rollouts), the http /
    command / python / rollout reward kinds, algorithm.correction (TIS/MIS: there are no rollout logprobs here),
    kl_estimator k1/k2, model.reference (TRL's reference is the initial policy), a temperature-0 training rollout:
    no equivalent; the script stops on those it cannot run at all and names the rest.
  * Entropy bonus (entropy_coef != 0): TRL adds the mean entropy of each micro-batch / accumulation steps, miles
    the token mean over the step. With num_steps_per_rollout > 1, TRL's "dapo" divisor is the generation batch's
    token count / num_steps_per_rollout, miles' the optimizer step's own count.
  * Timing needs an otherwise idle machine: with other processes busy on the 2 cores, 2 PyTorch (OpenMP)
    threads ran a forward 8x and a decode step 13x slower than 1 thread did (threads wait on a descheduled
    peer); the script warns when the load average is above 0.5 at start and records it in trl_config.json.
  * Weight sync, engines, checkpoints, logging, the controller and the `check` gate are miles' infrastructure:
    nothing to map (listed as "not applicable" when the job file sets them).
"""

import argparse
import copy
import json
import math
import os
import re
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

# ---------------------------------------------------------------------------------------------------------------
# The job file: defaults (configs/reference.yaml), overrides, ${VAR} expansion.

# Every key of configs/reference.yaml with its default (cross-checked against that file when it is found).
DEFAULTS = {
    "model": {"path": "", "tokenizer": "", "reference": ""},
    "rollout": {
        "num_rollouts": 10, "rollout_batch_size": 8, "n_samples_per_prompt": 8, "over_sampling_batch_size": 0,
        "filter_zero_variance": False, "max_new_tokens": 64, "temperature": 1.0, "top_p": 1.0, "top_k": 0,
        "stop": [], "seed": 1, "environment": "none", "max_turns": 4, "function": "", "python_path": "",
        "num_engines": 1, "engines": [], "engine_threads": 1, "engine_tp": 1, "engine_device": "cpu",
        "engine_num_blocks": 4096, "engine_max_batch_tokens": 2048, "engine_max_running": 256,
        "speculative": False, "speculative_max_draft_tokens": 4, "speculative_adaptive": True,
        "speculative_draft_head": False, "speculative_draft_lr": 0.0001, "speculative_draft_vocab": 4096,
        "health_check_interval_s": 1.0, "engine_start_timeout_s": 60, "max_engine_restarts": 3,
    },
    "trainer": {
        "global_batch_size": 64, "num_steps_per_rollout": 1, "micro_batch_size": 1, "lr": 1.0e-6, "min_lr": 0,
        "warmup_steps": 0, "decay": "constant", "weight_decay": 0, "beta1": 0.9, "beta2": 0.95, "eps": 1.0e-8,
        "clip_grad_norm": 1.0, "threads": 1, "device": "cpu",
    },
    "parallel": {"dp": 1, "pp": 1, "tp": 1, "comm": "shm", "remote_ranks": 0, "host": "", "timeout_s": 600.0},
    "algorithm": {
        "advantage": "grpo", "std_normalize": True, "policy_loss": "ppo", "eps_clip": 0.2, "eps_clip_high": 0.2,
        "dual_clip_c": 0, "kl_estimator": "none", "kl_coef": 0, "entropy_coef": 0, "loss_reduction": "token_mean",
        "constant_normaliser": 0, "correction": "none", "tis_c": 2.0, "mis_low": 0.5, "mis_high": 2.0,
        "old_logp": "rollout",
    },
    "data": {"path": "", "prompt_key": "prompt", "label_key": "label", "apply_chat_template": False,
             "shuffle": True, "seed": 1},
    "eval": {"data": "", "every": 0, "n_samples": 1, "temperature": 0.0, "max_prompts": 0, "max_new_tokens": 0,
             "pass_threshold": 1.0},
    "weight_sync": {"transport": "disk_delta", "dir": "", "full_every": 10, "encoding": "xor",
                    "check_checksums": True, "group_timeout_s": 60, "comm": "auto"},
    "async": {"mode": "sync", "max_weight_staleness": 1, "stale_policy": "drop", "update_weights_interval": 1,
              "buffer_groups": 0, "pause_mode": "retract"},
    "checkpoint": {"dir": "", "save_every": 0, "save_final": False, "resume": False},
    "logging": {"run_dir": "runs/default", "progress": "auto", "tensorboard": True, "samples_every": 1,
                "samples_keep": 50, "report_every": 1},
    "controller": {"host": "127.0.0.1", "port": 0},
    "check": {"max_logp_abs_diff": 0, "max_rollout_kl": 0, "min_ess": 1.0, "min_r3_agreement": 1.0,
              "max_ppo_kl": 0, "max_clipfrac": 0, "layouts": [], "grad_norm_rel_tol": 0,
              "grad_norm_rel_tol_tp": 1e-6, "report": ""},
}
REWARD_DEFAULTS = {
    "kind": "exact_match", "name": "", "weight": 1.0, "answer_prefix": "", "tolerance": 1.0e-6, "pattern": "",
    "keywords": [], "case_sensitive": False, "max_tokens": 0, "require_finish": False, "url": "", "command": "",
    "function": "", "python_path": "", "timeout_s": 30,
}

# How each key is treated. "map": onto TRL (or this script's own evaluation / data order); "infra": miles'
# machinery with nothing to map; anything else present in the job file is "not understood".
MAPPED = {
    "model": {"path", "tokenizer", "reference"},
    "rollout": {"num_rollouts", "rollout_batch_size", "n_samples_per_prompt", "over_sampling_batch_size",
                "filter_zero_variance", "max_new_tokens", "temperature", "top_p", "top_k", "stop", "seed",
                "environment", "max_turns", "function", "python_path"},
    "trainer": {"global_batch_size", "num_steps_per_rollout", "micro_batch_size", "lr", "min_lr", "warmup_steps",
                "decay", "weight_decay", "beta1", "beta2", "eps", "clip_grad_norm"},
    "algorithm": set(DEFAULTS["algorithm"]),
    "data": set(DEFAULTS["data"]),
    "eval": set(DEFAULTS["eval"]),
    "async": set(DEFAULTS["async"]),
}
INFRA = {
    "rollout": {"num_engines", "engines", "engine_threads", "engine_tp", "engine_device", "engine_num_blocks",
                "engine_max_batch_tokens", "engine_max_running", "speculative", "speculative_max_draft_tokens",
                "speculative_adaptive", "speculative_draft_head", "speculative_draft_lr", "speculative_draft_vocab",
                "health_check_interval_s", "engine_start_timeout_s", "max_engine_restarts"},
    "trainer": {"threads", "device"},
    "parallel": set(DEFAULTS["parallel"]),
    "weight_sync": set(DEFAULTS["weight_sync"]),
    "checkpoint": set(DEFAULTS["checkpoint"]),
    "logging": set(DEFAULTS["logging"]),
    "controller": set(DEFAULTS["controller"]),
    "check": set(DEFAULTS["check"]),
}


def yaml_loader():
    import yaml

    class Loader(yaml.SafeLoader):
        pass

    # YAML 1.2 floats: PyYAML (YAML 1.1) reads 1e-6 or 2E6 as strings; miles' yaml-cpp reads them as numbers.
    Loader.add_implicit_resolver(
        "tag:yaml.org,2002:float",
        re.compile(r"^(?:[-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+]?[0-9]+)?|[-+]?(?:[0-9][0-9_]*)(?:[eE][-+]?[0-9]+)"
                   r"|\.[0-9_]+(?:[eE][-+]?[0-9]+)?|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$"),
        list("-+0123456789."))
    return Loader


def expand_env(value):
    """miles' ${VAR} / ${VAR:-default} expansion of strings ($${ is a literal ${)."""
    if isinstance(value, str):
        def sub(m):
            if m.group(0).startswith("$$"):
                return "${"
            var, default = m.group(1), m.group(3)
            got = os.environ.get(var)
            if got is None or (got == "" and default is not None):
                return default if default is not None else ""
            return got
        return re.sub(r"\$\$\{|\$\{([A-Za-z_][A-Za-z0-9_]*)(:-([^}]*))?\}", sub, value)
    if isinstance(value, list):
        return [expand_env(v) for v in value]
    if isinstance(value, dict):
        return {k: expand_env(v) for k, v in value.items()}
    return value


def load_job(path, overrides):
    import yaml

    loader = yaml_loader()
    with open(path) as f:
        job = yaml.load(f, Loader=loader) or {}
    for o in overrides:
        key, eq, value = o.partition("=")
        if not eq or "." not in key:
            sys.exit(f"trl_grpo.py: override '{o}' is not section.key=value")
        section, name = key.split(".", 1)
        job.setdefault(section, {})
        job[section][name] = yaml.load(value, Loader=loader) if value != "" else ""
    return expand_env(job)


def cross_check_reference(notes):
    """Keys and defaults of configs/reference.yaml that this script does not know (it may be newer)."""
    ref_path = REPO / "configs" / "reference.yaml"
    if not ref_path.exists():
        return
    import yaml

    ref = yaml.load(ref_path.read_text(), Loader=yaml_loader()) or {}
    for section, keys in ref.items():
        if section == "rewards":
            for item in keys or []:
                for k in item:
                    if k not in REWARD_DEFAULTS:
                        notes.append(f"configs/reference.yaml has rewards key '{k}', unknown to this script")
            continue
        if section not in DEFAULTS:
            notes.append(f"configs/reference.yaml has section '{section}', unknown to this script")
            continue
        for k, v in (keys or {}).items():
            if k not in DEFAULTS[section]:
                notes.append(f"configs/reference.yaml has {section}.{k}, unknown to this script")
            elif v != DEFAULTS[section][k] and not (isinstance(v, (int, float)) and isinstance(
                    DEFAULTS[section][k], (int, float)) and float(v) == float(DEFAULTS[section][k])):
                notes.append(f"configs/reference.yaml's default of {section}.{k} is {v!r}, this script's "
                             f"{DEFAULTS[section][k]!r}: using reference.yaml's")
                DEFAULTS[section][k] = v


def effective_config(job, not_understood, not_applicable):
    cfg = copy.deepcopy(DEFAULTS)
    for section, keys in job.items():
        if section == "rewards":
            continue
        if section == "sft":
            sys.exit("trl_grpo.py: an SFT job file (sft: section): this script runs RL (GRPO) jobs only")
        if section not in DEFAULTS:
            not_understood.append(f"section '{section}'")
            continue
        if not isinstance(keys, dict):
            not_understood.append(f"section '{section}' (not a mapping)")
            continue
        for k, v in keys.items():
            if k in MAPPED.get(section, ()):
                cfg[section][k] = v
            elif k in INFRA.get(section, ()):
                cfg[section][k] = v
                not_applicable.append(f"{section}.{k}={v!r}")
            else:
                not_understood.append(f"{section}.{k}")
    rewards = []
    for i, item in enumerate(job.get("rewards") or []):
        r = dict(REWARD_DEFAULTS)
        for k, v in (item or {}).items():
            if k in REWARD_DEFAULTS:
                r[k] = v
            else:
                not_understood.append(f"rewards[{i}].{k}")
        rewards.append(r)
    if not rewards:
        sys.exit("trl_grpo.py: the job file has no rewards")
    # Default name = kind; a name already taken gets _2, _3, ... in spec order (controller/reward_model.cc).
    taken = set()
    for r in rewards:
        base = r["name"] or r["kind"]
        name, k = base, 2
        while name in taken:
            name, k = f"{base}_{k}", k + 1
        r["name"] = name
        taken.add(name)
    cfg["rewards"] = rewards
    return cfg


# ---------------------------------------------------------------------------------------------------------------
# miles' prompt order: PromptData::at (controller/prompt_data.cc), std::mt19937_64 + Fisher-Yates.

class MT19937_64:
    """std::mt19937_64, bit for bit."""
    N, M = 312, 156
    MASK = (1 << 64) - 1

    def __init__(self, seed):
        self.mt = [0] * self.N
        self.mt[0] = seed & self.MASK
        for i in range(1, self.N):
            prev = self.mt[i - 1]
            self.mt[i] = (6364136223846793005 * (prev ^ (prev >> 62)) + i) & self.MASK
        self.index = self.N

    def _twist(self):
        mt, upper, lower = self.mt, 0xFFFFFFFF80000000, 0x7FFFFFFF
        for i in range(self.N):
            x = (mt[i] & upper) | (mt[(i + 1) % self.N] & lower)
            xa = x >> 1
            if x & 1:
                xa ^= 0xB5026F5AA96619E9
            mt[i] = mt[(i + self.M) % self.N] ^ xa
        self.index = 0

    def __call__(self):
        if self.index >= self.N:
            self._twist()
        y = self.mt[self.index]
        self.index += 1
        y ^= (y >> 29) & 0x5555555555555555
        y ^= (y << 17) & 0x71D67FFFEDA60000
        y ^= (y << 37) & 0xFFF7EEE000000000
        y ^= y >> 43
        return y & self.MASK


def miles_order(n, positions, shuffle, seed):
    """Row index of each of the first `positions` prompt positions, as PromptData::at gives them."""
    out, epoch_order = [], {}
    for p in range(positions):
        epoch = p // n
        if not shuffle:
            out.append(p % n)
            continue
        if epoch not in epoch_order:
            order = list(range(n))
            rng = MT19937_64(seed + epoch)
            for i in range(n - 1, 0, -1):
                j = rng() % (i + 1)
                order[i], order[j] = order[j], order[i]
            epoch_order = {epoch: order}
        out.append(epoch_order[epoch][p % n])
    return out


# ---------------------------------------------------------------------------------------------------------------
# Rewards: controller/reward_text.cc and controller/reward_verifiers.cc in Python.

_SPACE = b" \t\n\v\f\r"
_DECIMAL = re.compile(r"-?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)\Z")


def _is_digit(c):
    return 48 <= c <= 57


def _is_alnum(c):
    return _is_digit(c) or 65 <= c <= 90 or 97 <= c <= 122


def parse_decimal(s):
    """reward_text.cc parse_decimal: std::from_chars(fixed) must consume all of s; finite only."""
    if not _DECIMAL.match(s):
        return None
    v = float(s)
    if not math.isfinite(v):
        return None  # from_chars: result_out_of_range
    if v == 0.0 and any(ch in "123456789" for ch in s):
        return None  # underflow: result_out_of_range as well
    return v


def last_number(text):
    """reward_text.cc last_number, over the UTF-8 bytes of `text`."""
    b = text.encode("utf-8") if isinstance(text, str) else bytes(text)
    n, i, last = len(b), 0, None
    while i < n:
        c = b[i]
        starts = _is_digit(c) or (c == 0x2E and i + 1 < n and _is_digit(b[i + 1]) and
                                  (i == 0 or not _is_digit(b[i - 1])))
        if not starts:
            i += 1
            continue
        negative = i > 0 and b[i - 1] == 0x2D and (i < 2 or not _is_alnum(b[i - 2]))
        digits = ["-"] if negative else []
        j = i
        while j < n and _is_digit(b[j]):
            digits.append(chr(b[j]))
            j += 1
        int_len = j - i
        if 1 <= int_len <= 3:
            while (j + 3 < n and b[j] == 0x2C and _is_digit(b[j + 1]) and _is_digit(b[j + 2]) and
                   _is_digit(b[j + 3]) and (j + 4 == n or not _is_digit(b[j + 4]))):
                digits.append(b[j + 1:j + 4].decode("ascii"))
                j += 4
        if j + 1 < n and b[j] == 0x2E and _is_digit(b[j + 1]):
            digits.append(".")
            j += 1
            while j < n and _is_digit(b[j]):
                digits.append(chr(b[j]))
                j += 1
        v = parse_decimal("".join(digits))
        if v is not None:
            last = v
        i = j
    return last


class RewardError(Exception):
    pass


def number_label(label):
    """reward_text.cc number_label."""
    if isinstance(label, bool):
        raise RewardError("label must be a number or a numeric string, got boolean")
    if isinstance(label, (int, float)):
        return float(label)
    if isinstance(label, str):
        cleaned = label.encode("utf-8").strip(_SPACE).decode("utf-8", "replace").replace(",", "")
        if cleaned.startswith("+"):
            cleaned = cleaned[1:]
        v = parse_decimal(cleaned)
        if v is None:
            raise RewardError(f"label '{label[:40]}' is not a number")
        return v
    if label is None:
        raise RewardError("the sample has no label (a number is needed)")
    raise RewardError(f"label must be a number or a numeric string, got {type(label).__name__}")


def _trim(s):
    return s.encode("utf-8").strip(_SPACE).decode("utf-8", "replace")


def _lower_ascii(s):
    return "".join(ch.lower() if ch.isascii() else ch for ch in s)


def _answer_text(spec, response):
    if not spec["answer_prefix"]:
        return response
    pos = response.rfind(spec["answer_prefix"])
    return None if pos < 0 else response[pos + len(spec["answer_prefix"]):]


def score_part(spec, response, label, response_tokens, finish_reason):
    """One verifier's score of one sample (reward_verifiers.cc); raises RewardError for a bad label."""
    kind = spec["kind"]
    if kind == "numeric":
        want = number_label(label)
        answer = _answer_text(spec, response)
        if answer is None:
            return 0.0
        got = last_number(answer)
        if got is None:
            return 0.0
        return 1.0 if abs(got - want) <= float(spec["tolerance"]) else 0.0
    if kind == "exact_match":
        if not isinstance(label, str):
            raise RewardError(f"label must be a string, got {type(label).__name__}")
        answer = _answer_text(spec, response)
        if answer is None:
            return 0.0
        got, want = _trim(answer), _trim(label)
        if not spec["case_sensitive"]:
            got, want = _lower_ascii(got), _lower_ascii(want)
        return 1.0 if got == want else 0.0
    if kind == "keyword":
        keywords = list(spec["keywords"])
        if not keywords:
            if isinstance(label, str):
                keywords = [label]
            elif isinstance(label, list) and all(isinstance(k, str) for k in label):
                keywords = label
            else:
                raise RewardError("label must be a keyword or a list of keywords")
        if not keywords or any(k == "" for k in keywords):
            raise RewardError("label has no keywords / an empty keyword")
        text = response if spec["case_sensitive"] else _lower_ascii(response)
        found = sum(1 for k in keywords if (k if spec["case_sensitive"] else _lower_ascii(k)) in text)
        return found / len(keywords)
    if kind == "regex":
        pattern = spec["pattern"] or label
        if not isinstance(pattern, str):
            raise RewardError("label must be a regex string")
        try:
            return 1.0 if re.search(pattern, response) else 0.0
        except re.error as e:
            raise RewardError(f"bad regex: {e}")
    if kind == "length":
        max_tokens = int(spec["max_tokens"])
        penalty = 0.0
        if response_tokens > max_tokens:
            penalty = -min(1.0, (response_tokens - max_tokens) / max_tokens)
        if spec["require_finish"] and finish_reason == "length":
            penalty -= 1.0
        return penalty
    raise RewardError(f"reward kind '{kind}' has no Python port here")


SUPPORTED_REWARDS = {"numeric", "exact_match", "keyword", "regex", "length"}


def score_sample(specs, response, label, response_tokens, finish_reason):
    """RewardModel: Σ weight × part; a failed part scores 0 and marks the sample's reward as an error."""
    total, parts, error = 0.0, {}, False
    for spec in specs:
        try:
            v = score_part(spec, response, label, response_tokens, finish_reason)
        except RewardError:
            v, error = 0.0, True
        parts[spec["name"]] = v
        total += float(spec["weight"]) * v
    return total, parts, error


def response_of(tokenizer, ids, eos_ids):
    """The decoded response as miles scores it: every token, special ones included; finish reason."""
    text = tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)
    finish = "stop" if ids and ids[-1] in eos_ids else "length"
    return text, finish


# ---------------------------------------------------------------------------------------------------------------
# Data.

def read_jsonl(path):
    rows = []
    with open(path) as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip(" \t\r\n"):
                continue
            row = json.loads(line)
            if not isinstance(row, dict):
                sys.exit(f"trl_grpo.py: {path}:{lineno}: not a JSON object")
            rows.append(row)
    if not rows:
        sys.exit(f"trl_grpo.py: {path} holds no prompts")
    return rows


def prompt_of(row, data, where):
    pr = row.get(data["prompt_key"])
    if pr is None:
        sys.exit(f"trl_grpo.py: {where}: no \"{data['prompt_key']}\" (data.prompt_key)")
    if data["apply_chat_template"]:
        if isinstance(pr, str):
            return [{"role": "user", "content": pr}]
        if isinstance(pr, list):
            return pr
        sys.exit(f"trl_grpo.py: {where}: the prompt must be a string or chat messages")
    if not isinstance(pr, str):
        sys.exit(f"trl_grpo.py: {where}: the prompt must be a string (data.apply_chat_template is false)")
    return pr


def resolve(path):
    p = Path(path)
    if p.is_absolute() or p.exists():
        return p
    return REPO / p if (REPO / p).exists() else p


# ---------------------------------------------------------------------------------------------------------------
# The mapping onto GRPOConfig, with the named differences.

def plan(cfg, args, steps):
    """GRPOConfig keyword arguments, and the differences from miles this run will have."""
    r, t, a, asy = cfg["rollout"], cfg["trainer"], cfg["algorithm"], cfg["async"]
    fatal, diffs = [], []
    R, N = int(r["rollout_batch_size"]), int(r["n_samples_per_prompt"])
    G, mb, k = int(t["global_batch_size"]), int(t["micro_batch_size"]), int(t["num_steps_per_rollout"])
    if R * N != G * k:
        fatal.append(f"rollout_batch_size x n_samples_per_prompt ({R} x {N}) != trainer.global_batch_size x "
                     f"num_steps_per_rollout ({G} x {k}): miles rejects this job too")
    if G % mb:
        fatal.append(f"trainer.global_batch_size {G} is not divisible by micro_batch_size {mb}")
    if N < 2:
        fatal.append("TRL's GRPO needs n_samples_per_prompt >= 2")
    ga = max(G // mb, 1)
    if float(r["temperature"]) <= 0:
        fatal.append("rollout.temperature 0 (greedy training rollouts): TRL always samples (do_sample=True)")
    if r["environment"] != "none" or r["function"]:
        fatal.append("rollout.environment / rollout.function (multi-turn or custom rollouts): not mapped")
    for spec in cfg["rewards"]:
        if spec["kind"] not in SUPPORTED_REWARDS:
            fatal.append(f"reward '{spec['name']}' of kind {spec['kind']}: no Python port here "
                         f"(ported: {', '.join(sorted(SUPPORTED_REWARDS))})")
        if spec["kind"] == "length" and int(spec["max_tokens"]) <= 0:
            fatal.append(f"reward '{spec['name']}': length needs max_tokens > 0")
        if spec["kind"] == "regex":
            diffs.append(f"reward '{spec['name']}' (regex): Python's re, not ECMAScript std::regex")
    if r["stop"]:
        diffs.append(f"rollout.stop {r['stop']!r}: not passed (TRL's generate call gets no tokenizer for stop "
                     "strings); generation stops at EOS or max_new_tokens only")
    if r["filter_zero_variance"]:
        over = int(r["over_sampling_batch_size"]) or R
        diffs.append(f"rollout.filter_zero_variance (over_sampling_batch_size {over}): miles asks for {over} "
                     f"prompts and trains the first {R} groups whose rewards differ (dynamic sampling); TRL "
                     f"trains every group of {R} consecutive prompts, zero-variance ones included (advantage 0: "
                     "no gradient, but their tokens count in the token-mean divisor); the prompt order is miles' "
                     f"for the first step at most (miles launches {over} prompts a step, so its later steps start "
                     "further on)")
    elif int(r["over_sampling_batch_size"]) > R:
        diffs.append(f"rollout.over_sampling_batch_size {r['over_sampling_batch_size']}: miles launches more "
                     "groups than it keeps (the first to finish win); TRL generates exactly rollout_batch_size")
    if asy["mode"] != "sync":
        diffs.append(f"async.mode {asy['mode']} (max_weight_staleness {asy['max_weight_staleness']}, "
                     f"stale_policy {asy['stale_policy']}): miles trains on samples up to "
                     f"{asy['max_weight_staleness']} policy version(s) old and overlaps generation with "
                     "training; TRL is synchronous and exactly on-policy (generate, then train), so its "
                     "seconds per step are generate + train")
    if int(asy["update_weights_interval"]) != 1:
        diffs.append(f"async.update_weights_interval {asy['update_weights_interval']}: miles' engines get new "
                     "weights every that many steps; TRL always generates with the current weights")
    if a["old_logp"] == "rollout":
        diffs.append("algorithm.old_logp rollout: miles' ratio is against the engine's logprobs; TRL's "
                     "old_logp = logp.detach() (ratio exactly 1: the clip never binds)" +
                     (" — the same ratio as miles' only if the engine's logprobs equal the trainer's and "
                      "the samples are on-policy" if asy["mode"] == "sync" else ""))
    if a["correction"] != "none":
        diffs.append(f"algorithm.correction {a['correction']}: no rollout logprobs in TRL without vLLM: none")
    if a["advantage"] in ("reinforce_pp", "reinforce_pp_baseline"):
        diffs.append(f"algorithm.advantage {a['advantage']}: no TRL equivalent (token-level whitening over the "
                     "batch); using TRL's group advantages with scale_rewards "
                     + ("'batch'" if a["advantage"] == "reinforce_pp_baseline" else "'batch' (no group baseline "
                        "in miles)"))
    if a["advantage"] == "grpo" and a["std_normalize"]:
        diffs.append("advantage std epsilon: TRL (r - mean) / (std + 1e-4), miles / (std + 1e-6)")
    kl = a["kl_estimator"]
    beta = 0.0
    if kl != "none":
        if kl == "k3":
            beta = float(a["kl_coef"])
        else:
            diffs.append(f"algorithm.kl_estimator {kl}: TRL's KL is k3 only; using k3 with beta = kl_coef")
            beta = float(a["kl_coef"])
        if cfg["model"]["reference"]:
            diffs.append(f"model.reference {cfg['model']['reference']}: TRL's reference is the initial policy")
    red = a["loss_reduction"]
    if red == "token_mean":
        loss_type = "dapo"
    elif red == "sample_mean":
        loss_type = "grpo"
    else:
        loss_type = "dr_grpo"
        if float(a["constant_normaliser"]) != G * int(r["max_new_tokens"]):
            diffs.append(f"algorithm.loss_reduction constant ({a['constant_normaliser']}): TRL's dr_grpo divides "
                         f"by samples x max_completion_length = {G * int(r['max_new_tokens'])}")
    if k > 1 and loss_type == "dapo":
        diffs.append(f"trainer.num_steps_per_rollout {k}: TRL's dapo divisor is the generation batch's tokens / "
                     f"{k}, miles' each optimizer step's own token count")
    if float(a["entropy_coef"]) != 0:
        diffs.append("algorithm.entropy_coef: TRL's bonus is the mean entropy per micro-batch / accumulation "
                     "steps, miles' the token mean over the step")
    if float(r["temperature"]) != 1.0:
        diffs.append("rollout.temperature != 1: TRL's logprobs are tempered (logits / T), miles' untempered")
    if args.threads != int(t["threads"]) + int(r["engine_threads"]):
        diffs.append(f"threads: TRL uses --threads {args.threads} for both phases in turn; miles "
                     f"{r['engine_threads']} engine + {t['threads']} trainer thread(s) at once")

    adv = a["advantage"]
    scale = ("group" if a["std_normalize"] else "none") if adv == "grpo" else "none" if adv == "dr_grpo" else "batch"
    kwargs = dict(
        # batch shape: one optimizer step = global_batch_size samples; one generation per rollout step
        per_device_train_batch_size=mb,
        gradient_accumulation_steps=ga,
        steps_per_generation=ga * k,
        num_generations=N,
        max_steps=steps * k,
        num_iterations=1,
        shuffle_dataset=False,
        # generation
        max_completion_length=int(r["max_new_tokens"]),
        temperature=float(r["temperature"]),
        top_p=float(r["top_p"]),
        top_k=int(r["top_k"]),
        # optimizer (the trainer gets its own AdamW + LambdaLR built from the same numbers)
        learning_rate=float(t["lr"]),
        adam_beta1=float(t["beta1"]),
        adam_beta2=float(t["beta2"]),
        adam_epsilon=float(t["eps"]),
        weight_decay=float(t["weight_decay"]),
        max_grad_norm=float(t["clip_grad_norm"]),
        # loss
        beta=beta,
        use_bias_correction_kl=False,
        epsilon=float(a["eps_clip"]),
        epsilon_high=float(a["eps_clip_high"]),
        delta=float(a["dual_clip_c"]) if float(a["dual_clip_c"]) > 0 else None,
        importance_sampling_level="sequence" if a["policy_loss"] == "gspo" else "token",
        scale_rewards=scale,
        loss_type=loss_type,
        entropy_coef=float(a["entropy_coef"]),
        mask_truncated_completions=False,
        reward_weights=[float(s["weight"]) for s in cfg["rewards"]],
        multi_objective_aggregation="sum_then_normalize",
        # precision / device / housekeeping
        bf16=False,
        fp16=False,
        use_cpu=True,
        gradient_checkpointing=False,
        disable_dropout=True,
        seed=args.seed,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        disable_tqdm=True,
        remove_unused_columns=False,
        dataloader_num_workers=0,
        log_completions=False,
    )
    return kwargs, diffs, fatal


def lr_lambda_of(t, total_steps):
    """miles' LrSchedule::at(step) / lr (trainer/lr_schedule.cc)."""
    lr, min_lr, warmup = float(t["lr"]), float(t["min_lr"]), int(t["warmup_steps"])
    cosine = t["decay"] == "cosine"

    def at(step):
        if step < warmup:
            return (step + 1) / warmup
        if not cosine:
            return 1.0
        span = total_steps - warmup
        if span <= 0 or step >= total_steps:
            return min_lr / lr
        progress = (step - warmup) / span
        return (min_lr + (lr - min_lr) * 0.5 * (1.0 + math.cos(math.pi * progress))) / lr
    return at


# ---------------------------------------------------------------------------------------------------------------
# Held-out evaluation (controller/evaluator.cc).

def evaluate(model, tokenizer, prompts, labels, cfg, eos_ids, batch_size):
    import torch

    ev = cfg["eval"]
    n = max(int(ev["n_samples"]), 1)
    temp = float(ev["temperature"])
    max_new = int(ev["max_new_tokens"]) or int(cfg["rollout"]["max_new_tokens"])
    threshold = float(ev["pass_threshold"])
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos_ids[0]
    t0 = time.perf_counter()
    was_training = model.training
    model.eval()
    samples = []  # (prompt index, total, parts, error, tokens, finish)
    try:
        for first in range(0, len(prompts), batch_size):
            chunk = prompts[first:first + batch_size]
            ids = [encode_prompt(tokenizer, p, cfg["data"]["apply_chat_template"]) for p in chunk]
            width = max(len(x) for x in ids)
            input_ids = torch.tensor([[pad] * (width - len(x)) + x for x in ids])
            attention = torch.tensor([[0] * (width - len(x)) + [1] * len(x) for x in ids])
            gen = dict(max_new_tokens=max_new, eos_token_id=eos_ids, pad_token_id=pad)
            if temp > 0:
                gen.update(do_sample=True, temperature=temp, top_p=1.0, top_k=0, num_return_sequences=n)
            else:
                gen.update(do_sample=False)
            from transformers import GenerationConfig

            with torch.no_grad():
                out = model.generate(input_ids=input_ids, attention_mask=attention,
                                     generation_config=GenerationConfig(**gen))
            out = out[:, width:].tolist()
            reps = n if temp > 0 else 1
            for row, seq in enumerate(out):
                p = first + row // reps
                cut = len(seq)
                for i, tok in enumerate(seq):
                    if tok in eos_ids:
                        cut = i + 1
                        break
                seq = seq[:cut]
                text, finish = response_of(tokenizer, seq, eos_ids)
                total, parts, error = score_sample(cfg["rewards"], text, labels[p], len(seq), finish)
                for _ in range(1 if temp > 0 else n):  # greedy: n identical samples
                    samples.append((p, total, parts, error, len(seq), finish, text))
    finally:
        if was_training:
            model.train()
    m = len(samples)
    passed = [s[3] is False and s[1] >= threshold for s in samples]
    res = {
        "eval_pass_at_1": sum(passed) / m,
        "eval_reward_mean": sum(s[1] for s in samples) / m,
        "eval_response_length_mean": sum(s[4] for s in samples) / m,
        "eval_truncated_frac": sum(s[5] == "length" for s in samples) / m,
        "eval_reward_errors": sum(s[3] for s in samples),
        "eval_prompts": len(prompts),
        "eval_samples": m,
    }
    if n > 1:
        by_prompt = {}
        for s, ok in zip(samples, passed):
            by_prompt[s[0]] = by_prompt.get(s[0], False) or ok
        res[f"eval_pass_at_{n}"] = sum(by_prompt.values()) / len(prompts)
    for spec in cfg["rewards"]:
        res[f"eval_reward_{spec['name']}_mean"] = sum(s[2][spec["name"]] for s in samples) / m
    res["eval_s"] = time.perf_counter() - t0
    res["eval_example"] = samples[0][6] if samples else ""
    return res


def encode_prompt(tokenizer, prompt, chat):
    if chat:
        text = tokenizer.apply_chat_template(prompt, add_generation_prompt=True, tokenize=False)
        return tokenizer(text, add_special_tokens=False)["input_ids"]
    return tokenizer(prompt)["input_ids"]


# ---------------------------------------------------------------------------------------------------------------

def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("config", nargs="?", default="configs/smollm2_arithmetic.yaml", help="miles job file")
    ap.add_argument("overrides", nargs="*", help="section.key=value, as on `miles run`'s command line")
    ap.add_argument("--steps", type=int, default=None, help="rollout steps (default: rollout.num_rollouts)")
    ap.add_argument("--eval-every", type=int, default=None, help="default: eval.every, else 10; 0: first/last")
    ap.add_argument("--eval-max-prompts", type=int, default=None, help="default: eval.max_prompts (0: all)")
    ap.add_argument("--eval-data", default=None, help="default: eval.data, else DATA_eval.jsonl when it exists")
    ap.add_argument("--eval-batch-size", type=int, default=32, help="prompts per generate call of an evaluation")
    ap.add_argument("--threads", type=int, default=2, help="torch.set_num_threads (default 2)")
    ap.add_argument("--out", default="runs/trl_grpo/metrics.jsonl")
    ap.add_argument("--seed", type=int, default=None, help="TRL's seed (sampling RNG); default rollout.seed")
    ap.add_argument("--dry-run", action="store_true", help="print the mapping and the differences, then stop")
    args = ap.parse_args()

    # The thread count before torch starts its pools.
    os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    import torch

    torch.set_num_threads(args.threads)
    try:
        torch.set_num_interop_threads(1)
    except RuntimeError:
        pass

    notes, not_understood, not_applicable = [], [], []
    cross_check_reference(notes)
    job = load_job(args.config, args.overrides)
    cfg = effective_config(job, not_understood, not_applicable)
    r, d, ev = cfg["rollout"], cfg["data"], cfg["eval"]
    steps = args.steps if args.steps is not None else int(r["num_rollouts"])
    if args.seed is None:
        args.seed = int(r["seed"])
    kwargs, diffs, fatal = plan(cfg, args, steps)

    import transformers
    import trl
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    if trl.__version__ != "1.16.0":
        notes.append(f"TRL {trl.__version__}: this script hooks GRPOTrainer internals (_generate_single_turn, "
                     "_generate_and_score_completions) as of TRL 1.16.0; check them if anything fails")

    print(f"trl_grpo.py: {args.config}: {steps} steps; torch {torch.__version__}, transformers "
          f"{transformers.__version__}, trl {trl.__version__}, {args.threads} thread(s)")
    print("GRPOConfig:")
    for k, v in kwargs.items():
        print(f"  {k} = {v!r}")
    if diffs:
        print("Differences from miles (no TRL equivalent, or not the same):")
        for x in diffs:
            print(f"  - {x}")
    if not_applicable:
        print("Not applicable (miles' infrastructure, nothing to map): " + ", ".join(not_applicable))
    if not_understood:
        print("NOT UNDERSTOOD by this script (ignored): " + ", ".join(not_understood))
    for x in notes:
        print(f"note: {x}")
    load = os.getloadavg()[0]
    if load > 0.5:
        print(f"WARNING: load average {load:.2f} before the run: other processes share the CPU, so the seconds "
              "measured here are not a baseline (2 PyTorch threads on 2 busy cores ran 8-13x slower than 1)")
    if fatal:
        for x in fatal:
            print(f"trl_grpo.py: cannot run: {x}", file=sys.stderr)
        sys.exit(2)
    if args.dry_run:
        return

    # Model and tokenizer.
    model_path = resolve(cfg["model"]["path"])
    tok_path = resolve(cfg["model"]["tokenizer"]) if cfg["model"]["tokenizer"] else model_path
    if tok_path.is_file():
        tok_path = tok_path.parent
    tokenizer = AutoTokenizer.from_pretrained(str(tok_path))
    tokenizer.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(str(model_path), dtype=torch.float32)
    eos = model.generation_config.eos_token_id
    eos_ids = [eos] if isinstance(eos, int) else list(eos or [tokenizer.eos_token_id])
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token

    # Training prompts in miles' order.
    data_path = resolve(d["path"])
    rows = read_jsonl(data_path)
    R, k = int(r["rollout_batch_size"]), int(cfg["trainer"]["num_steps_per_rollout"])
    order = miles_order(len(rows), steps * R, bool(d["shuffle"]), int(d["seed"]))
    train = [{"prompt": prompt_of(rows[i], d, f"{data_path}:{i + 1}"),
              "label_json": json.dumps(rows[i].get(d["label_key"]))} for i in order]
    train_ds = Dataset.from_list(train)

    # Held-out prompts in file order.
    eval_path = args.eval_data or ev["data"]
    if not eval_path:
        guess = Path(str(data_path)[:-len(".jsonl")] + "_eval.jsonl") if str(data_path).endswith(".jsonl") else None
        if guess is not None and guess.exists():
            eval_path = str(guess)
            print(f"note: the job file has no eval.data; evaluating on {eval_path}")
    eval_prompts, eval_labels = [], []
    if eval_path:
        erows = read_jsonl(resolve(eval_path))
        limit = args.eval_max_prompts if args.eval_max_prompts is not None else int(ev["max_prompts"])
        if limit > 0:
            erows = erows[:limit]
        eval_prompts = [prompt_of(x, d, eval_path) for x in erows]
        eval_labels = [x.get(d["label_key"]) for x in erows]
    else:
        print("note: no held-out data (eval.data, --eval-data): no evaluation")
    eval_every = args.eval_every if args.eval_every is not None else (int(ev["every"]) or 10)

    # Reward functions: one per miles reward, weighted by TRL (reward_weights).
    batch_stats = {}

    def make_reward(index, spec):
        def reward(prompts, completions, completion_ids, label_json, **_):
            out = []
            for ids, lj in zip(completion_ids, label_json):
                text, finish = response_of(tokenizer, ids, eos_ids)
                try:
                    out.append(score_part(spec, text, json.loads(lj), len(ids), finish))
                except RewardError:
                    out.append(0.0)
            if index == 0:  # the whole batch's miles reward, for the step's metrics
                totals = []
                for ids, lj in zip(completion_ids, label_json):
                    text, finish = response_of(tokenizer, ids, eos_ids)
                    totals.append(score_sample(cfg["rewards"], text, json.loads(lj), len(ids), finish))
                thr = float(ev["pass_threshold"])
                n = len(totals)
                batch_stats.update({
                    "reward_mean": sum(x[0] for x in totals) / n,
                    "accuracy": sum(1 for x in totals if not x[2] and x[0] >= thr) / n,
                    "response_length_mean": sum(len(i) for i in completion_ids) / n,
                    "truncated_frac": sum(1 for i in completion_ids if not i or i[-1] not in eos_ids) / n,
                    "reward_errors": sum(1 for x in totals if x[2]),
                    **{f"reward_{s['name']}_mean": sum(x[1][s["name"]] for x in totals) / n
                       for s in cfg["rewards"]},
                })
            return out
        reward.__name__ = spec["name"]
        return reward

    reward_funcs = [make_reward(i, s) for i, s in enumerate(cfg["rewards"])]

    out_path = Path(args.out)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    config_kwargs = dict(kwargs)
    import dataclasses

    if "activation_checkpointing" in {f.name for f in dataclasses.fields(GRPOConfig)}:
        # transformers >= 5.25 names it so (gradient_checkpointing is its deprecated alias)
        config_kwargs["activation_checkpointing"] = config_kwargs.pop("gradient_checkpointing")
    grpo_args = GRPOConfig(output_dir=str(out_path.parent / "trainer"), **config_kwargs)

    # miles' AdamW (decay on 2+-dim tensors) and learning-rate schedule.
    t = cfg["trainer"]
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": float(t["weight_decay"])},
              {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
    optimizer = torch.optim.AdamW([g for g in groups if g["params"]], lr=float(t["lr"]),
                                  betas=(float(t["beta1"]), float(t["beta2"])), eps=float(t["eps"]))
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lr_lambda_of(t, int(r["num_rollouts"]) * k))

    sink = open(out_path, "w")

    def write(record):
        sink.write(json.dumps(record) + "\n")
        sink.flush()

    timing = {"gen": 0.0, "gen_score": 0.0}
    steps_seen, evals = [], []
    state = {"pending": None, "t_begin": None, "wall0": None, "last_eval_step": None}

    def run_eval(step, mdl):
        if not eval_prompts:
            return
        res = evaluate(mdl, tokenizer, eval_prompts, eval_labels, cfg, eos_ids, args.eval_batch_size)
        example = res.pop("eval_example")
        rec = {"step": step, **res}
        write(rec)
        evals.append(rec)
        state["last_eval_step"] = step
        print(f"eval step {step}: pass@1 {res['eval_pass_at_1']:.3f}  reward {res['eval_reward_mean']:.3f}  "
              f"length {res['eval_response_length_mean']:.1f}  ({res['eval_s']:.1f} s; e.g. {example!r})",
              flush=True)

    class Timer(TrainerCallback):
        def on_step_begin(self, a, s, c, **kw):
            timing["gen"] = timing["gen_score"] = 0.0
            state["t_begin"] = time.perf_counter()

        def on_step_end(self, a, s, c, **kw):
            now = time.perf_counter()
            seconds = now - state["t_begin"]
            gen = timing["gen"]
            rec = {"step": s.global_step, "seconds": seconds, "generate_s": gen, "train_s": seconds - gen,
                   "gen_score_s": timing["gen_score"]}
            if gen > 0:
                rec.update(batch_stats)
            rec["wall_s"] = now - state["wall0"]
            state["pending"] = rec

        def on_log(self, a, s, c, logs=None, model=None, **kw):
            rec = state["pending"]
            if rec is None:
                return
            for key in ("loss", "grad_norm", "learning_rate", "entropy", "clip_ratio/region_mean", "kl",
                        "frac_reward_zero_std", "reward_std"):
                if logs and key in logs:
                    rec[key.replace("/", "_")] = logs[key]
            self.flush(s, model)

        def flush(self, s, model):
            rec = state["pending"]
            state["pending"] = None
            write(rec)
            steps_seen.append(rec)
            print(f"step {rec['step']}: {rec['seconds']:.1f} s (generate {rec['generate_s']:.1f}, rest "
                  f"{rec['train_s']:.1f})  reward {rec.get('reward_mean', float('nan')):.3f}  accuracy "
                  f"{rec.get('accuracy', float('nan')):.3f}  length {rec.get('response_length_mean', 0):.1f}",
                  flush=True)
            if eval_every > 0 and s.global_step % (eval_every * k) == 0 and s.global_step < kwargs["max_steps"]:
                run_eval(s.global_step // k, model)

        def on_train_end(self, a, s, c, model=None, **kw):
            if state["pending"] is not None:
                self.flush(s, model)

    trainer = GRPOTrainer(model=model, reward_funcs=reward_funcs, args=grpo_args, train_dataset=train_ds,
                          processing_class=tokenizer, callbacks=[Timer()], optimizers=(optimizer, scheduler))

    # Timing hooks on the installed GRPOTrainer (TRL 1.16.0): _generate_single_turn is the model.generate call
    # (left-padded prompts -> completion ids); _generate_and_score_completions adds decoding, rewards, advantages.
    def timed(fn, key):
        def wrapper(*a, **kw):
            t0 = time.perf_counter()
            try:
                return fn(*a, **kw)
            finally:
                timing[key] += time.perf_counter() - t0
        return wrapper

    trainer._generate_single_turn = timed(trainer._generate_single_turn, "gen")
    trainer._generate_and_score_completions = timed(trainer._generate_and_score_completions, "gen_score")

    config_record = {
        "config": str(args.config), "overrides": args.overrides, "steps": steps, "threads": args.threads,
        "seed": args.seed, "torch": torch.__version__, "transformers": transformers.__version__,
        "trl": trl.__version__, "grpo_config": kwargs, "differences": diffs, "not_applicable": not_applicable,
        "not_understood": not_understood, "notes": notes, "eval_data": eval_path,
        "eval_prompts": len(eval_prompts), "eval_every": eval_every, "loadavg_at_start": os.getloadavg(),
    }
    (out_path.parent / "trl_config.json").write_text(json.dumps(config_record, indent=2) + "\n")

    run_eval(0, trainer.model)
    state["wall0"] = time.perf_counter()
    trainer.train()
    if eval_prompts and state["last_eval_step"] != steps:
        run_eval(steps, trainer.model)
    sink.close()

    # Summary.
    print(f"\nsummary ({out_path}): {len(steps_seen)} optimizer steps, TRL {trl.__version__}, "
          f"{args.threads} thread(s)")
    later = steps_seen[1:] if len(steps_seen) > 1 else steps_seen
    if later:
        mean = lambda key: sum(x[key] for x in later) / len(later)  # noqa: E731
        print(f"  s/step (steps after the first: {len(later)}): {mean('seconds'):.2f}  = generate "
              f"{mean('generate_s'):.2f} + rest {mean('train_s'):.2f}  (generate+score {mean('gen_score_s'):.2f})")
        print(f"  first step: {steps_seen[0]['seconds']:.2f} s; train reward mean (all steps) "
              f"{sum(x.get('reward_mean', 0) for x in steps_seen) / len(steps_seen):.3f}")
    if evals:
        print("  eval: step  pass@1  reward  length  seconds")
        for e in evals:
            print(f"        {e['step']:4d}  {e['eval_pass_at_1']:.3f}   {e['eval_reward_mean']:+.3f}  "
                  f"{e['eval_response_length_mean']:6.1f}  {e['eval_s']:.1f}")


if __name__ == "__main__":
    main()
