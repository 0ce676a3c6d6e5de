"""Settings: one YAML file plus environment overrides.

Upstream models use LiteLLM's `model_list` / `router_settings` shapes so that a LiteLLM
user can bring their file unchanged. Environment variables override the file:
`APPRENTICE_<FIELD>` and `APPRENTICE_<SECTION>__<FIELD>` (for example
`APPRENTICE_JOURNAL__SHIP_INTERVAL_S=0.5`); `DATABASE_URL` is honoured as well.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

import yaml
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from apprentice.discovery.entries import EntryError, parse_entry, parse_nameserver

ENV_REFERENCE_PREFIX = "os.environ/"

# LiteLLM provider prefixes whose endpoints speak the OpenAI wire format: calls to them are
# forwarded byte for byte instead of going through litellm (about 4.5 ms of CPU a call).
OPENAI_COMPATIBLE_PROVIDERS = {"openai", "hosted_vllm", "vllm", "openai_compatible", "apprentice"}
OPENAI_DEFAULT_API_BASE = "https://api.openai.com/v1"
OPENAI_API_HOST = "api.openai.com"
ANTHROPIC_DEFAULT_API_BASE = "https://api.anthropic.com/v1"
NATIVE_PROTOCOLS_BY_PROVIDER = {"openai": frozenset({"responses"}), "anthropic": frozenset({"messages"})}


class ConfigError(ValueError):
    """The configuration is unusable; the message says which setting and why."""


def resolve_secret(value: str | SecretStr | None) -> str | None:
    """Turn `os.environ/NAME` into the variable's value (read at use time, never stored)."""
    if value is None:
        return None
    raw = value.get_secret_value() if isinstance(value, SecretStr) else value
    if raw.startswith(ENV_REFERENCE_PREFIX):
        name = raw[len(ENV_REFERENCE_PREFIX) :]
        if name not in os.environ:
            raise ConfigError(f"environment variable {name} (referenced as {raw}) is not set")
        return os.environ[name]
    return raw


class LiteLLMParams(BaseModel):
    """`litellm_params` of one `model_list` entry; unknown keys are passed on to litellm."""

    model_config = ConfigDict(extra="allow")

    model: str
    api_base: str | None = None
    api_key: SecretStr | None = None
    timeout: float | None = None
    stream_timeout: float | None = None
    max_retries: int | None = None

    @property
    def provider(self) -> str:
        return self.model.split("/", 1)[0] if "/" in self.model else "openai"

    @property
    def upstream_model(self) -> str:
        """The model name the upstream itself expects (the provider prefix removed)."""
        return self.model.split("/", 1)[1] if "/" in self.model else self.model

    @property
    def extra_params(self) -> dict[str, Any]:
        return dict(self.__pydantic_extra__ or {})


class ModelEntry(BaseModel):
    """One deployment in LiteLLM's `model_list`. Several entries may share a `model_name`."""

    model_config = ConfigDict(extra="allow")

    model_name: str
    litellm_params: LiteLLMParams
    model_info: dict[str, Any] = Field(default_factory=dict)
    # Apprentice-only: "auto" forwards OpenAI-compatible upstreams directly, "litellm" forces litellm.
    forward: Literal["auto", "direct", "litellm"] = "auto"
    # Apprentice-only: the protocols besides chat completions the upstream itself speaks, whose
    # calls are forwarded to it byte for byte ("responses": OpenAI's /v1/responses, "messages":
    # Anthropic's /v1/messages); others are translated to chat completions. None: by provider
    # (openai/: responses; anthropic/: messages).
    protocols: list[Literal["responses", "messages"]] | None = None

    @property
    def is_direct(self) -> bool:
        if self.forward == "direct":
            return True
        if self.forward == "litellm":
            return False
        return self.litellm_params.provider in OPENAI_COMPATIBLE_PROVIDERS

    @property
    def api_base(self) -> str:
        base = self.litellm_params.api_base or OPENAI_DEFAULT_API_BASE
        return base.rstrip("/")

    @property
    def native_api_base(self) -> str:
        """Where the provider's own protocols are served (Anthropic's API for anthropic/)."""
        if self.litellm_params.api_base:
            return self.litellm_params.api_base.rstrip("/")
        return ANTHROPIC_DEFAULT_API_BASE if self.litellm_params.provider == "anthropic" else OPENAI_DEFAULT_API_BASE

    @property
    def native_protocols(self) -> frozenset[str]:
        """The protocols forwarded to this deployment as they are; the others are translated.

        An `openai/` entry with an `api_base` other than OpenAI's is usually a server that speaks
        chat completions only (an older vLLM, llama.cpp, Ollama, hosted OpenAI-compatible APIs):
        it is assumed to speak no Responses unless `protocols` says so. `anthropic/` speaks
        Messages wherever it points: litellm itself talks Messages to that address."""
        if self.protocols is not None:
            return frozenset(self.protocols)
        provider = self.litellm_params.provider
        if provider == "openai" and not self.is_openai_itself:
            return frozenset()
        return NATIVE_PROTOCOLS_BY_PROVIDER.get(provider, frozenset())

    @property
    def is_openai_itself(self) -> bool:
        """No `api_base` (litellm's default is OpenAI's API), or OpenAI's own."""
        base = self.litellm_params.api_base
        return base is None or urlsplit(base).hostname == OPENAI_API_HOST


class AdapterStoreS3Settings(BaseModel):
    """The adapter store's second target: an S3-compatible bucket that replicas without the
    shared volume mirror with `apprentice adapter-store sync`. Credentials come from boto3's
    own chain (AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY, a profile, a pod or instance role)."""

    model_config = ConfigDict(extra="forbid")

    url: str  # s3://bucket/prefix
    endpoint_url: str | None = None  # an S3-compatible server (MinIO, Ceph RGW...); None: AWS
    region: str | None = None

    @field_validator("url")
    @classmethod
    def _s3_url(cls, value: str) -> str:
        if not value.startswith("s3://") or len(value.rstrip("/")) <= len("s3://"):
            raise ValueError(f"expected s3://bucket[/prefix], got {value!r}")
        return value


class AdapterStoreSettings(BaseModel):
    """A shared adapter store: the directory vLLM's filesystem LoRA resolver reads.

    The promotion job publishes every canary and promoted version of the policy there as
    `<path>/<version name>/` (adapter_config.json + weights), and removes a version's copy
    `unload_grace_s` after it stops serving, so an inference replica started with
    `VLLM_PLUGINS=lora_filesystem_resolver`, `VLLM_LORA_RESOLVER_CACHE_DIR=<path>` and
    `VLLM_ALLOW_RUNTIME_LORA_UPDATING=True` serves them on first request (docs/local-inference.md).
    Several policies may share one path: version names are unique.
    """

    model_config = ConfigDict(extra="forbid")

    path: Path
    # What vLLM compares each adapter's `base_model_name_or_path` with: the `--model` the
    # inference servers were started with (a hub name or their local directory, not the
    # --served-model-name). None: the policy's base_model.
    base_model: str | None = None
    # Also upload every published copy to object storage (the `s3` extra); None: the directory only.
    s3: AdapterStoreS3Settings | None = None


