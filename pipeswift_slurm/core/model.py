"""Frozen domain types shared by every layer: Megatron job shape and plan, execution
configs, Slurm-side jobs and nodes, the cluster view a policy sees, and decisions.

This module owns no behaviour beyond trivial derived properties. It must not import
anything outside the standard library (no SQLAlchemy, no Slurm, no torch).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import cached_property, total_ordering
from typing import Optional

# Slurm job states, spelled as Slurm spells them.
PENDING = "PENDING"
RUNNING = "RUNNING"
COMPLETED = "COMPLETED"
CANCELLED = "CANCELLED"
FAILED = "FAILED"
TIMEOUT = "TIMEOUT"
FINISHED_STATES = frozenset({COMPLETED, CANCELLED, FAILED, TIMEOUT, "NODE_FAIL", "PREEMPTED",
                             "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE"})

PRECISIONS = ("bf16", "fp16", "fp32")
RECOMPUTE_GRANULARITIES = (None, "selective", "full")


@dataclass(frozen=True)
class ModelShape:
    """A dense GPT-style transformer as Megatron-LM describes it.

    ``ffn_hidden_size`` and ``kv_channels`` are the resolved values (Megatron's defaults
    applied by the parser): ffn = 4h, or int(8h/3/64)*64 with SwiGLU; kv = h/a.
    ``num_query_groups`` equals ``num_attention_heads`` for plain multi-head attention.
    ``vocab_size`` is the tokenizer's size before Megatron pads it.
    """

    num_layers: int
    hidden_size: int
    num_attention_heads: int
    seq_length: int
    ffn_hidden_size: int
    kv_channels: int
    num_query_groups: int
    vocab_size: int = 50257
    swiglu: bool = False
    max_position_embeddings: int = 0
    make_vocab_size_divisible_by: int = 128

    def padded_vocab_size(self, tp: int) -> int:
        """Vocab padded to a multiple of make_vocab_size_divisible_by * tp (Megatron's rule)."""
        multiple = self.make_vocab_size_divisible_by * tp
        return -(-self.vocab_size // multiple) * multiple

    @cached_property
    def params_per_layer(self) -> int:
        """Weights of one transformer layer (attention + MLP + two norms, with biases ignored)."""
        h = self.hidden_size
        q = self.kv_channels * self.num_attention_heads
        kv = 2 * self.kv_channels * self.num_query_groups
        attn = h * (q + kv) + q * h
        mlp = h * self.ffn_hidden_size * (3 if self.swiglu else 2)
        return attn + mlp + 2 * h

    @cached_property
    def num_params(self) -> int:
        """Total weights with untied input and output embeddings (as PP>1 requires)."""
        return (self.num_layers * self.params_per_layer
                + 2 * self.padded_vocab_size(1) * self.hidden_size + self.hidden_size)


@dataclass(frozen=True)
class TrainingPlan:
    """What the user asked to train: fixed regardless of how the job is laid out.

    Exactly one of ``train_iters`` / ``train_samples`` is set (Megatron's rule).
    ``rampup_batch_size`` is (start, increment, ramp-up samples) or None.
    ``save_interval`` is the iterations between checkpoints when the job both saves and
    loads them (``--save``, ``--load``, ``--save-interval``), so that a requeued job
    resumes; None when a requeue would start it over.
    ``embedding_in_pipeline_split`` / ``loss_in_pipeline_split`` are Megatron's
    ``--account-for-embedding-in-pipeline-split`` / ``--account-for-loss-in-pipeline-split``:
    the input embedding (loss) counts as one layer when the layers are split over the
    pipeline stages; the planner keeps the user's choice. ``overlap_grad_reduce``,
    ``overlap_param_gather``, ``tp_comm_overlap``: Megatron's overlap flags of those names.
    """

    global_batch_size: int
    train_iters: Optional[int] = None
    train_samples: Optional[int] = None
    rampup_batch_size: Optional[tuple[int, int, int]] = None
    precision: str = "bf16"
    use_distributed_optimizer: bool = False
    recompute_granularity: Optional[str] = None
    sequence_parallel: bool = False
    save_interval: Optional[int] = None
    embedding_in_pipeline_split: bool = False
    loss_in_pipeline_split: bool = False
    overlap_grad_reduce: bool = False
    overlap_param_gather: bool = False
    tp_comm_overlap: bool = False

    @property
    def iterations(self) -> int:
        """Training iterations: train_iters, or train_samples / global batch (rounded up)."""
        if self.train_iters is not None:
            return self.train_iters
        if self.train_samples is not None:
            return -(-self.train_samples // self.global_batch_size)
        return 0


@total_ordering
@dataclass(frozen=True)
class ExecConfig:
    """How a job runs: placement and Megatron parallel layout.

    Field names map once to Megatron: tp = tensor_model_parallel_size,
    pp = pipeline_model_parallel_size, cp = context_parallel_size, dp = data-parallel size
    (derived by Megatron as world / (tp*pp*cp)), vp = virtual pipeline stages per rank
    (1 = not interleaved), micro_batch_size, num_micro_batches = global batch /
    (micro_batch_size * dp). ``num_nodes * gpus_per_node`` is the world size.
    ``decoder_first/last_pipeline_num_layers`` describe an uneven split (None = even).
    Configs order field by field, an even split (None) before any uneven one.
    """

    tp: int
    pp: int
    dp: int
    micro_batch_size: int
    num_micro_batches: int
    cp: int = 1
    vp: int = 1
    num_nodes: int = 1
    gpus_per_node: int = 0
    decoder_first_pipeline_num_layers: Optional[int] = None
    decoder_last_pipeline_num_layers: Optional[int] = None

    def _order(self) -> tuple[int, ...]:
        return (self.tp, self.pp, self.dp, self.micro_batch_size, self.num_micro_batches, self.cp, self.vp,
                self.num_nodes, self.gpus_per_node, -1 if self.decoder_first_pipeline_num_layers is None
                else self.decoder_first_pipeline_num_layers, -1 if self.decoder_last_pipeline_num_layers is None
                else self.decoder_last_pipeline_num_layers)

    def __lt__(self, other: object) -> bool:
        if not isinstance(other, ExecConfig):
            return NotImplemented
        return self._order() < other._order()

    @property
    def world_size(self) -> int:
        return self.tp * self.pp * self.cp * self.dp

    @property
    def gpus(self) -> int:
        return self.world_size

    def short(self) -> str:
        """Compact human form, e.g. ``8gpu=1x8 tp2 pp4 dp1 mbs2 M16``."""
        text = (f"{self.gpus}gpu={self.num_nodes}x{self.gpus_per_node} tp{self.tp} pp{self.pp}"
                f" dp{self.dp} mbs{self.micro_batch_size} M{self.num_micro_batches}")
        if self.cp > 1:
            text += f" cp{self.cp}"
        if self.vp > 1:
            text += f" vp{self.vp}"
        return text


@dataclass(frozen=True)
class JobProfile:
    """Everything the planner needs to know about one Megatron training job.

    ``requested`` is the user's own configuration. ``min_gpus``..``max_gpus`` is the
    range the user allows the scheduler to choose from (equal bounds: rigid job);
    ``allowed_pp`` optionally restricts pipeline sizes. ``job_class`` keys calibration.
    ``run_time_factor`` scales every predicted run time of this one job: the controller
    raises it by its user's correction (users whose jobs ran longer than claimed) and
    lowers it so that the prediction at the job's own size stays within the job's own
    time limit (a claim cannot outlast what Slurm lets the job run). ``partitions`` are
    the partitions the request allows beside the job's own (a request, checked by the
    controller against those it manages). ``known_layouts_only``: the planner keeps the
    user's layout or one the site measured (the controller's ``layout_fit.exploration_holds``).
    """

    shape: ModelShape
    plan: TrainingPlan
    requested: ExecConfig
    min_micro_batch_size: int = 1
    max_micro_batch_size: Optional[int] = None
    min_gpus: int = 0
    max_gpus: int = 0
    allowed_pp: Optional[tuple[int, ...]] = None
    job_class: str = ""
    run_time_factor: float = 1.0
    partitions: tuple[str, ...] = ()
    known_layouts_only: bool = False

    @property
    def flexible(self) -> bool:
        return self.max_gpus > self.min_gpus

    @property
    def gpu_range(self) -> tuple[int, int]:
        lo = self.min_gpus or self.requested.gpus
        hi = self.max_gpus or self.requested.gpus
        return lo, hi

    def with_range(self, min_gpus: int, max_gpus: int) -> "JobProfile":
        return replace(self, min_gpus=min_gpus, max_gpus=max_gpus)


@dataclass(frozen=True)
class SiteCaps:
    """The site's per-job limits that hold for one job (None: no limit): the least of its
    partition's MaxTime/MaxNodes, its QOS's and its association's MaxWall and MaxTRES
    (``gres/gpu``, ``node``). Slurm exempts values an admin sets from these checks, so
    the controller must keep within them itself."""

    max_time_s: Optional[int] = None
    max_gpus: Optional[int] = None
    max_nodes: Optional[int] = None

    def tighter(self, other: "SiteCaps") -> "SiteCaps":
        """The least of both, limit by limit."""
        def least(a: Optional[int], b: Optional[int]) -> Optional[int]:
            return b if a is None else a if b is None else min(a, b)
        return SiteCaps(least(self.max_time_s, other.max_time_s), least(self.max_gpus, other.max_gpus),
                        least(self.max_nodes, other.max_nodes))


@dataclass(frozen=True)
class GpuRequest:
    """How a Slurm job spelled its GPU request, kept so an update uses the same form
    (22.05 rejects switching between typed and untyped GRES).

    ``field`` is "tres_per_node" (``--gpus-per-node``/``--gres``) or "tres_per_job"
    (``--gpus``); ``count`` is per node or per job accordingly; ``slash`` records the
    ``gres/gpu`` spelling (24.11+) instead of ``gres:gpu``.
    """

    field: str = "tres_per_node"
    count: int = 0
    gpu_type: Optional[str] = None
    slash: bool = False


_USABLE_STATES = frozenset({"IDLE", "MIXED", "ALLOCATED", "COMPLETING", "idle", "mixed", "allocated"})
_UNUSABLE_WORDS = ("DOWN", "DRAIN", "FAIL", "INVAL", "NOT_RESPONDING", "UNKNOWN", "MAINT", "FUTURE")


@dataclass(frozen=True)
class Node:
    """A compute node: GPUs configured and allocated, and whether it takes work."""

    name: str
    gpus: int
    gpus_alloc: int = 0
    state: str = "IDLE"
    gpu_type: str = ""
    partitions: tuple[str, ...] = ()
    # Worked out from the above when the node is made (policies read every node's free
    # GPUs on every tick): whether it takes work (not down, drained, failed, ...), and
    # its GPUs free for new work (0 when it takes none).
    usable: bool = field(init=False, repr=False, compare=False)
    gpus_free: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        state = self.state
        usable = state in _USABLE_STATES or not any(word in state.upper() for word in _UNUSABLE_WORDS)
        object.__setattr__(self, "usable", usable)
        object.__setattr__(self, "gpus_free", max(0, self.gpus - self.gpus_alloc) if usable else 0)


@dataclass(frozen=True)
class Job:
    """A Slurm job as a backend observed it. Times are epoch (or simulated) seconds.

    ``gpus`` is the total GPU count requested (pending) or allocated (running).
    ``comment`` is user-editable text (where psbatch puts the profile: a request, never
    a fact); ``admin_comment`` only an admin can write (where the decision token lives).
    ``config`` is the configuration the job runs or will run with, as last decided.
    ``attained_gpu_s`` counts GPU-seconds of earlier runs before a requeue, ``ran_s`` their
    wall-clock seconds (the two differ in ratio when a requeue changed the job's size).
    With ``ran_s``, ``submit_time`` and ``eligible_time`` are the first submission's (live
    Slurm restarts them at a requeue; the controller puts them back from its history), so
    ``queued_s`` is the whole wait. ``caps``: the site's limits for this job, as read.
    """

    job_id: int
    state: str
    submit_time: float
    num_nodes: int = 1
    gpus: int = 0
    priority: int = 0
    user: str = ""
    name: str = ""
    partition: str = ""
    state_reason: str = ""
    eligible_time: Optional[float] = None
    start_time: Optional[float] = None
    end_time: Optional[float] = None
    time_limit_s: Optional[int] = None
    site_factor: int = 0
    opted_in: bool = False
    comment: str = ""
    admin_comment: str = ""
    node_list: tuple[str, ...] = ()
    gpu_request: GpuRequest = field(default_factory=GpuRequest)
    config: Optional[ExecConfig] = None
    attained_gpu_s: float = 0.0
    restarts: int = 0
    ran_s: float = 0.0
    account: str = ""
    qos: str = ""
    caps: SiteCaps = field(default_factory=SiteCaps)

    @property
    def pending(self) -> bool:
        return self.state == PENDING

    @property
    def running(self) -> bool:
        return self.state == RUNNING

    @property
    def held(self) -> bool:
        return self.state_reason.startswith("JobHeld")

    def wait_s(self, now: float) -> float:
        """Seconds spent queued: until start, or until ``now`` while pending."""
        begin = self.eligible_time if self.eligible_time is not None else self.submit_time
        end = self.start_time if self.start_time is not None else now
        return max(0.0, end - begin)

    @property
    def ran_before_s(self) -> float:
        """Wall-clock seconds the job ran before its last requeue, all earlier runs together."""
        return self.ran_s if self.restarts else 0.0

    def queued_s(self, now: float) -> float:
        """Seconds spent queued in all: ``wait_s`` less the time it ran before a requeue."""
        return max(0.0, self.wait_s(now) - self.ran_before_s)


@dataclass(frozen=True)
class ClusterView:
    """A frozen snapshot: the time, the nodes, and the pending and running jobs."""

    now: float
    nodes: tuple[Node, ...]
    jobs: tuple[Job, ...]

    @cached_property
    def pending(self) -> tuple[Job, ...]:
        return tuple(j for j in self.jobs if j.pending)

    @cached_property
    def running(self) -> tuple[Job, ...]:
        return tuple(j for j in self.jobs if j.running)

    @cached_property
    def total_gpus(self) -> int:
        return sum(n.gpus for n in self.nodes if n.usable)

    @cached_property
    def free_gpus(self) -> int:
        return sum(n.gpus_free for n in self.nodes)

    @cached_property
    def gpus_per_node(self) -> int:
        return max((n.gpus for n in self.nodes), default=0)

    def job(self, job_id: int) -> Optional[Job]:
        for j in self.jobs:
            if j.job_id == job_id:
                return j
        return None


@dataclass(frozen=True)
class Decision:
    """What a policy wants done to one job; backends decide how.

    ``config`` resizes a pending job to ``config.num_nodes x config.gpus_per_node`` and
    is recorded as the decision token; ``site_factor`` sets its place in the queue;
    ``time_limit_s`` rescales its limit to the new size; ``requeue`` asks to stop a
    running job and put it back in the queue (only where the site enabled it), with
    ``site_factor`` then applied to the requeued job. ``hold`` True holds a pending job
    (Slurm will not start it) and False releases a job the controller held.
    ``partition`` moves a pending job to that one partition (one the job allows, chosen
    where it is predicted to finish soonest); ``config`` is then planned for its GPUs.
    """

    job_id: int
    config: Optional[ExecConfig] = None
    site_factor: Optional[int] = None
    time_limit_s: Optional[int] = None
    requeue: bool = False
    hold: Optional[bool] = None
    partition: Optional[str] = None
    reason: str = ""
    predicted_start_s: Optional[float] = None
    predicted_end_s: Optional[float] = None

    @property
    def changes_anything(self) -> bool:
        return (self.config is not None or self.site_factor is not None
                or self.time_limit_s is not None or self.requeue or self.hold is not None
                or self.partition is not None)
