"""The job file's `[model]` section: the architecture (DLRM, DCNv2 or HSTU) and its sizes, the one
home of their defaults; each field's docstring is its help, and `__post_init__` checks the values,
naming the key and the bad value."""

from __future__ import annotations

from dataclasses import dataclass, field

from shardrec.embeddings.dims import check_width
from shardrec.trainer.job.toml_values import check_choice, check_elements, check_positive

MODEL_ARCHS = ("dlrm", "dcnv2", "hstu")
HSTU_BIASES = ("input", "pairwise", "both")


@dataclass
class ModelConfig:
    arch: str = "dlrm"
    """dlrm (dot interaction), dcnv2 (the DLRMv2 model) or hstu (DLRMv4's sequence model, for
    datasets with a sequence feature: an event log's history)."""
    embedding_dim: int = 16
    """Width of every embedding table (DLRM needs it equal to the bottom MLP's last layer; HSTU's
    token width, that of every table a sequence reads)."""
    dims: dict[str, int] = field(default_factory=dict)
    """Per-feature embedding widths that differ from embedding_dim (dcnv2 only)."""
    dense_arch: list[int] = field(default_factory=lambda: [64, 16])
    """Bottom MLP layer sizes over the dense features."""
    over_arch: list[int] = field(default_factory=lambda: [64, 32, 1])
    """Top MLP layer sizes; the last must be 1."""
    dcn_layers: int = 3
    """Cross layers of DCNv2."""
    dcn_low_rank: int = 32
    """Low-rank dimension of DCNv2's cross layers."""
    hstu_layers: int = 2
    """STU layers of HSTU (DLRMv4: 3)."""
    hstu_heads: int = 2
    """Attention heads of each STU layer (DLRMv4: 4)."""
    hstu_qk_dim: int = 32
    """Query and key width per head (DLRMv4: 128)."""
    hstu_v_dim: int = 32
    """Value width per head (DLRMv4: 128)."""
    hstu_hidden: int = 64
    """Hidden width of the MLPs that make a token from its ids and actions (DLRMv4: 256)."""
    hstu_max_seq_len: int = 256
    """Tokens per sample the attention is sized for: contextual ones, the history (its most recent
    kept) and the candidate (DLRMv4: 4,096)."""
    hstu_time_buckets: int = 2048
    """Buckets of the time since the sequence's last event, sqrt of minutes (DLRMv4: 2,048)."""
    hstu_bias: str = "input"
    """Relative position and time: input (DLRMv4: position and time embeddings added to the tokens),
    pairwise (the research model: a learnt bias per distance and time gap inside attention) or
    both."""
    hstu_recency: float = 0.0
    """The initial slope of the relative bias against distance: a token d places back starts
    d x slope lower (ALiBi's linear recency prior, Press et al. 2022), so the candidate reads the
    latest events from the first step; 0: the research model's N(0, 0.02) only. With hstu_bias
    pairwise or both."""
    hstu_attn_scale: str = "max_seq_len"
    """Divisor of the attention: max_seq_len (fixed: a sample scores the same in any batch) or
    batch_max (the reference's: the rank's longest sequence in the batch)."""
    hstu_action_bits: int = 3
    """Bits of the action side sequence, each a learnt vector in a token (DLRMv4: listen-plus,
    like, skip); fewer than a dataset's actions hold (an event log's 3) are refused."""
    hstu_action_dim: int = 8
    """Width of each action bit's vector."""
    hstu_input_dropout: float = 0.2
    """Dropout of the tokens after the position and time embeddings."""
    hstu_dropout: float = 0.1
    """Dropout inside each STU layer (before its output projection)."""

    def __post_init__(self) -> None:
        check_choice("model.arch", self.arch, MODEL_ARCHS)
        check_choice("model.hstu_bias", self.hstu_bias, HSTU_BIASES)
        check_positive("model.hstu_recency", self.hstu_recency, allow_zero=True)
        if self.hstu_recency and self.hstu_bias == "input":
            raise ValueError(
                f"model.hstu_recency = {self.hstu_recency!r} shapes the relative bias, which "
                'model.hstu_bias = "input" does not have: set it to "pairwise" or "both"'
            )
        check_choice("model.hstu_attn_scale", self.hstu_attn_scale, ("max_seq_len", "batch_max"))
        for name in (
            "hstu_layers",
            "hstu_heads",
            "hstu_qk_dim",
            "hstu_v_dim",
            "hstu_hidden",
            "hstu_max_seq_len",
            "hstu_time_buckets",
            "hstu_action_bits",
            "hstu_action_dim",
        ):
            check_positive(f"model.{name}", getattr(self, name))
        for name in ("hstu_input_dropout", "hstu_dropout"):
            if not 0 <= getattr(self, name) < 1:
                raise ValueError(f"model.{name} = {getattr(self, name)!r} must lie in [0, 1)")
        check_positive("model.embedding_dim", self.embedding_dim)
        check_elements("model.dims", self.dims, int)
        check_elements("model.dense_arch", self.dense_arch, int)
        check_elements("model.over_arch", self.over_arch, int)
        check_width("model.embedding_dim", self.embedding_dim)
        for name, dim in self.dims.items():
            check_positive(f"model.dims.{name}", dim)
            check_width(f"model.dims.{name}", dim)
        for key, sizes in (
            ("model.dense_arch", self.dense_arch),
            ("model.over_arch", self.over_arch),
        ):
            for size in sizes:
                if size <= 0:
                    raise ValueError(f"{key} = {sizes!r}: layer size {size} must be > 0")
        check_positive("model.dcn_layers", self.dcn_layers)
        check_positive("model.dcn_low_rank", self.dcn_low_rank)
        if not self.over_arch or self.over_arch[-1] != 1:
            raise ValueError(f"model.over_arch = {self.over_arch!r} must end with 1")
        if self.arch == "dlrm" and self.dense_arch and self.dense_arch[-1] != self.embedding_dim:
            raise ValueError(
                f"model.dense_arch = {self.dense_arch!r}: DLRM needs its last layer equal to "
                f"model.embedding_dim = {self.embedding_dim}"
            )
        unequal = {k: v for k, v in self.dims.items() if v != self.embedding_dim}
        if self.arch == "dlrm" and unequal:
            name, dim = next(iter(unequal.items()))
            raise ValueError(
                f"model.dims.{name} = {dim}: DLRM's dot interaction needs every embedding width equal to "
                f'model.embedding_dim = {self.embedding_dim} (per-feature widths are for arch = "dcnv2")'
            )