class EvalGateSettings(BaseModel):
    """The evaluation gate (docs/evaluation-sets.md): before a version becomes the canary it is
    scored on the policy's evaluation set `set` and compared item by item with the promoted
    version (or the base model). It serves only when a paired one-sided t-test on the per-item
    differences shows it is not worse by more than `margin` at level `alpha`; `power` is the
    chance the test must have of letting through a version exactly as good as the promoted one
    (a set too small or too noisy for it refuses, naming the power it has)."""

    model_config = ConfigDict(extra="forbid")

    set: str
    margin: float = Field(default=0.05, gt=0)
    alpha: float = Field(default=0.05, gt=0, lt=0.5)
    power: float = Field(default=0.8, ge=0, lt=1)


class PromotionSettings(BaseModel):
    """How a policy's new adapters reach traffic: gates, canary, evaluation, retention.

    See docs/operations-promotion.md. The canary follows the training lineage (the newest gated
    version serves as the canary). `automatic`: the canary is promoted when the lineage's rewards
    are significantly better than the promoted version's over the same period, the lineage is
    rejected when they, or the newest version's own, are significantly worse, and when
    `timeout_s` passes with no verdict. `reviewed`: the comparison is computed and shown, an
    admin approves or rejects; the lineage keeps training meanwhile.
    """

    model_config = ConfigDict(extra="forbid")

    mode: Literal["automatic", "reviewed"] = "automatic"
    # Candidates that pass the gates become canaries without an admin (in both modes).
    auto_canary: bool = True
    # The probability that a new run (or client group) is assigned to the canary's arm, drawn
    # independently of its prompt; 1 serves every new run from the canary and compares nothing.
    canary_share: float = Field(default=0.2, gt=0, le=1)
    # Rewarded trajectories needed in each arm before a verdict.
    min_samples: int = Field(default=30, ge=2)
    confidence: float = Field(default=0.95, gt=0.5, lt=1)
    # Interval on mean(lineage) - mean(promoted): the always-valid confidence sequence (valid at
    # every tick's look), or the fixed-sample Welch's t or percentile bootstrap (one look only).
    method: Literal["sequential", "welch", "bootstrap"] = "sequential"
    # A run counts in the comparison once its first call is this old: set it to how late your
    # rewards arrive, so that a run's value is fixed when it enters and each look extends the
    # sequence the last one saw (apprentice/promotion/sequential.py); `apprentice up` sets 10 s.
    # 0: a run counts as soon as it has a reward (a reward arriving later changes an earlier term).
    settle_s: float = Field(default=0.0, ge=0)
    # Automatic mode: a lineage with no verdict this long after its first canary started is
    # rejected (a long time for continuous learning: `apprentice up` sets it long).
    timeout_s: float = Field(default=24 * 3600.0, gt=0)
    # Gate: the training run's KL to the incumbent (per token) must be at most this; None: no bound.
    kl_bound: float | None = Field(default=1.0, ge=0)
    # Retention: files of versions beyond the newest keep_last are deleted, except versions
    # that were ever promoted and those still candidate or canary.
    keep_last: int = Field(default=5, ge=1)
    # Retired and rejected adapters stay loaded at the endpoints this long (calls in flight).
    unload_grace_s: float = Field(default=300.0, ge=0)
    # Publish serving versions to a shared directory for vLLM's filesystem LoRA resolver
    # (replicas that start later find them by name); None: endpoints are loaded over HTTP only.
    adapter_store: AdapterStoreSettings | None = None
    # Score the version about to become the canary on an evaluation set against the promoted
    # one; one worse by more than the margin never serves (docs/evaluation-sets.md). None: no gate.
    eval_gate: EvalGateSettings | None = None


class RouterSettings(BaseModel):
    """LiteLLM's `router_settings`: retries and fallbacks apply before the first byte is sent."""

    model_config = ConfigDict(extra="allow")

    num_retries: int = 0
    timeout: float = 600.0
    retry_after: float = 0.0
    # [{"gpt-4o": ["gpt-4o-mini", ...]}, ...] as in LiteLLM.
    fallbacks: list[dict[str, list[str]]] = Field(default_factory=list)

    def fallbacks_for(self, model_name: str) -> list[str]:
        chain: list[str] = []
        for mapping in self.fallbacks:
            chain.extend(mapping.get(model_name, []))
        return chain


# vLLM accepts only these LoRA ranks (`--max-lora-rank`); a learner must produce one of them.
VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
ALL_LINEAR_PROJECTIONS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


class KubernetesJobSettings(BaseModel):
    """The batch/v1 Job the `kubernetes` launcher creates per training run (learner/jobs/kubernetes.py).

    The pod runs `torchrun --nproc-per-node <learning.processes> -m learner.jobs.one_run` with
    the config at `config_path` (mount it, e.g. from a ConfigMap, with `volumes` and
    `volume_mounts`, beside the shared adapters directory and the model cache).
    """

    model_config = ConfigDict(extra="forbid")

    image: str
    namespace: str = "default"
    image_pull_policy: Literal["Always", "IfNotPresent", "Never"] | None = None
    service_account: str | None = None
    config_path: str = "/etc/apprentice/config.yaml"
    # The container's resources; without an nvidia.com/gpu limit, one GPU per process is asked for.
    resources: dict[str, Any] = Field(default_factory=dict)
    gpus: bool = True  # False: CPU-only pods (gloo), no nvidia.com/gpu limit added
    node_selector: dict[str, str] = Field(default_factory=dict)
    tolerations: list[dict[str, Any]] = Field(default_factory=list)
    env: list[dict[str, Any]] = Field(default_factory=list)
    env_from: list[dict[str, Any]] = Field(default_factory=list)
    volumes: list[dict[str, Any]] = Field(default_factory=list)
    volume_mounts: list[dict[str, Any]] = Field(default_factory=list)
    labels: dict[str, str] = Field(default_factory=dict)
    # A memory-backed /dev/shm of this size (NCCL and DataLoader workers need more than 64 MiB); None: none.
    shm_size: str | None = "16Gi"
    # Finished Jobs are deleted by Kubernetes after this long (the launcher also deletes the ones it waited for).
    ttl_seconds_after_finished: int = Field(default=3600, ge=0)
    # Kubernetes fails the Job (and stops its pod) after this long, pending time included: a hung
    # run (a stuck collective) cannot hold the scheduler forever. None: no deadline.
    active_deadline_s: int | None = Field(default=86400, ge=1)
    # A Job whose pod is not running (no ready, succeeded or failed pod) this long after its
    # creation (no GPU node, an image that cannot be pulled) is deleted and its run ends failed.
    start_timeout_s: float = Field(default=1800.0, gt=0)
    # How long reads and deletes are retried (with backoff) through API errors (5xx, 429, a
    # rotated token's 401, a reset connection) before the launcher gives the run up.
    api_retry_s: float = Field(default=300.0, ge=0)
    poll_s: float = Field(default=5.0, gt=0)
    # The API server: in a pod, the in-cluster service account (KUBERNETES_SERVICE_HOST, its token and
    # CA); else `kubeconfig` (default $KUBECONFIG, then ~/.kube/config) and its `context`.
    api_url: str | None = None
    kubeconfig: Path | None = None
    context: str | None = None


