"""Megatron-Core set-up shared by the pipeline and the TP/SP workers (GPU only).

This is the path Megatron-LM's own ``pretrain_gpt`` takes, cut down to what a
measurement needs: ``parallel_state.initialize_model_parallel`` on the process group the
launcher made, ``model_parallel_cuda_manual_seed``, a ``GPTModel`` per model chunk with the
local (Transformer-Engine-free) layer spec (with SP-capable torch LayerNorms, see
:mod:`.megatron_norm`), ``Float16Module`` for bf16, Megatron's own
``DistributedDataParallel`` (contiguous fp32 grad buffers), ``get_megatron_optimizer``
(Adam with fp32 master weights), ``finalize_model_grads`` as the schedule's finalizer, and
``get_forward_backward_func()`` for the schedule itself. Written against megatron-core
0.19.2 (the version ``dev/gpu/fetch_gpu_wheels.sh`` carries to the GPU machine).

Megatron's schedules allocate on ``device="cuda"`` and its P2P buffers on
``torch.cuda.current_device()``: there is no CPU path and we do not fake one.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from perfgate.workloads import timing
from perfgate.workloads.area import MIN_MEASURED_STEPS  # noqa: F401  (re-exported for the workers)
from perfgate.workloads.pipeline.layout import ParallelLayout



@dataclass(frozen=True)
class MegatronModel:
    """GPT shape for Megatron-Core's GPTModel (learned positions, LayerNorm, GELU MLP 4h)."""

    name: str
    num_layers: int
    hidden_size: int
    num_attention_heads: int
    vocab_size: int
    seq_len: int
    share_embeddings: bool

    def __post_init__(self) -> None:
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(f"{self.name}: hidden {self.hidden_size} not divisible by heads "
                             f"{self.num_attention_heads}")

    def check_tp(self, tp: int) -> None:
        """TP splits heads and the vocabulary; both must divide."""
        if self.num_attention_heads % tp or self.vocab_size % tp:
            raise ValueError(f"{self.name}: tp {tp} must divide heads {self.num_attention_heads} and "
                             f"vocab {self.vocab_size}")

    def with_seq_len(self, seq_len: int) -> "MegatronModel":
        return MegatronModel(f"{self.name}-seq{seq_len}", self.num_layers, self.hidden_size,
                             self.num_attention_heads, self.vocab_size, seq_len, self.share_embeddings)


# Seed report §7 (TP/SP): 12 layers, hidden 768, 16 heads, vocab 32k, seq 512, ~110M, tied head.
TP_MODEL = MegatronModel("mcore-gpt-110m", 12, 768, 16, 32000, 512, share_embeddings=True)
# Seed report §8 (PP): 16 layers, hidden 768, 16 heads, vocab 32k, seq 512, ~163M,
# share_embeddings_and_output_weights=False so the end stages' imbalance is visible.
PP_MODEL = MegatronModel("mcore-gpt-163m", 16, 768, 16, 32000, 512, share_embeddings=False)


def init_parallel(layout: ParallelLayout, seed: int) -> None:
    """Megatron's process groups on top of the launcher's default (NCCL) group."""
    import torch
    from megatron.core import parallel_state
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed

    parallel_state.initialize_model_parallel(
        tensor_model_parallel_size=layout.tp,
        pipeline_model_parallel_size=layout.pp,
        virtual_pipeline_model_parallel_size=layout.virtual_stages if layout.virtual_stages > 1 else None,
    )
    torch.manual_seed(seed)
    model_parallel_cuda_manual_seed(seed)


def destroy_parallel() -> None:
    from megatron.core import parallel_state

    parallel_state.destroy_model_parallel()