class ExplorationSettings(BaseModel):
    """Exploration samples (gateway/exploration, docs/exploration.md): after a client has its
    answer, the gateway asks the policy's lineage head for `extra_answers` more answers to the
    same request, at low priority, and records them as unserved attempts in the served call's
    group, so that a prompt that never repeats still makes a group the learner can compare.

    Off by default (extra_answers 0). The budget counts generated tokens in any sliding hour,
    per gateway process: a request is sent only when its worst case (k x its max_tokens) fits.
    """

    model_config = ConfigDict(extra="forbid")

    # How many unserved answers to ask for per explored call (vLLM's `n`); 0: no exploration.
    extra_answers: int = Field(default=0, ge=0, le=16)
    # Extra generated tokens allowed in any sliding hour (per gateway process).
    budget_tokens_per_hour: int = Field(default=0, ge=0)
    # The share of eligible calls explored (the budget may leave fewer).
    share: float = Field(default=1.0, gt=0, le=1)
    # max_tokens of each extra answer when the client set none (the client's own otherwise).
    max_tokens: int = Field(default=512, ge=1)
    # vLLM's `priority` field (lower values are scheduled first, client calls send none: 0);
    # needs `--scheduling-policy priority` on vLLM (the local server always has it). None: the
    # field is not sent, for endpoints without priority scheduling.
    priority: int | None = 10
    # Calls waiting for exploration in each gateway process; a full queue drops the newest.
    queue_size: int = Field(default=64, ge=1)
    # Exploration requests in flight at once per gateway process.
    concurrency: int = Field(default=2, ge=1)
    # Explore streamed calls too (after their stream ended; the extra answers are not streamed).
    streamed: bool = True

    @property
    def enabled(self) -> bool:
        return self.extra_answers > 0 and self.budget_tokens_per_hour > 0

    @model_validator(mode="after")
    def _budget_for_answers(self) -> ExplorationSettings:
        if self.extra_answers > 0 and self.budget_tokens_per_hour == 0:
            raise ValueError("exploration: extra_answers needs budget_tokens_per_hour (extra tokens an hour)")
        return self


class LearningSettings(BaseModel):
    """How the learner turns a policy's rewarded trajectories into a new LoRA adapter (GRPO).

    Defaults follow the reference implementations (TRL, ART, DAPO): LoRA r=8 on all seven
    projections, eps 0.2/0.28, no KL, token-level loss. The learning rate is conservative for
    production; a small model on a toy task learns at 1e-4.
    """

    model_config = ConfigDict(extra="forbid")

    enabled: bool = True
    # When the scheduled learner runs: seconds between runs (a number) or a cron string
    # ("0 */6 * * *"). None: only the trigger below (or `apprentice learn --policy P`) runs it.
    schedule: float | str | None = None
    # Also run as soon as at least this many new rewarded groups are waiting (checked every
    # trigger_poll_s). None: no such trigger.
    min_new_groups: int | None = Field(default=None, ge=1)
    trigger_poll_s: float = Field(default=60.0, gt=0)
    # The reward name of the webhook (rewards API `name`) that the learner trains on.
    reward_name: str = "reward"
    # Which reward trains: "webhook" (reward_name), "judge" (the judge's scores, see
    # JudgeSettings), or "webhook_else_judge": per group, the webhook rewards when every member
    # has one, else the judge's scores (never mixed within a group: the two are on different
    # scales, and GRPO compares members with each other). None: "webhook_else_judge" when the
    # policy has a judge in mode "missing", else "webhook".
    reward_source: Literal["webhook", "judge", "webhook_else_judge"] | None = None
    # Selection: rewarded, untrained trajectories whose last call is at most this old.
    max_age_s: float = Field(default=7 * 86400.0, gt=0)
    # A group with members still waiting for their reward is held back this long after its
    # last call, so that late rewards join their group instead of making it too small.
    reward_wait_s: float = Field(default=300.0, ge=0)
    max_trajectories: int = Field(default=4096, ge=1)
    min_group_size: int = Field(default=2, ge=2)
    # "grpo": (r - mean) / std within the group; "dr_grpo": r - mean (no std scaling).
    advantage: Literal["grpo", "dr_grpo"] = "grpo"
    # Groups with fewer rewarded members than min_group_size (a prompt that never repeats is a
    # group of one) train against a baseline from their task family's other recent rewards
    # (apprentice.grouping.task_family; learner/grpo/advantages.py family_advantages) instead of
    # waiting for members that never come. Never for the judge's scores (relative within a group).
    family_baseline: bool = True
    # How many of the family's most recent rewards (within max_age_s, trained or not) form the
    # baseline; at least min_group_size - 1 others are needed before a member trains.
    family_baseline_size: int = Field(default=64, ge=2)
    # Loss aggregation: "token" (all loss tokens of a step weigh the same, DAPO), "sequence"
    # (mean of each trajectory's token mean, original GRPO), "dr_grpo" (sum over tokens divided
    # by trajectories x the longest trajectory's token count: no length normalisation).
    aggregation: Literal["token", "sequence", "dr_grpo"] = "token"
    lr: float = Field(default=2e-5, gt=0)
    weight_decay: float = Field(default=0.0, ge=0)
    epochs: int = Field(default=1, ge=1)
    # Stop after this many optimizer steps in a run, whatever `epochs` says.
    max_steps: int | None = Field(default=None, ge=1)
    # Sequences per forward/backward pass, and passes per optimizer step: memory is bounded by
    # micro_batch_size x max_seq_len, the step covers micro_batch_size x grad_accumulation.
    micro_batch_size: int = Field(default=4, ge=1)
    grad_accumulation: int = Field(default=8, ge=1)
    max_grad_norm: float = Field(default=1.0, gt=0)
    eps_low: float = Field(default=0.2, ge=0)
    eps_high: float = Field(default=0.28, ge=0)
    # Truncated importance weight cap for stale data: min(pi_old / pi_behaviour, tis_cap).
    tis_cap: float = Field(default=2.0, gt=0)
    # Logprobs of the policy a run starts from, for data that policy sampled itself: "recorded"
    # takes the inference server's (one forward pass less; right when the server reports
    # log_softmax(logits / T), as `apprentice serve-model` and vLLM's processed_logprobs do),
    # "recompute" scores them with the trainer. Stale data is always scored.
    old_logprobs: Literal["recorded", "recompute"] = "recorded"
    # Weight of the k3 KL estimate to the base model (adapter disabled); 0 skips that pass.
    kl_beta: float = Field(default=0.0, ge=0)
    lora_rank: int = 8
    lora_alpha: float = 16.0
    lora_dropout: float = Field(default=0.0, ge=0, lt=1)
    lora_target_modules: list[str] = Field(default_factory=lambda: list(ALL_LINEAR_PROJECTIONS))
    # Defaults to <data_dir>/adapters/<policy>.
    adapters_dir: Path | None = None
    # Longer sequences are left out of training (and counted).
    max_seq_len: int = Field(default=4096, ge=16)
    # "auto": CUDA with bf16 when present, else CPU with fp32.
    device: str = "auto"
    dtype: str = "auto"
    seed: int = 0
    # Staleness bound: a run trains only on trajectories sampled by the lineage head or by its
    # ancestors at most this many versions back (the base model is the root). Older data, and
    # data of a rejected branch, is consumed without training. A live loop's version is one or
    # two optimizer steps, so 32 versions is a drift the truncated importance weights still
    # correct; the old bound of 4 threw away the promoted arm's half of the traffic from the
    # lineage's fifth version on (docs/learner.md, "Why 32").
    max_staleness: int = Field(default=32, ge=0)
    # torch intra-op threads for training. None: half the cores (at least 1), the other half
    # being the local inference server's (`apprentice serve-model` takes half by default).
    threads: int | None = Field(default=None, ge=1)
    # How the scheduler starts a run (docs/learner.md, "Several GPUs"): "in_process" (in the learner
    # process, the model kept between runs), "torchrun" (a child `torchrun --nproc-per-node
    # <processes>` on this machine) or "kubernetes" (a batch/v1 Job per run, see `kubernetes`).
    launcher: Literal["in_process", "torchrun", "kubernetes"] = "in_process"
    # Processes (one per GPU) of a torchrun or kubernetes run.
    processes: int = Field(default=1, ge=1)
    # Under torchrun: "ddp" (each GPU holds the model) or "fsdp" (FSDP2: weights sharded over the GPUs,
    # for models that do not fit one).
    distributed: Literal["ddp", "fsdp"] = "ddp"
    # Bounds every collective of a multi-process run: a rank that dies makes the others fail after this.
    distributed_timeout_s: float = Field(default=1800.0, gt=0)
    # Extra torchrun arguments (e.g. ["--nnodes", "2", "--rdzv-endpoint", "host:29400"]).
    torchrun_args: list[str] = Field(default_factory=list)
    kubernetes: KubernetesJobSettings | None = None
    # Exploration samples: extra unserved answers from the lineage head (ExplorationSettings).
    exploration: ExplorationSettings = Field(default_factory=lambda: ExplorationSettings())

    @model_validator(mode="after")
    def _launcher_needs(self) -> LearningSettings:
        if self.launcher == "kubernetes" and self.kubernetes is None:
            raise ValueError("launcher 'kubernetes' needs a `kubernetes` section (at least its image)")
        return self

    @field_validator("lora_rank")
    @classmethod
    def _vllm_rank(cls, value: int) -> int:
        if value not in VLLM_LORA_RANKS:
            raise ValueError(f"lora_rank must be one that vLLM accepts: {list(VLLM_LORA_RANKS)}")
        return value

    @field_validator("schedule")
    @classmethod
    def _schedule(cls, value: float | str | None) -> float | str | None:
        if isinstance(value, str):
            try:
                return float(value)
            except ValueError:
                pass
            if len(value.split()) != 5:
                raise ValueError("schedule must be seconds between runs or a 5-field cron string")
        elif value is not None and value <= 0:
            raise ValueError("schedule (seconds between runs) must be positive")
        return value


class RedactionRule(BaseModel):
    """An operator's own redaction rule: what `pattern` matches is stored as `<NAME_xxxxxx>`.

    A pattern with a capturing group replaces only the first group (e.g. `ticket=(\\w+)`).
    """

    model_config = ConfigDict(extra="forbid")

    # The placeholder's label: letters, digits and underscores (upper-cased in the placeholder).
    name: str = Field(pattern=r"^[A-Za-z][A-Za-z0-9_]{0,31}$")
    pattern: str
    ignore_case: bool = False

    @field_validator("pattern")
    @classmethod
    def _compiles(cls, value: str) -> str:
        # A bad pattern is a configuration error at start-up, not a failure on the first call.
        try:
            compiled = re.compile(value)
        except re.error as exc:
            raise ValueError(f"not a valid regular expression ({exc}): {value!r}") from None
        if compiled.match(""):
            raise ValueError(f"the pattern matches the empty string: {value!r}")
        return value


class RedactionKinds(BaseModel):
    """What is redacted from recorded calls (docs/privacy.md); a policy's section overrides the
    fields it sets, and its `rules` are added to the gateway's."""

    model_config = ConfigDict(extra="forbid")

    enabled: bool = True
    # The built-in kinds: email addresses; phone numbers (international +CC form and grouped
    # national forms); API keys and secrets (sk-..., Bearer tokens, AWS, GitHub, Slack, Google,
    # Stripe keys, JWTs, private key blocks, this gateway's own apk- keys); card numbers
    # (13-19 digits that pass the Luhn check).
    email: bool = True
    phone: bool = True
    secret: bool = True
    card: bool = True
    rules: list[RedactionRule] = Field(default_factory=list)


class RedactionSettings(RedactionKinds):
    """The gateway's redaction settings, and the key its placeholders are derived with."""

    # HMAC key of the placeholders (or "os.environ/NAME"). None: a random per-installation key
    # kept in the store. Give one that is not in the database so that a copy of the database
    # alone cannot test a guessed value against a placeholder.
    key: SecretStr | None = None


class JudgeBudget(BaseModel):
    """How much judging an hour may cost; over it, judging waits (metrics and admin API say so)."""

    model_config = ConfigDict(extra="forbid")

    calls_per_hour: int | None = Field(default=None, ge=1)
    tokens_per_hour: int | None = Field(default=None, ge=1)