def transformer_config(model: MegatronModel, layout: ParallelLayout, *, recompute: bool = False,
                       timers: Any = None, cpu_init: bool = False):
    """bf16 TransformerConfig for this layout. ``cpu_init`` only for construction checks off-GPU."""
    import torch
    from megatron.core.transformer.transformer_config import TransformerConfig

    model.check_tp(layout.tp)
    kwargs: dict[str, Any] = dict(
        num_layers=model.num_layers,
        hidden_size=model.hidden_size,
        num_attention_heads=model.num_attention_heads,
        ffn_hidden_size=4 * model.hidden_size,
        tensor_model_parallel_size=layout.tp,
        pipeline_model_parallel_size=layout.pp,
        sequence_parallel=layout.sequence_parallel,
        bf16=True,
        params_dtype=torch.bfloat16,
        pipeline_dtype=torch.bfloat16,
        use_cpu_initialization=cpu_init,
        deallocate_pipeline_outputs=layout.pp > 1,  # Megatron-LM's default with PP
        timers=timers,
    )
    if layout.virtual_stages > 1:
        kwargs["virtual_pipeline_model_parallel_size"] = layout.virtual_stages
    if recompute:
        # The seed's setting: recompute every layer in backward, one layer per checkpoint.
        kwargs.update(recompute_granularity="full", recompute_method="uniform", recompute_num_layers=1)
    return TransformerConfig(**kwargs)


def block_spec(config, vp_stage: int | None):
    """Megatron's local GPT layer spec, with LayerNorms that support sequence parallelism.

    Only the norms differ from ``get_gpt_layer_local_spec()`` (see :mod:`.megatron_norm` for
    why); the final norm of the block is the same class. Passing the block's submodules
    explicitly is how a spec names its final norm.
    """
    from dataclasses import replace

    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer.transformer_block import TransformerBlockSubmodules, get_num_layers_to_build

    from perfgate.workloads.pipeline.megatron_norm import SequenceParallelLayerNorm

    local = get_gpt_layer_local_spec()
    layer = replace(local, submodules=replace(local.submodules, input_layernorm=SequenceParallelLayerNorm,
                                              pre_mlp_layernorm=SequenceParallelLayerNorm))
    n_layers = get_num_layers_to_build(config, vp_stage=vp_stage)
    return TransformerBlockSubmodules(layer_specs=[layer] * n_layers, layer_norm=SequenceParallelLayerNorm)


def build_chunks(model: MegatronModel, config, layout: ParallelLayout) -> list:
    """One GPTModel per virtual stage of this rank (pre/post-process only at the pipeline ends)."""
    from megatron.core import parallel_state
    from megatron.core.models.gpt import GPTModel

    first = parallel_state.is_pipeline_first_stage(ignore_virtual=True)
    last = parallel_state.is_pipeline_last_stage(ignore_virtual=True)
    v = layout.virtual_stages
    chunks = []
    for vp_stage in range(v):
        kwargs: dict[str, Any] = {}
        if v > 1:
            kwargs["vp_stage"] = vp_stage
        chunk = GPTModel(
            config=config,
            transformer_layer_spec=block_spec(config, vp_stage if v > 1 else None),
            vocab_size=model.vocab_size,
            max_sequence_length=model.seq_len,
            pre_process=first and vp_stage == 0,
            post_process=last and vp_stage == v - 1,
            share_embeddings_and_output_weights=model.share_embeddings,
            **kwargs,
        )
        if v > 1:
            chunk.vp_stage = vp_stage
        chunks.append(chunk)
    return chunks


def param_count(chunks: list) -> int:
    return sum(p.numel() for chunk in chunks for p in chunk.parameters())


@dataclass
class Trainer:
    """Wrapped model chunks, optimizer and the schedule function of one configuration."""

    chunks: list
    optimizer: Any
    config: Any
    forward_backward: Callable
    params_local: int