class JudgeSettings(BaseModel):
    """An LLM judge that scores a policy's groups relative to each other (docs/judge.md).

    The judge reads the trajectories of one group side by side and answers one score in [0, 1]
    per trajectory; only the differences within a group matter to GRPO. Its calls go through the
    gateway as an ordinary client (recorded and billed like any call, never trained on).
    """

    model_config = ConfigDict(extra="forbid")

    # A model name the gateway routes: a model_list entry (hosted, through litellm or direct)
    # or a policy (one of our own endpoints).
    model: str
    # The rubric text; None: the general default (gateway/judging/rubric.py).
    rubric: str | None = None
    # "missing": groups in which some trajectory got no webhook reward within `wait_s`.
    # "always": every group (the scores stored under `reward_name`, beside the webhook's).
    mode: Literal["missing", "always"] = "missing"
    reward_name: str = "judge"
    # How long after a group's last call it is judged; None: the policy's learning.reward_wait_s.
    wait_s: float | None = Field(default=None, ge=0)
    # Larger groups are judged in chunks of at most this many trajectories.
    max_group_size: int = Field(default=8, ge=2)
    # Judge calls in flight for this policy, across every gateway process.
    concurrency: int = Field(default=2, ge=1)
    # Answers that fail validation are retried; after this many the group is recorded as not judged.
    max_attempts: int = Field(default=3, ge=1)
    temperature: float = Field(default=0.0, ge=0)
    max_tokens: int | None = Field(default=2048, ge=1)
    budget: JudgeBudget = Field(default_factory=JudgeBudget)
    # The gateway's OpenAI-compatible base URL the judge calls; None: this gateway's own address.
    base_url: str | None = None
    # A gateway API key for the judge's calls (or "os.environ/NAME"); needed when auth.mode is "keys".
    api_key: SecretStr | None = None
    timeout_s: float = Field(default=300.0, gt=0)
    # How often each gateway process looks for groups to judge.
    poll_interval_s: float = Field(default=10.0, gt=0)


class DistillationSettings(BaseModel):
    """Which of a teacher's rewarded trajectories a distillation (SFT) run trains on, and how.

    Selection (docs/distillation.md): `min_reward` keeps every trajectory whose reward is at
    least that; `top_share` keeps the best ceil(share x n) of each group, and only those above
    the group's lowest reward (a group whose answers all scored the same says nothing about
    which is better). Both set: both apply; at least one must be set.
    """

    model_config = ConfigDict(extra="forbid")

    min_reward: float | None = None
    top_share: float | None = Field(default=0.5, gt=0, le=1)
    # A distillation run starts only when at least this many selected trajectories wait.
    min_trajectories: int = Field(default=32, ge=1)
    # Supervised fine-tuning moves further per step than GRPO: its own rate and passes.
    lr: float = Field(default=1e-4, gt=0)
    epochs: int = Field(default=2, ge=1)
    max_steps: int | None = Field(default=None, ge=1)

    @model_validator(mode="after")
    def _some_selection(self) -> DistillationSettings:
        if self.min_reward is None and self.top_share is None:
            raise ValueError("distill: set min_reward, top_share or both (which teacher answers to learn)")
        return self


class TeacherSettings(BaseModel):
    """A hosted model (a `model_list` entry) that serves a policy's traffic until the policy takes over.

    While no version of the policy is promoted, the teacher answers the policy's calls (clients
    keep calling the policy's name) except the canary's share; the learner distils its best
    rewarded answers into the policy's LoRA (DistillationSettings). The canary then compares the
    policy with the teacher; the policy takes over (is promoted) when its reward is not worse
    than the teacher's by more than `takeover_margin` at the promotion's confidence, and, when
    both prices are known, it costs at most `max_cost_ratio` of the teacher per call (and, when
    set, its median latency is at most `max_latency_ratio` of the teacher's).
    """

    model_config = ConfigDict(extra="forbid")

    model: str
    # After takeover the teacher answers the calls the policy's endpoints fail (a fallback).
    fallback: bool = True
    takeover_margin: float = Field(default=0.05, ge=0)
    max_cost_ratio: float | None = Field(default=1.0, gt=0)
    max_latency_ratio: float | None = Field(default=None, gt=0)
    distill: DistillationSettings = Field(default_factory=DistillationSettings)


class RewardFunctionSettings(BaseModel):
    """A scorer the operator provides for trajectories no client rewarded (docs/reward-functions.md).

    Either an HTTP endpoint (`url`: the conversation and the answer POSTed as JSON, signed like
    the gateway's reward webhooks with `secret`, a `{"score": number}` back within `timeout_s`)
    or a Python entry point (`entry_point`: "module:function", called with the same JSON object,
    returning a number). The gateway scores each trajectory of the policy that has no current
    reward named `name` `wait_s` after its last call, and stores the score as a reward named
    `name` with source "function" (idempotent per trajectory). Only `name` is compared within a
    group: a function that produces the learner's `reward_name` must score on the webhook's scale.
    """

    model_config = ConfigDict(extra="forbid")

    name: str
    url: str | None = None
    entry_point: str | None = None
    # The HMAC key the request is signed with (or "os.environ/NAME"); None: unsigned.
    secret: SecretStr | None = None
    timeout_s: float = Field(default=30.0, gt=0)
    # At most this many scorings an hour for this policy, across every gateway process.
    max_calls_per_hour: int = Field(default=3600, ge=1)
    # A trajectory is scored this long after its last call at the earliest: time for a webhook.
    wait_s: float = Field(default=10.0, ge=0)
    # Scorings in flight per gateway process.
    concurrency: int = Field(default=4, ge=1)
    # A scoring that fails is tried again this many times in all, then left alone.
    max_attempts: int = Field(default=3, ge=1)
    poll_interval_s: float = Field(default=2.0, gt=0)

    @model_validator(mode="after")
    def _one_kind(self) -> RewardFunctionSettings:
        if (self.url is None) == (self.entry_point is None):
            raise ValueError(f"reward function {self.name!r}: set exactly one of url and entry_point")
        if self.entry_point is not None and ":" not in self.entry_point:
            raise ValueError(f"reward function {self.name!r}: entry_point must be 'module:function'")
        return self


class EvaluationRewardFunctionSettings(BaseModel):
    """An operator's scoring endpoint for evaluation items (docs/evaluation-sets.md): POSTed
    {conversation, answer, ...}, answers {"score": number}; each request is signed like a reward
    webhook (Apprentice-Signature, with the named `rewards.webhook_secrets` entry)."""

    model_config = ConfigDict(extra="forbid")

    url: str
    # The name of a rewards.webhook_secrets entry to sign with; None: unsigned.
    secret: str | None = None
    timeout_s: float = Field(default=30.0, gt=0)


class EvaluationSettings(BaseModel):
    """How a policy's versions are scored on its evaluation sets (`apprentice eval`, the gate)."""

    model_config = ConfigDict(extra="forbid")

    # Reward functions items may name (`{"method": "reward_function", "name": ...}`).
    reward_functions: dict[str, EvaluationRewardFunctionSettings] = Field(default_factory=dict)
    # Each answer: greedy, at most this many tokens, within timeout_s.
    max_tokens: int = Field(default=512, ge=1)
    timeout_s: float = Field(default=120.0, gt=0)
    # Items answered and scored at once.
    concurrency: int = Field(default=4, ge=1)


class PolicySettings(BaseModel):
    """A model name that clients call and Apprentice trains: a base model and its endpoints."""

    model_config = ConfigDict(extra="forbid")

    name: str
    base_model: str
    # OpenAI-compatible inference endpoints (vLLM or `apprentice serve-model`), e.g.
    # "http://127.0.0.1:8001/v1"; the gateway sends the policy's calls to them. An entry
    # "dns+http://NAME:PORT/PATH" (a Kubernetes headless service) stands for one endpoint per
    # address NAME resolves to, refreshed every endpoint_discovery.refresh_s (apprentice/discovery).
    endpoints: list[str] = Field(default_factory=list)
    api_key: SecretStr | None = None
    timeout: float = 600.0
    # When set, the gateway enforces this sampling temperature on the policy's calls:
    # GRPO needs variety within a group.
    temperature: float | None = None
    # Ask the endpoints for sampled-token logprobs and exact token ids on every call (removed
    # from answers whose client did not ask for them): the learner trains on them.
    record_tokens: bool = True
    # False: the policy's calls are recorded (observability) but its trajectories are never
    # trained on or judged (trajectories.trainable = false).
    record_for_training: bool = True
    # Redaction of what is stored for this policy's calls; fields set here override the
    # gateway's `redaction` (its rules are added to the gateway's). None: the gateway's.
    redaction: RedactionKinds | None = None
    reward_range: tuple[float, float] | None = None
    metrics: list[str] | None = None
    # The learner: GRPO on LoRA from this policy's rewarded trajectories.
    learning: LearningSettings = Field(default_factory=LearningSettings)
    # Promotion of its adapters: gates, canary, evaluation, retention (apprentice/promotion).
    promotion: PromotionSettings = Field(default_factory=PromotionSettings)
    # Scoring on evaluation sets: reward functions, answer length (docs/evaluation-sets.md).
    evaluation: EvaluationSettings = Field(default_factory=EvaluationSettings)
    # An LLM judge for groups without (or beside) webhook rewards; None: no judging.
    judge: JudgeSettings | None = None
    # Scorers the operator runs for trajectories without a reward (RewardFunctionSettings).
    reward_functions: list[RewardFunctionSettings] = Field(default_factory=list)
    # A hosted model that serves the policy's traffic until the policy takes over, and whose best
    # rewarded answers the policy is distilled from (docs/distillation.md); None: no teacher.
    teacher: TeacherSettings | None = None
    # The policy's own prices, as LiteLLM's model_info names them (input_cost_per_token,
    # output_cost_per_token): the takeover compares them with the teacher's. Empty: unknown.
    model_info: dict[str, Any] = Field(default_factory=dict)

    @property
    def reward_source(self) -> Literal["webhook", "judge", "webhook_else_judge"]:
        """The reward the learner trains on (LearningSettings.reward_source, its default resolved)."""
        if self.learning.reward_source is not None:
            return self.learning.reward_source
        if self.judge is not None and self.judge.mode == "missing":
            return "webhook_else_judge"
        return "webhook"

    @property
    def judge_wait_s(self) -> float:
        """How long after a group's last call the judge may judge it."""
        if self.judge is not None and self.judge.wait_s is not None:
            return self.judge.wait_s
        return self.learning.reward_wait_s

    @field_validator("endpoints")
    @classmethod
    def _strip_endpoints(cls, value: list[str]) -> list[str]:
        try:
            for endpoint in value:
                parse_entry(endpoint)  # a dns+ entry that cannot be resolved as written fails here
        except EntryError as exc:
            raise ConfigError(str(exc)) from None
        return [endpoint.strip().rstrip("/") for endpoint in value]


class EndpointDiscoverySettings(BaseModel):
    """How `dns+http://` endpoint entries are resolved (apprentice/discovery)."""

    model_config = ConfigDict(extra="forbid")

    # Each name is looked up again this often by every gateway process and the promotion job.
    refresh_s: float = Field(default=10.0, gt=0)
    # One lookup (A and AAAA together) gives up after this long; the last known set is kept.
    timeout_s: float = Field(default=2.0, gt=0)
    # "10.0.0.10", "10.0.0.10:5353", "[fd00::10]:53"; empty: the system's /etc/resolv.conf.
    nameservers: list[str] = Field(default_factory=list)

    @field_validator("nameservers")
    @classmethod
    def _check_nameservers(cls, value: list[str]) -> list[str]:
        try:
            for nameserver in value:
                parse_nameserver(nameserver)
        except EntryError as exc:
            raise ConfigError(str(exc)) from None
        return value


class AuthSettings(BaseModel):
    # "keys": every /v1 call needs a gateway API key. "open": no key, for local use only.
    mode: Literal["keys", "open"] = "keys"
    # The admin key, or "os.environ/NAME". Compared in constant time, never logged.
    admin_key: SecretStr | None = None
    open_tenant: str = "local"
    key_cache_ttl_s: float = 30.0


class JournalSettings(BaseModel):
    # Defaults to <data_dir>/journal.
    dir: Path | None = None
    segment_max_bytes: int = 64 * 1024 * 1024
    segment_max_age_s: float = 60.0
    ship_interval_s: float = 0.2
    ship_batch_rows: int = 2000
    # fsync each write: survives power loss, not only a crash of the process. Costs latency.
    fsync: bool = False


def _refuse_boolean(value: Any) -> Any:
    """JSON's true and false are not numbers, but pydantic's lax mode reads them as 1 and 0: a
    `"requests_per_minute": true` was stored as a limit of 1 a minute."""
    if isinstance(value, bool):
        raise ValueError("a number is required, not true or false")
    return value


# A number the API or a config file stores (a limit, a bound, a version number): never a boolean.
NotBoolean = BeforeValidator(_refuse_boolean)

MAX_REQUESTS_PER_MINUTE = 1_000_000_000
MAX_TOKENS_PER_MINUTE = 1_000_000_000_000
MAX_BUDGET_USD = 1_000_000_000.0


class RateLimits(BaseModel):
    """One scope's limits (a key or a tenant); None: no limit of that kind (docs/limits.md).

    A key's own overrides (`api_keys.limits`, set with `apprentice keys limits` or
    `PUT /admin/keys/{id}/limits`) have the same fields; a field absent there falls back to
    `limits.key`, and an explicit null there lifts that limit for the key.
    """

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    # Each has an upper bound: a key's limits are stored as JSON and read back by every gateway,
    # so a number no reader can hold (past 64 bits) must never be stored. The bounds are far
    # above any real limit; the OpenAPI document states them (maximum).
    requests_per_minute: Annotated[int | None, NotBoolean] = Field(default=None, ge=1, le=MAX_REQUESTS_PER_MINUTE)
    # Prompt and completion tokens; a call reserves body bytes / 4 before it, the upstream's
    # usage replaces the estimate after it.
    tokens_per_minute: Annotated[int | None, NotBoolean] = Field(default=None, ge=1, le=MAX_TOKENS_PER_MINUTE)
    # US dollars per `LimitSettings.budget_window_s`, from the upstream's prices (`model_info`'s
    # input_cost_per_token / output_cost_per_token, else litellm's local cost map).
    budget_usd: Annotated[float | None, NotBoolean] = Field(default=None, gt=0, le=MAX_BUDGET_USD)

    @property
    def any(self) -> bool:
        return self.requests_per_minute is not None or self.tokens_per_minute is not None or self.budget_usd is not None