def build_trainer(model: MegatronModel, layout: ParallelLayout, *, recompute: bool, timers: Any,
                  lr: float = 1e-4) -> Trainer:
    """Model chunks on this GPU, wrapped as Megatron-LM wraps them, with their optimizer."""
    import torch
    from megatron.core.distributed import (DistributedDataParallel, DistributedDataParallelConfig,
                                           finalize_model_grads)
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
    from megatron.core.pipeline_parallel import get_forward_backward_func
    from megatron.core.transformer.module import Float16Module

    config = transformer_config(model, layout, recompute=recompute, timers=timers)
    raw = build_chunks(model, config, layout)
    params_local = param_count(raw)
    for chunk in raw:
        chunk.cuda(torch.cuda.current_device())
    wrapped = []
    for i, chunk in enumerate(raw):
        ddp_config = DistributedDataParallelConfig(grad_reduce_in_fp32=True, overlap_grad_reduce=False,
                                                   use_distributed_optimizer=False)
        wrapped.append(DistributedDataParallel(config=config, ddp_config=ddp_config,
                                               module=Float16Module(config, chunk),
                                               disable_bucketing=i > 0))
    optimizer = get_megatron_optimizer(
        OptimizerConfig(optimizer="adam", lr=lr, weight_decay=0.01, bf16=True, params_dtype=torch.bfloat16,
                        clip_grad=1.0, use_distributed_optimizer=False),
        wrapped)
    config.grad_scale_func = optimizer.scale_loss
    config.finalize_model_grads_func = finalize_model_grads
    return Trainer(chunks=wrapped, optimizer=optimizer, config=config,
                   forward_backward=get_forward_backward_func(), params_local=params_local)


def synthetic_microbatches(model: MegatronModel, micro_batch_size: int, m: int, step: int, seed: int) -> list:
    """M microbatches of random tokens on this GPU: the same on every rank for a given step."""
    import torch

    gen = torch.Generator(device="cuda")
    gen.manual_seed(seed * 1_000_003 + m * 10_007 + step + 1)
    tokens = torch.randint(0, model.vocab_size, (m, micro_batch_size, model.seq_len + 1), device="cuda",
                           generator=gen)
    position_ids = torch.arange(model.seq_len, device="cuda").unsqueeze(0).expand(micro_batch_size, -1)
    return [{"tokens": tokens[i, :, :-1].contiguous(), "labels": tokens[i, :, 1:].contiguous(),
             "position_ids": position_ids} for i in range(m)]


def _loss_func(output_tensor):
    # GPTModel with labels returns per-token cross-entropy [b, s] (fp32 via Float16Module).
    loss = output_tensor.float().mean()
    return loss, {"lm loss": loss.detach()}


def forward_step(data_iterator, model):
    """Megatron's forward_step_func: run one microbatch, hand back the loss function."""
    batch = next(data_iterator)
    output = model(batch["tokens"], batch["position_ids"], None, labels=batch["labels"])
    return output, _loss_func


def train_step(trainer: Trainer, batches: list, *, seq_len: int, micro_batch_size: int) -> tuple[list, float, float]:
    """One optimizer step; returns (losses on the last stage, schedule seconds, step seconds).

    The caller synchronizes and barriers before; the schedule's time is measured to a
    ``torch.cuda.synchronize`` after ``forward_backward`` (which includes Megatron's
    finalize_model_grads: DP all-reduce, SP layernorm all-reduce, tied-embedding all-reduce).
    """
    t0 = timing.now()
    for chunk in trainer.chunks:
        chunk.zero_grad_buffer()
    trainer.optimizer.zero_grad()
    iterators = [iter(batches) for _ in trainer.chunks]
    losses = trainer.forward_backward(
        forward_step_func=forward_step,
        data_iterator=iterators if len(iterators) > 1 else iterators[0],
        model=trainer.chunks,
        num_microbatches=len(batches),
        seq_length=seq_len,
        micro_batch_size=micro_batch_size,
        forward_only=False,
    )
    t1 = timing.now("cuda")
    update_ok, _grad_norm, _zeros = trainer.optimizer.step()
    t2 = timing.now("cuda")
    if not update_ok:
        raise RuntimeError("Megatron optimizer skipped the update (non-finite gradients)")
    values = [float(d["lm loss"]) for d in losses] if losses else []
    return values, t1 - t0, t2 - t0


def barrier() -> None:
    import torch

    torch.cuda.synchronize()
    torch.distributed.barrier()