class LimitSettings(BaseModel):
    """Body size, and per-key and per-tenant rate limits and budgets (docs/limits.md)."""

    model_config = ConfigDict(extra="forbid")

    max_body_bytes: int = 16 * 1024 * 1024
    # Every key's limits unless the key has its own (api_keys.limits).
    key: RateLimits = Field(default_factory=RateLimits)
    # Each tenant's limits (all its keys together), by tenant name; tenants not listed get
    # `tenant_default`.
    tenants: dict[str, RateLimits] = Field(default_factory=dict)
    tenant_default: RateLimits = Field(default_factory=RateLimits)
    # Spend budgets count over fixed windows of this many seconds, aligned to the epoch (86400:
    # UTC days); longer than the one-minute windows of the rates.
    budget_window_s: int = Field(default=86400, ge=120)
    # How often each gateway process exchanges its counts with the others through PostgreSQL.
    # The limits hold within (processes - 1) x (one process's admission rate) x 2 x this.
    sync_interval_s: float = Field(default=1.0, gt=0)

    def for_tenant(self, tenant: str) -> RateLimits:
        return self.tenants.get(tenant, self.tenant_default)


class StitchSettings(BaseModel):
    # A trajectory stays open for stitching this long after its last call.
    open_window_s: float = 6 * 3600.0
    max_open_trajectories: int = 200_000
    # A trajectory that reaches this many calls, or this many prompt + completion tokens, is
    # closed: the run's next call starts a new trajectory (docs/limits.md). None: no cap.
    max_calls_per_trajectory: int | None = Field(default=1000, ge=1)
    max_tokens_per_trajectory: int | None = Field(default=2_000_000, ge=1)
    # While a canary serves, a call that continues a run another process served waits up to this
    # long for that run's call to be stored (shipped at once under a canary), to stay on the
    # run's version (gateway/trajectories/parents.py); raise it where the store is slow to take a
    # ship. A prompt with assistant turns no gateway served (few-shot examples) waits all of it.
    parent_wait_margin_s: float = Field(default=0.3, ge=0, le=30)


class WebhookSecret(BaseModel):
    """A signing secret for reward webhooks; rewards signed with it belong to `tenant`."""

    model_config = ConfigDict(extra="forbid")

    # Or "os.environ/NAME". Several secrets may share a tenant (rotation: add the new one,
    # move the sender over, remove the old one).
    secret: SecretStr
    tenant: str
    name: str = "default"


class RewardSettings(BaseModel):
    """POST /v1/rewards: signed webhooks, batches and pending rewards."""

    model_config = ConfigDict(extra="forbid")

    webhook_secrets: list[WebhookSecret] = Field(default_factory=list)
    # A signature's timestamp may be this far from the gateway's clock (Stripe uses 300 s).
    tolerance_s: float = 300.0
    # A reward whose trajectory is still unknown after this long is reported as overdue
    # (GET /v1/rewards/pending); it is kept and still links if the trajectory lands.
    pending_window_s: float = 3600.0
    # A pending reward whose trajectory never lands is deleted this long after it arrived (its
    # answer says when: `expires_at`), and a tenant may hold at most max_pending_per_tenant of
    # them: a batch that would exceed it is refused with a 429, so no key can fill the store.
    pending_expiry_s: float = Field(default=7 * 86400.0, gt=0)
    max_pending_per_tenant: int = Field(default=100_000, ge=1)
    max_batch: int = Field(default=1000, ge=1)
    max_comment_chars: int = 4096


class HistorySettings(BaseModel):
    """The partitioned `calls` table (docs/history.md): partitions made ahead, old ones dropped."""

    model_config = ConfigDict(extra="forbid")

    # Width of each new partition of `calls`: at 1,000 calls/s a day is 86 million rows, a week
    # 600 million; a day keeps each partition's indexes and retention's unit small.
    partition_interval: Literal["day", "week"] = "day"
    # Partitions exist this far past now, so a call never waits on DDL.
    create_ahead_days: int = Field(default=7, ge=1, le=366)
    # Partitions wholly older than this are dropped (rows still needed are kept, docs/history.md);
    # None: the history is kept for ever.
    retention_days: float | None = Field(default=None, gt=0)
    # How often a gateway process runs the maintenance (one process at a time does the work).
    maintenance_interval_s: float = Field(default=3600.0, gt=0)
    # DDL waits at most this long for its lock; a busy table is tried again at the next pass.
    lock_timeout_s: float = Field(default=5.0, gt=0)


class LocalModelServerSettings(BaseModel):
    """A local inference server (`apprentice serve-model`) that `apprentice up` starts and
    stops with the rest; policies reach it at `url` like any other endpoint."""

    model_config = ConfigDict(extra="forbid")

    model: str = "HuggingFaceTB/SmolLM2-135M-Instruct"
    host: str = "127.0.0.1"
    port: int = 8001
    # The first start fetches and converts the default model: minutes on a slow link.
    start_timeout_s: float = 900.0

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}/v1"


class TracingSettings(BaseModel):
    """OpenTelemetry traces of the gateway's calls and rewards (docs/tracing.md).

    Present: each call journaled by the gateway becomes a span (GenAI semantic conventions)
    exported over OTLP/HTTP (protobuf) off the hot path, through a bounded queue that drops (and
    counts, `apprentice_tracing_dropped_total`) rather than slow a call. Needs the `tracing` extra
    (`pip install 'apprentice[tracing]'`); without this section the gateway never imports it.
    """

    model_config = ConfigDict(extra="forbid")

    # The collector's OTLP/HTTP base URL (http://collector:4318; /v1/traces is appended) or its
    # full traces URL (ending in /v1/traces). None: $OTEL_EXPORTER_OTLP_TRACES_ENDPOINT (as is),
    # else $OTEL_EXPORTER_OTLP_ENDPOINT (+ /v1/traces), else an error at start.
    otlp_endpoint: str | None = None
    # Sent with every export (e.g. an API key of a hosted backend); values may be
    # "os.environ/NAME", read at start and never logged. Empty: $OTEL_EXPORTER_OTLP_HEADERS applies.
    headers: dict[str, SecretStr] = Field(default_factory=dict)
    service_name: str = "apprentice-gateway"
    # Calls and rewards waiting for export; past it new ones are dropped (and counted).
    queue_size: int = Field(default=10_000, ge=1)
    # Spans per export request; a full batch is sent at once, a partial one every interval.
    batch_size: int = Field(default=512, ge=1)
    export_interval_s: float = Field(default=1.0, gt=0)
    # One export request, its retries included (the exporter retries transient failures).
    export_timeout_s: float = Field(default=10.0, gt=0)
    # At shutdown, what is still queued is exported for at most this long.
    shutdown_timeout_s: float = Field(default=5.0, ge=0)
    # Export the messages and answers too (as the GenAI conventions' inference-details event).
    # Off by default: prompts and answers often hold personal data.
    include_content: bool = False

    def traces_endpoint(self) -> str:
        """The URL spans are posted to, from the setting or the standard OTEL_* variables."""
        if self.otlp_endpoint:
            base = self.otlp_endpoint.rstrip("/")
            return base if base.endswith("/v1/traces") else base + "/v1/traces"
        if os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"):
            return os.environ["OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"]
        if os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT"):
            return os.environ["OTEL_EXPORTER_OTLP_ENDPOINT"].rstrip("/") + "/v1/traces"
        raise ConfigError(
            "tracing: no OTLP endpoint: set tracing.otlp_endpoint (e.g. http://collector:4318) or "
            "OTEL_EXPORTER_OTLP_ENDPOINT"
        )


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="APPRENTICE_", env_nested_delimiter="__", extra="ignore")

    database_url: str | None = None
    data_dir: Path = Path(".apprentice")
    host: str = "127.0.0.1"
    port: int = 8000
    workers: int = 1
    log_level: str = "info"

    auth: AuthSettings = Field(default_factory=AuthSettings)
    journal: JournalSettings = Field(default_factory=JournalSettings)
    limits: LimitSettings = Field(default_factory=LimitSettings)
    stitching: StitchSettings = Field(default_factory=StitchSettings)
    rewards: RewardSettings = Field(default_factory=RewardSettings)
    history: HistorySettings = Field(default_factory=HistorySettings)

    model_list: list[ModelEntry] = Field(default_factory=list)
    router_settings: RouterSettings = Field(default_factory=RouterSettings)
    policies: list[PolicySettings] = Field(default_factory=list)
    # Started by `apprentice up` beside the gateway and the learner (none by default).
    local_model_server: LocalModelServerSettings | None = None
    # How often each gateway process reads which adapter versions serve the policies.
    adapter_poll_interval_s: float = 1.0
    # Resolving endpoints given as a DNS name (dns+http://NAME:PORT/PATH in a policy's endpoints).
    endpoint_discovery: EndpointDiscoverySettings = Field(default_factory=EndpointDiscoverySettings)
    # model_name of the deployment that receives endpoints other than chat completions
    # (embeddings, moderations, ...); defaults to the first entry of model_list.
    default_upstream: str | None = None
    # OpenTelemetry traces of calls and rewards (docs/tracing.md); None: no tracing.
    tracing: TracingSettings | None = None
    # Redaction of e-mail addresses, phone numbers, secrets, card numbers and the operator's own
    # patterns from every recorded call (docs/privacy.md).
    redaction: RedactionSettings = Field(default_factory=RedactionSettings)

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # Environment beats the YAML file, which arrives as init kwargs (see load_settings).
        return (env_settings, init_settings)

    @model_validator(mode="after")
    def _check(self) -> Settings:
        if self.database_url is None and os.environ.get("DATABASE_URL"):
            self.database_url = os.environ["DATABASE_URL"]
        names = [p.name for p in self.policies]
        if len(names) != len(set(names)):
            raise ConfigError("policies: each policy name must be unique")
        deployments = {m.model_name for m in self.model_list}
        for policy in self.policies:
            if not policy.endpoints and policy.name not in deployments:
                raise ConfigError(f"policy {policy.name!r} has no endpoints and no model_list entry of that name")
        for policy in self.policies:
            self._check_judge(policy, deployments | set(names))
            if policy.teacher is not None and policy.teacher.model not in deployments:
                raise ConfigError(
                    f"policy {policy.name!r}: teacher.model {policy.teacher.model!r} is not a model_list entry"
                )
        if self.default_upstream and self.default_upstream not in deployments:
            raise ConfigError(f"default_upstream {self.default_upstream!r} is not in model_list")
        return self

    def _check_judge(self, policy: PolicySettings, routable: set[str]) -> None:
        judge = policy.judge
        if judge is None:
            if policy.learning.reward_source in ("judge", "webhook_else_judge"):
                raise ConfigError(
                    f"policy {policy.name!r}: learning.reward_source {policy.learning.reward_source!r} needs a judge"
                )
            return
        if judge.model not in routable:
            raise ConfigError(
                f"policy {policy.name!r}: judge.model {judge.model!r} is neither a model_list entry nor a policy"
            )
        if self.auth.mode == "keys" and judge.api_key is None:
            raise ConfigError(
                f"policy {policy.name!r}: judge.api_key (a gateway API key for the judge's calls) is needed "
                "when auth.mode is 'keys'"
            )
        if judge.reward_name == policy.learning.reward_name:
            raise ConfigError(
                f"policy {policy.name!r}: judge.reward_name must differ from learning.reward_name "
                f"({judge.reward_name!r}): the two rewards are compared, never mixed"
            )

    @property
    def journal_dir(self) -> Path:
        return self.journal.dir or self.data_dir / "journal"

    def policy(self, name: str) -> PolicySettings | None:
        for policy in self.policies:
            if policy.name == name:
                return policy
        return None


def load_settings(path: str | os.PathLike[str] | None = None, **overrides: Any) -> Settings:
    """Read the YAML file (argument, else $APPRENTICE_CONFIG, else none) and the environment."""
    path = path or os.environ.get("APPRENTICE_CONFIG")
    data: dict[str, Any] = {}
    if path:
        config_path = Path(path)
        if not config_path.exists():
            raise ConfigError(f"config file {config_path} does not exist")
        loaded = yaml.safe_load(config_path.read_text()) or {}
        if not isinstance(loaded, dict):
            raise ConfigError(f"config file {config_path} must hold a mapping at the top level")
        data.update(loaded)
    data.update({k: v for k, v in overrides.items() if v is not None})
    return Settings(**data)


def gateway_base_url(settings: Settings, judge: JudgeSettings) -> str:
    """The OpenAI base URL the judge's calls go to: judge.base_url, else this gateway's own
    address (a wildcard bind is reached on loopback). The gateway's judge and the evaluation
    sets' judge scoring (apprentice/evalsets/scoring.py) both call it."""
    if judge.base_url:
        return judge.base_url.rstrip("/")
    host = settings.host if settings.host not in ("0.0.0.0", "::", "") else "127.0.0.1"
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    return f"http://{host}:{settings.port}/v1"
