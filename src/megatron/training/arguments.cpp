#include "megatron/training/arguments.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <string_view>
#include <variant>

#include "megatron/core/error.h"
#include "megatron/core/strings.h"
#include "megatron/datasets/tokenizers/byte_tokenizer.h"
#include "megatron/flags/flag_table.h"
#include "megatron/models/gpt/presets.h"
#include "megatron/pipeline_parallel/schedule.h"
#include "megatron/pipeline_parallel/stage_split.h"
#include "megatron/training/checkpoint_io.h"
#include "megatron/training/context_parallel.h"

namespace megatron {
namespace {

using flags::ConfigFile;
using flags::enum_field;
using Switch = flags::Switch<TrainingArgs>;
using Flag = flags::Flag<TrainingArgs>;

// ---- the flag table ---------------------------------------------------------------------------

#define FIELD(member) MEGATRON_FLAG_FIELD(TrainingArgs, member)

// The help sections of the flags that make the model (a run that loads a checkpoint takes them
// from it: checkpoint_model_layer).
constexpr const char* kModelSection = "model";
constexpr const char* kMoESection = "mixture of experts";
// Rows that set MegatronImplementationChoices: their help says why each changes nothing here.
constexpr const char* kImplementationSection = "Megatron's implementation choices (accepted; no effect here)";

std::vector<Flag> build_flag_table() {
  std::vector<std::string> presets;
  for (const ModelPreset& preset : model_presets()) presets.emplace_back(preset.name);
  const char* model = kModelSection;
  const char* moe = kMoESection;
  const char* parallel = "parallelism and precision";
  const char* recompute = "activation recomputation";
  const char* training = "training";
  const char* lr = "learning rate (Megatron's OptimizerParamScheduler)";
  const char* optimizer = "optimizer (AdamW)";
  const char* data = "data";
  const char* checkpoint = "checkpointing";
  const char* logging = "logging and evaluation";
  const char* impl = kImplementationSection;
  const char* fused_attention = "Attention always runs fused kernels here: cuDNN's where they apply, ours elsewhere";
  const char* fixed_fusions = "A kernel-fusion switch: the fusions here are fixed";
  return {
      {"--config", ConfigFile{}, "configuration",
       "YAML file of flag values (keys: flag names without the leading dashes, e.g. num_layers: 12); command-line "
       "flags override it"},
      {"--model-preset", FIELD(model_preset), model,
       "Starting values for the model shape; any model flag overrides them", presets},
      {"--num-layers", FIELD(model.num_layers), model, "Transformer layers; required"},
      {"--hidden-size", FIELD(model.hidden_size), model, "Hidden size h; required"},
      {"--ffn-hidden-size", FIELD(model.ffn_hidden_size), model,
       "MLP width; derived: 4h, or int((4h*2/3)/64)*64 with --swiglu"},
      {"--num-attention-heads", FIELD(model.num_attention_heads), model, "Attention heads; required"},
      {"--group-query-attention", Switch{FIELD(model.group_query_attention), true}, model,
       "Grouped-query attention with --num-query-groups key/value heads"},
      {"--num-query-groups", FIELD(model.num_query_groups), model,
       "Key/value heads with --group-query-attention (Megatron's default 1); derived: the heads otherwise"},
      {"--kv-channels", FIELD(model.kv_channels), model, "Head dimension; derived: hidden-size / num-attention-heads"},
      {"--max-position-embeddings", FIELD(model.max_position_embeddings), model,
       "Position table size, >= seq-length; derived here: seq-length (Megatron requires the flag)"},
      {"--seq-length", FIELD(model.seq_length), model, "Sequence length S; required"},
      {"--make-vocab-size-divisible-by", FIELD(model.make_vocab_size_divisible_by), model,
       "Pad the vocabulary to a multiple of this times TP"},
      {"--true-vocab-size", FIELD(model.true_vocab_size), model,
       "Rows that hold tokens, padded instead of the tokenizer's size (import-hf stores HF's vocab_size, which "
       "export-hf writes back); 0: the tokenizer's size"},
      {"--normalization",
       enum_field(FIELD(model.normalization)),
       model,
       "Normalization layer",
       {"LayerNorm", "RMSNorm"}},
      {"--norm-epsilon", FIELD(model.layernorm_epsilon), model, "Epsilon of the normalization layers"},
      {"--swiglu", Switch{FIELD(model.swiglu), true}, model, "SwiGLU MLP instead of GELU"},
      {"--position-embedding-type",
       enum_field(FIELD(model.position_embedding_type)),
       model,
       "Position encoding",
       {"learned_absolute", "rope", "none"}},
      {"--rotary-base", FIELD(model.rotary_base), model, "RoPE base theta"},
      {"--rotary-percent", FIELD(model.rotary_percent), model, "Fraction of each head's dimensions RoPE rotates"},
      {"--rotary-interleaved", Switch{FIELD(model.rotary_interleaved), true}, model,
       "Rotate interleaved pairs instead of halves (GPT-NeoX style)"},
      {"--use-rope-scaling", Switch{FIELD(model.use_rope_scaling), true}, model,
       "Llama-3.x RoPE frequency scaling (low/high frequency factors 1 and 4, original context 8192)"},
      {"--rope-scaling-factor", FIELD(model.rope_scaling_factor), model,
       "Factor of --use-rope-scaling (Llama-3.1: 8, Llama-3.2: 32)"},
      {"--rotary-seq-len-interpolation-factor", FIELD(model.rotary_seq_len_interpolation_factor), model,
       "Position interpolation: RoPE rotates position p by the angles of p / factor (Hugging Face's linear "
       "scaling); a checkpoint may be fine-tuned at another factor"},
      {"--window-size", FIELD(window_size), model,
       "Sliding-window attention \"L,R\": query i sees keys i-L..i+R (-1: unlimited; causal models take R = 0); "
       "unset: full attention"},
      {"--disable-bias-linear", Switch{FIELD(model.add_bias_linear), false}, model, "No biases in linear layers"},
      {"--add-qkv-bias", Switch{FIELD(model.add_qkv_bias), true}, model, "Bias on the QKV projection only"},
      {"--qk-layernorm", Switch{FIELD(model.qk_layernorm), true}, model,
       "Normalise each query and key head (--normalization's kind, over --kv-channels) before RoPE"},
      {"--untie-embeddings-and-output-weights", Switch{FIELD(model.untie_embeddings_and_output_weights), true}, model,
       "Separate output layer instead of the word embeddings"},
      {"--init-method-std", FIELD(model.init_method_std), model,
       "Std of the normal weight init (output projections use std/sqrt(2*layers))"},
      {"--init-method-xavier-uniform", Switch{FIELD(model.init_method_xavier_uniform), true}, model,
       "Draw the weights --init-method-std would draw from Xavier's uniform distribution instead, from each "
       "weight's whole matrix (Megatron's fans under --use-cpu-initialization)"},
      {"--attention-dropout", FIELD(model.attention_dropout), model, "Dropout on attention probabilities"},
      {"--hidden-dropout", FIELD(model.hidden_dropout), model, "Dropout on the residual branches"},
      {"--num-experts", FIELD(model.moe.num_moe_experts), moe, "Experts per MoE layer; unset: a dense model"},
      {"--moe-layer-freq", FIELD(model.moe.moe_layer_freq), moe,
       "Which layers are MoE: N for every N-th from the first, or one 0/1 per layer as a list or a list expression, "
       "e.g. [1,0,1,0] or ([0]*1+[1]*3)"},
      {"--moe-ffn-hidden-size", FIELD(model.moe.moe_ffn_hidden_size), moe,
       "Width of each expert; derived: --ffn-hidden-size"},
      {"--moe-shared-expert-intermediate-size", FIELD(model.moe.moe_shared_expert_intermediate_size), moe,
       "Width of the shared expert every token also passes through; unset: none"},
      {"--moe-shared-expert-gate", Switch{FIELD(model.moe.moe_shared_expert_gate), true}, moe,
       "Scale the shared expert's output per token by sigmoid(x . w), w a learnt (1, hidden) weight (Qwen2-MoE)"},
      {"--moe-router-topk", FIELD(model.moe.moe_router_topk), moe, "Experts each token is routed to"},
      {"--moe-router-score-function",
       enum_field(FIELD(model.moe.moe_router_score_function)),
       moe,
       "Router scores",
       {"softmax", "sigmoid"}},
      {"--moe-router-pre-softmax", Switch{FIELD(model.moe.moe_router_pre_softmax), true}, moe,
       "Softmax over all experts before the top-k (else over the chosen k)"},
      {"--moe-router-num-groups", FIELD(model.moe.moe_router_num_groups), moe,
       "Expert groups of group-limited routing (with --moe-router-group-topk)"},
      {"--moe-router-group-topk", FIELD(model.moe.moe_router_group_topk), moe, "Groups each token may use"},
      {"--moe-router-topk-scaling-factor", FIELD(model.moe.moe_router_topk_scaling_factor), moe,
       "Factor on the routing probabilities; unset: 1"},
      {"--moe-router-load-balancing-type",
       enum_field(FIELD(model.moe.moe_router_load_balancing_type)),
       moe,
       "Load-balancing loss: over the micro-batch, per sequence, or none",
       {"aux_loss", "seq_aux_loss", "none"}},
      {"--moe-aux-loss-coeff", FIELD(model.moe.moe_aux_loss_coeff), moe, "Weight of the load-balancing loss"},
      {"--moe-z-loss-coeff", FIELD(model.moe.moe_z_loss_coeff), moe, "Weight of the router z-loss; unset: none"},
      {"--moe-router-enable-expert-bias", Switch{FIELD(model.moe.moe_router_enable_expert_bias), true}, moe,
       "Aux-loss-free balancing: a per-expert bias on the routing scores (sigmoid routing)"},
      {"--moe-router-bias-update-rate", FIELD(model.moe.moe_router_bias_update_rate), moe,
       "Step of the expert bias per iteration"},
      {"--moe-router-force-load-balancing", Switch{FIELD(model.moe.moe_router_force_load_balancing), true}, moe,
       "Benchmarks only: route on random N(0,1) logits, so the experts' load is balanced whatever the router "
       "learnt (their gradient goes to the router's logits unchanged)"},
      {"--moe-expert-capacity-factor", FIELD(model.moe.moe_expert_capacity_factor), moe,
       "Tokens each expert keeps, as a multiple of its fair share; unset: dropless"},
      {"--moe-token-drop-policy",
       enum_field(FIELD(model.moe.moe_token_drop_policy)),
       moe,
       "Which tokens over capacity are dropped: lowest probability or latest position",
       {"probs", "position"}},
      {"--moe-pad-expert-input-to-capacity", Switch{FIELD(model.moe.moe_pad_expert_input_to_capacity), true}, moe,
       "Every expert processes exactly its capacity (needs --moe-expert-capacity-factor)"},
      {"--moe-grouped-gemm", Switch{FIELD(model.moe.moe_grouped_gemm), true}, moe,
       "All local experts' GEMMs in one grouped launch"},
      {"--moe-token-dispatcher-type",
       enum_field(FIELD(model.moe.moe_token_dispatcher_type)),
       moe,
       "How tokens reach the experts of other ranks",
       {"allgather", "alltoall"}},
      {"--recompute-granularity",
       FIELD(model.recompute.recompute_granularity),
       recompute,
       "full: checkpointed layers keep only their input and run forward again in backward; selective: the "
       "--recompute-modules of every layer do",
       {"full", "selective"}},
      {"--recompute-activations", Switch{FIELD(model.recompute.recompute_activations), true}, recompute,
       "The same as --recompute-granularity selective"},
      {"--moe-layer-recompute", Switch{FIELD(model.recompute.moe_layer_recompute), true}, recompute,
       "Megatron's deprecated spelling of selective recomputation with moe beside the --recompute-modules"},
      {"--recompute-method",
       FIELD(model.recompute.recompute_method),
       recompute,
       "With full: uniform (every layer, in groups of --recompute-num-layers) or block (the first "
       "--recompute-num-layers layers of each pipeline stage)",
       {"uniform", "block"}},
      {"--recompute-num-layers", FIELD(model.recompute.recompute_num_layers), recompute,
       "With full: layers per group (uniform) or layers recomputed per pipeline stage (block)"},
      {"--recompute-modules", FIELD(model.recompute.recompute_modules), recompute,
       "With selective: core_attn (the attention op's output), mlp (the dense MLP's fc1), moe (a whole MoE "
       "layer), moe_act (the experts' activation), layernorm (the pre-attention and pre-MLP norms' outputs); "
       "default: core_attn"},
      {"--bf16", Switch{FIELD(bf16), true}, parallel, "bf16 parameters and compute, fp32 master weights"},
      {"--fp8-format",
       FIELD(model.fp8.fp8_format),
       parallel,
       "FP8 GEMMs in every transformer layer's linear layers (needs --bf16 and a GPU of compute capability 8.9+): "
       "e4m3 everywhere, or hybrid (e4m3 forward, e5m2 gradients); unset: no FP8",
       {"e4m3", "hybrid"}},
      {"--fp8-recipe",
       FIELD(model.fp8.fp8_recipe),
       parallel,
       "delayed (scales from an amax history, updated after each step), tensorwise (each tensor's own amax) or "
       "blockwise (each 1x128 tile's / 128x128 weight block's own amax, DeepSeek-V3 style); Megatron's mxfp8 and "
       "custom are not built here",
       {"delayed", "tensorwise", "blockwise", "mxfp8", "custom"}},
      {"--fp8-margin", FIELD(model.fp8.fp8_margin), parallel,
       "Delayed scaling: scales are divided by 2^margin (headroom above the recorded amax)"},
      {"--fp8-amax-history-len", FIELD(model.fp8.fp8_amax_history_len), parallel,
       "Delayed scaling: steps of amax history each scale is computed from"},
      {"--fp8-amax-compute-algo",
       FIELD(model.fp8.fp8_amax_compute_algo),
       parallel,
       "Delayed scaling: the amax a scale comes from, the history's max or its most recent entry",
       {"most_recent", "max"}},
      {"--fp8-param-gather", Switch{FIELD(model.fp8.fp8_param_gather), true}, parallel,
       "The FP8 layers' weights held as FP8 codes, cast from the f32 masters after each update and "
       "all-gathered in FP8 (needs --use-distributed-optimizer; delayed or tensorwise recipe)"},
      {"--first-last-layers-bf16", Switch{FIELD(model.fp8.first_last_layers_bf16), true}, parallel,
       "Keep the GEMMs of the first and last layers in bf16 under FP8"},
      {"--num-layers-at-start-in-bf16", FIELD(model.fp8.num_layers_at_start_in_bf16), parallel,
       "With --first-last-layers-bf16: layers at the start kept in bf16"},
      {"--num-layers-at-end-in-bf16", FIELD(model.fp8.num_layers_at_end_in_bf16), parallel,
       "With --first-last-layers-bf16: layers at the end kept in bf16"},
      {"--fp16", Switch{FIELD(fp16), true}, parallel,
       "fp16 parameters and compute with loss scaling, fp32 master weights and gradients"},
      {"--loss-scale", FIELD(optimizer.loss_scale), parallel,
       "Static loss scale (fp16, or bf16); unset: dynamic loss scaling with --fp16"},
      {"--initial-loss-scale", FIELD(optimizer.initial_loss_scale), parallel, "Starting dynamic loss scale"},
      {"--min-loss-scale", FIELD(optimizer.min_loss_scale), parallel, "Floor of the dynamic loss scale"},
      {"--loss-scale-window", FIELD(optimizer.loss_scale_window), parallel,
       "Iterations without overflow before the dynamic loss scale doubles"},
      {"--hysteresis", FIELD(optimizer.hysteresis), parallel,
       "Overflows the dynamic loss scale absorbs before it halves (refilled when it grows)"},
      {"--tensor-model-parallel-size", FIELD(parallel.tensor_model_parallel_size), parallel,
       "Tensor-parallel size TP: attention heads, MLP columns and the vocabulary are split across TP ranks"},
      {"--pipeline-model-parallel-size", FIELD(parallel.pipeline_model_parallel_size), parallel,
       "Pipeline-parallel size PP: the layers split over PP stages, run by Megatron's 1F1B or interleaved schedule"},
      {"--num-layers-per-virtual-pipeline-stage", FIELD(parallel.num_layers_per_virtual_pipeline_stage), parallel,
       "Interleaved schedule: model chunks per pipeline rank = its layers / this"},
      {"--num-virtual-stages-per-pipeline-rank", FIELD(parallel.num_virtual_stages_per_pipeline_rank), parallel,
       "Interleaved schedule: model chunks per pipeline rank (1: not interleaved)"},
      {"--microbatch-group-size-per-virtual-pipeline-stage",
       FIELD(parallel.microbatch_group_size_per_virtual_pipeline_stage), parallel,
       "Interleaved schedule: micro-batches each chunk runs in turn; derived: PP"},
      {"--no-overlap-p2p-communication", Switch{FIELD(parallel.overlap_p2p_comm), false}, parallel,
       "Interleaved schedule: wait for each batch of pipeline sends and receives where it stands instead of "
       "overlapping them with compute (which groups larger than PP need)"},
      {"--decoder-first-pipeline-num-layers", FIELD(parallel.decoder_first_pipeline_num_layers), parallel,
       "Layers of the first pipeline stage (uneven split; the other stages share the rest)"},
      {"--decoder-last-pipeline-num-layers", FIELD(parallel.decoder_last_pipeline_num_layers), parallel,
       "Layers of the last pipeline stage (uneven split; the other stages share the rest)"},
      {"--account-for-embedding-in-pipeline-split",
       Switch{FIELD(parallel.account_for_embedding_in_pipeline_split), true}, parallel,
       "Count the embedding as one layer of the first pipeline stage"},
      {"--account-for-loss-in-pipeline-split", Switch{FIELD(parallel.account_for_loss_in_pipeline_split), true},
       parallel, "Count the loss as one layer of the last pipeline stage"},
      {"--pipeline-model-parallel-layout", FIELD(parallel.pipeline_model_parallel_layout), parallel,
       "Stages in order, '|' between them: E embedding, t layer, L loss, x*N and (..)*N repeat; e.g. \"Et|(tt|)*3,L\""},
      {"--context-parallel-size", FIELD(parallel.context_parallel_size), parallel,
       "CP: each sequence split over CP ranks in 2 x CP load-balanced chunks"},
      {"--cp-comm-type", FIELD(parallel.cp_comm_type), parallel,
       "How attention crosses the CP group: p2p (ring attention), a2a (all-to-all over heads), allgather (keys and "
       "values all-gathered once) or a2a+p2p (all-to-all inside groups of --hierarchical-context-parallel-sizes, "
       "ring across)"},
      {"--hierarchical-context-parallel-sizes", FIELD(parallel.hierarchical_context_parallel_sizes), parallel,
       "A P, with A x P = CP: the CP group's all-to-all groups (A consecutive CP ranks) and the ring across them, for "
       "--cp-comm-type a2a+p2p"},
      {"--expert-model-parallel-size", FIELD(parallel.expert_model_parallel_size), parallel,
       "EP: the experts of each MoE layer split over EP ranks of each data-parallel group"},
      {"--expert-tensor-parallel-size", FIELD(parallel.expert_tensor_parallel_size), parallel,
       "Expert TP: each expert's FFN split over this many ranks (Megatron's expert layout); unset: the TP size"},
      {"--sequence-parallel", Switch{FIELD(parallel.sequence_parallel), true}, parallel,
       "Sequence parallelism: norms, dropout and residuals on S/TP positions per TP rank (no effect at TP 1)"},
      {"--tp-comm-overlap", Switch{FIELD(parallel.tp_comm_overlap), true}, parallel,
       "Overlap the sequence-parallel all-gathers and reduce-scatters with the neighbouring GEMMs, a chunk of "
       "the sequence at a time (needs --sequence-parallel)"},
      {"--use-distributed-optimizer", Switch{FIELD(use_distributed_optimizer), true}, parallel,
       "Shard fp32 master weights and Adam moments over the data-parallel ranks (ZeRO-1)"},
      {"--overlap-grad-reduce", Switch{FIELD(overlap_grad_reduce), true}, parallel,
       "Reduce gradients in buckets while backward runs (otherwise one bucket after backward)"},
      {"--overlap-param-gather", Switch{FIELD(overlap_param_gather), true}, parallel,
       "Distributed optimizer: all-gather updated parameters while the next step begins"},
      {"--use-megatron-fsdp", Switch{FIELD(use_megatron_fsdp), true}, parallel,
       "Megatron FSDP: shard over the data-parallel ranks what --data-parallel-sharding-strategy names"},
      {"--data-parallel-sharding-strategy",
       FIELD(data_parallel_sharding_strategy),
       parallel,
       "With --use-megatron-fsdp, what is sharded over DP: nothing (no_shard), the optimizer state (optim, as "
       "--use-distributed-optimizer), also the gradients (optim_grads, ZeRO-2), also the parameters, gathered "
       "for each module's use (optim_grads_params, ZeRO-3)",
       {"no_shard", "optim", "optim_grads", "optim_grads_params"}},
      {"--ddp-bucket-size", FIELD(ddp_bucket_size), parallel,
       "Gradient bucket size in elements (also without --overlap-grad-reduce: each bucket's gradients take memory "
       "when the backward reaches it); derived: max(40000000, 1000000 * DP)"},
      {"--distributed-timeout-minutes", FIELD(distributed_timeout_minutes), parallel,
       "A collective waiting longer than this ends the job, naming the rank that never arrived"},
      {"--micro-batch-size", FIELD(micro_batch_size), training, "Sequences per micro-batch per rank; required"},
      {"--global-batch-size", FIELD(global_batch_size), training,
       "Sequences per step; a multiple of micro-batch-size * DP; derived: micro-batch-size * DP"},
      {"--train-iters", FIELD(train_iters), training, "Training steps; this or --train-samples is required"},
      {"--rampup-batch-size", FIELD(rampup_batch_size), training,
       "START INCREMENT SAMPLES: grow the global batch from START by INCREMENT in equal steps over SAMPLES "
       "samples, then keep --global-batch-size (needs --train-samples)"},
      {"--train-samples", FIELD(train_samples), training,
       "Training samples, instead of --train-iters: train-samples / global-batch-size steps"},
      {"--seed", FIELD(seed), training, "Seed of initialization, dropout and data order"},
      {"--calculate-per-token-loss", Switch{FIELD(calculate_per_token_loss), true}, training,
       "The step's gradient is that of the global batch's loss sum over its number of loss tokens; unset: of the "
       "mean of each micro-batch's per-token mean"},
      {"--deterministic-mode", Switch{FIELD(model.deterministic_mode), true}, training,
       "GPU runs repeat their bits: the embedding and attention backwards sum in a fixed order (slower; cuDNN's "
       "attention backward then holds a (B,heads,S,S) 16-bit workspace), NCCL_ALGO=Ring unless set to another "
       "fixed-order algorithm. CPU runs always repeat their bits"},
      {"--no-check-for-nan-in-loss-and-grad", Switch{FIELD(check_for_nan_in_loss_and_grad), false}, training,
       "Skip steps with a non-finite loss or gradient instead of stopping the run"},
      {"--device", FIELD(device), training, "Where to run", {"auto", "cpu", "cuda"}},
      {"--lr", FIELD(optimizer.lr), lr, "Peak learning rate; required"},
      {"--min-lr", FIELD(optimizer.min_lr), lr, "Learning rate at the end of the decay"},
      {"--decoupled-lr", FIELD(optimizer.decoupled_lr), lr,
       "The word embedding and output layer's peak learning rate, under the same warmup and decay; unset: --lr"},
      {"--decoupled-min-lr", FIELD(optimizer.decoupled_min_lr), lr,
       "The word embedding and output layer's learning rate at the end of the decay (with --decoupled-lr); "
       "unset: --min-lr"},
      {"--lr-decay-style",
       enum_field(FIELD(optimizer.lr_decay_style)),
       lr,
       "Decay after warmup",
       {"constant", "linear", "cosine", "inverse-square-root", "WSD"}},
      {"--lr-decay-iters", FIELD(optimizer.lr_decay_iters), lr, "Iterations of warmup + decay; derived: train-iters"},
      {"--lr-decay-samples", FIELD(optimizer.lr_decay_samples), lr,
       "Samples of warmup + decay, with --train-samples; derived: train-samples"},
      {"--lr-warmup-iters", FIELD(optimizer.lr_warmup_iters), lr, "Linear warmup iterations"},
      {"--lr-warmup-samples", FIELD(optimizer.lr_warmup_samples), lr, "Linear warmup samples, with --train-samples"},
      {"--lr-warmup-fraction", FIELD(optimizer.lr_warmup_fraction), lr,
       "Warmup as a fraction of the decay length (instead of --lr-warmup-iters/--lr-warmup-samples)"},
      {"--lr-warmup-init", FIELD(optimizer.lr_warmup_init), lr, "Learning rate at step 0 of the warmup"},
      {"--lr-wsd-decay-style",
       enum_field(FIELD(optimizer.lr_wsd_decay_style)),
       lr,
       "Shape of the WSD anneal",
       {"exponential", "linear", "cosine", "minus_sqrt"}},
      {"--lr-wsd-decay-iters", FIELD(optimizer.lr_wsd_decay_iters), lr,
       "Length of the WSD anneal; required with --lr-decay-style WSD"},
      {"--lr-wsd-decay-samples", FIELD(optimizer.lr_wsd_decay_samples), lr,
       "Length of the WSD anneal in samples, with --train-samples"},
      {"--optimizer",
       FIELD(optimizer.optimizer),
       optimizer,
       "Adam with decoupled weight decay (Megatron's adam); the other optimizers are not built",
       {"adam", "sgd", "muon", "dist_muon", "lion", "soap", "adaptive_muon"}},
      {"--weight-decay", FIELD(optimizer.weight_decay), optimizer, "Decoupled weight decay (not on biases, norms)"},
      {"--apply-wd-to-qk-layernorm", Switch{FIELD(optimizer.apply_wd_to_qk_layernorm), true}, optimizer,
       "Weight decay on the query and key layernorms (--qk-layernorm) too"},
      {"--no-weight-decay-cond-type",
       FIELD(optimizer.no_weight_decay_cond_type),
       optimizer,
       "Megatron's deprecated spelling of --apply-wd-to-qk-layernorm",
       {"apply_wd_to_qk_layernorm"}},
      {"--clip-grad", FIELD(optimizer.clip_grad), optimizer, "Clip the global gradient L2 norm to this; 0 disables"},
      {"--adam-beta1", FIELD(optimizer.adam_beta1), optimizer, "Adam beta1"},
      {"--adam-beta2", FIELD(optimizer.adam_beta2), optimizer, "Adam beta2"},
      {"--adam-eps", FIELD(optimizer.adam_eps), optimizer, "Adam epsilon"},
      {"--optimizer-cpu-offload", Switch{FIELD(optimizer.optimizer_cpu_offload), true}, optimizer,
       "Keep fp32 master weights and Adam moments in host memory and update them on the CPU cores"},
      {"--optimizer-offload-fraction", FIELD(optimizer.optimizer_offload_fraction), optimizer,
       "With --optimizer-cpu-offload, the share of the optimizer state offloaded (whole parameters, in buffer "
       "order)"},
      {"--use-precision-aware-optimizer", Switch{FIELD(optimizer.use_precision_aware_optimizer), true}, optimizer,
       "With --bf16: keep the fp32 master weights on the device as 16-bit remainders beside the bf16 weights "
       "(2 bytes a parameter less; bf16 weights round ties away from zero)"},
      {"--no-store-param-remainders", Switch{FIELD(optimizer.store_param_remainders), false}, optimizer,
       "With --use-precision-aware-optimizer: keep whole fp32 master weights"},
      {"--main-grads-dtype",
       FIELD(optimizer.main_grads_dtype),
       optimizer,
       "Main gradients' dtype with --use-precision-aware-optimizer (fp32 only here)",
       {"fp32", "bf16"}},
      {"--main-params-dtype",
       FIELD(optimizer.main_params_dtype),
       optimizer,
       "Master weights' dtype with --use-precision-aware-optimizer (fp32 only here)",
       {"fp32", "fp16"}},
      {"--exp-avg-dtype",
       FIELD(optimizer.exp_avg_dtype),
       optimizer,
       "Adam's first moment's dtype with --use-precision-aware-optimizer (fp32 only here)",
       {"fp32", "fp16", "bf16", "fp8"}},
      {"--exp-avg-sq-dtype",
       FIELD(optimizer.exp_avg_sq_dtype),
       optimizer,
       "Adam's second moment's dtype with --use-precision-aware-optimizer (fp32 only here)",
       {"fp32", "fp16", "bf16", "fp8"}},
      {"--data-path", FIELD(data.data_path), data,
       "Dataset prefixes (PREFIX.bin/.idx), optionally weighted: [w1] p1 [w2] p2 ..."},
      {"--split", FIELD(data.split), data, "Train/valid/test weights of --data-path, e.g. 969,30,1"},
      {"--train-data-path", FIELD(data.train_data_path), data, "Training blend, instead of --data-path + --split"},
      {"--valid-data-path", FIELD(data.valid_data_path), data, "Validation blend, with --train-data-path"},
      {"--test-data-path", FIELD(data.test_data_path), data, "Test blend, with --train-data-path"},
      {"--data-cache-path", FIELD(data.data_cache_path), data,
       "Where the dataset index cache lives; default: <first prefix's dir>/cache/GPTDataset_indices"},
      {"--num-workers", FIELD(data.num_workers), data, "Loader prefetch: 2 x this many batches ahead; 0: none"},
      {"--dataloader-type",
       FIELD(data.dataloader_type),
       data,
       "Megatron's sampler: single (each global batch the next samples of the dataset's order; the only one "
       "built here)",
       {"single", "cyclic", "external"}},
      {"--mid-level-dataset-surplus", FIELD(data.mid_level_dataset_surplus), data,
       "Extra samples each blended dataset builds, as a fraction"},
      {"--mock-data", Switch{FIELD(data.mock_data), true}, data, "Megatron's synthetic dataset instead of files"},
      {"--tokenizer-type", FIELD(data.tokenizer_type), data,
       "GPT2BPETokenizer, HuggingFaceTokenizer, SentencePieceTokenizer, GPTSentencePieceTokenizer, "
       "Llama2Tokenizer, TikTokenizer, ByteTokenizer or NullTokenizer; required unless --load holds a checkpoint, "
       "whose saved "
       "tokenizer then fills the tokenizer flags not given"},
      {"--vocab-file", FIELD(data.vocab_file), data, "GPT-2 vocab.json (GPT2BPETokenizer)"},
      {"--merge-file", FIELD(data.merge_file), data, "GPT-2 merges.txt (GPT2BPETokenizer)"},
      {"--tokenizer-model", FIELD(data.tokenizer_model), data, "Model file of tokenizers that need one"},
      {"--vocab-size", FIELD(data.vocab_size), data, "Vocabulary size of NullTokenizer and TikTokenizer"},
      {"--tiktoken-pattern", FIELD(data.tiktoken_pattern), data,
       "TikTokenizer's split regex: v1 or v2 (Megatron's; unset: v2)"},
      {"--tiktoken-num-special-tokens", FIELD(data.tiktoken_num_special_tokens), data,
       "TikTokenizer's number of special-token ids before the vocabulary (unset: 1000)"},
      {"--special-tokens", FIELD(data.special_tokens), data,
       "TikTokenizer's special tokens, which must include <unk> <s> </s> <mask> <pad> <cls> <sep> (unset: those "
       "seven)"},
      {"--eod-mask-loss", Switch{FIELD(data.eod_mask_loss), true}, data, "No loss on end-of-document tokens"},
      {"--reset-position-ids", Switch{FIELD(data.reset_position_ids), true}, data,
       "Restart position ids after each end-of-document token"},
      {"--reset-attention-mask", Switch{FIELD(data.reset_attention_mask), true}, data,
       "No attention across documents inside a sample"},
      {"--save", FIELD(save), checkpoint, "Directory to write checkpoints to"},
      {"--load", FIELD(load), checkpoint, "Directory to resume from"},
      {"--save-interval", FIELD(save_interval), checkpoint, "Iterations between checkpoints; required with --save"},
      {"--ckpt-step", FIELD(ckpt_step), checkpoint,
       "Iteration of --load to resume from; 0: the tracker's (latest_checkpointed_iteration.txt)"},
      {"--override-ckpt-iteration", FIELD(override_ckpt_iteration), checkpoint,
       "Resume as from this iteration instead of the checkpoint's: the data loader replays from iteration x "
       "--global-batch-size samples (the weights, optimizer and learning-rate schedule are the checkpoint's)"},
      {"--finetune", Switch{FIELD(finetune), true}, checkpoint,
       "Load weights only: iteration 0, fresh optimizer and scheduler"},
      {"--no-save-optim", Switch{FIELD(no_save_optim), true}, checkpoint, "Leave optimizer state out of checkpoints"},
      {"--no-load-optim", Switch{FIELD(no_load_optim), true}, checkpoint, "Do not load optimizer state"},
      {"--dist-ckpt-strictness",
       FIELD(dist_ckpt_strictness),
       checkpoint,
       "Weights the model holds that the checkpoint lacks: an error (assume_ok_unexpected, raise_*), or kept at "
       "their initial values (log_* with a warning naming them; return_*, ignore_all silently); *_all also warn "
       "of (log_all) or refuse (raise_all) weights the checkpoint holds that no rank's model does",
       {"assume_ok_unexpected", "log_unexpected", "log_all", "raise_unexpected", "raise_all", "return_unexpected",
        "return_all", "ignore_all"}},
      {"--async-save", Switch{FIELD(async_save), true}, checkpoint,
       "Take the state into host memory at the save iteration and write the files from a background thread "
       "while training goes on; published (atomically) once every rank has written"},
      {"--non-persistent-save-interval", FIELD(non_persistent_save_interval), checkpoint,
       "Iterations between non-persistent checkpoints (with --non-persistent-ckpt-type local); 0: none"},
      {"--non-persistent-ckpt-type",
       FIELD(non_persistent_ckpt_type),
       checkpoint,
       "Where non-persistent checkpoints go: local, each rank's newest state in its own directory under "
       "--non-persistent-local-ckpt-dir (node-local storage), resumed by --load when newer than its checkpoint",
       {"global", "local", "in_memory"}},
      {"--non-persistent-local-ckpt-dir", FIELD(non_persistent_local_ckpt_dir), checkpoint,
       "Directory of the local non-persistent checkpoints (e.g. node-local NVMe); one subdirectory per rank"},
      {"--keep-last-checkpoints", FIELD(keep_last_checkpoints), checkpoint,
       "After each save, delete the checkpoints of --save but the newest K (ours; Megatron keeps all); 0: keep all"},
      {"--exit-interval", FIELD(exit_interval), training,
       "Stop at the first iteration that is a multiple of this, after saving a checkpoint (with --save)"},
      {"--exit-duration-in-mins", FIELD(exit_duration_in_mins), training,
       "Stop once the run has lasted this many minutes (fractions allowed), after saving a checkpoint (with --save)"},
      {"--exit-signal-handler", Switch{FIELD(exit_signal_handler), true}, training,
       "On SIGTERM (e.g. Slurm's preemption), finish the current step, save a checkpoint (with --save) and exit 0"},
      {"--log-interval", FIELD(log_interval), logging, "Iterations between log lines"},
      {"--eval-interval", FIELD(eval_interval), logging,
       "Iterations between validations; after training the validation and test splits are evaluated too; 0: "
       "no evaluation"},
      {"--eval-iters", FIELD(eval_iters), logging, "Global batches per evaluation (validation and test)"},
      {"--metrics-file", FIELD(metrics_file), logging, "JSONL file, one object per logged iteration"},
      {"--tensorboard-dir", FIELD(tensorboard_dir), logging,
       "Write TensorBoard event files of Megatron's scalars here (from the last rank)"},
      {"--tensorboard-log-interval", FIELD(tensorboard_log_interval), logging,
       "Iterations between TensorBoard scalars"},
      {"--tensorboard-queue-size", FIELD(tensorboard_queue_size), logging,
       "Scalars queued before the event file is written (also every 120 s and at the end)"},
      {"--log-timers-to-tensorboard", Switch{FIELD(log_timers_to_tensorboard), true}, logging,
       "Write iteration-time (seconds) to TensorBoard at each log line"},
      {"--log-validation-ppl-to-tensorboard", Switch{FIELD(log_validation_ppl_to_tensorboard), true}, logging,
       "Write the validation perplexity to TensorBoard"},
      {"--no-log-loss-scale-to-tensorboard", Switch{FIELD(log_loss_scale_to_tensorboard), false}, logging,
       "Leave loss-scale out of TensorBoard"},
      {"--log-world-size-to-tensorboard", Switch{FIELD(log_world_size_to_tensorboard), true}, logging,
       "Write world-size to TensorBoard"},
      {"--log-memory-to-tensorboard", Switch{FIELD(log_memory_to_tensorboard), true}, logging,
       "Write the allocator's allocated, reserved and peak bytes to TensorBoard"},
      {"--log-params-norm", Switch{FIELD(log_params_norm), true}, logging,
       "Print the L2 norm of the parameters after each logged step (log line, metrics file, TensorBoard "
       "params-norm)"},
      {"--log-num-zeros-in-grad", Switch{FIELD(log_num_zeros_in_grad), true}, logging,
       "Print each logged step's number of zero gradient elements (log line, metrics file, TensorBoard num-zeros)"},
      {"--log-throughput", Switch{FIELD(log_throughput), true}, logging,
       "Write throughput (TFLOP/s/GPU) to TensorBoard at each log line (the log line always shows it)"},
      {"--timing-log-level", FIELD(timing_log_level), logging,
       "Timers printed after each log line: 0 none, 1 forward-backward, all-grads-sync, optimizer; 2 also "
       "batch-generator"},
      {"--timing-log-option",
       FIELD(timing_log_option),
       logging,
       "How timers are reported across ranks: minmax, max, or all (every rank)",
       {"minmax", "max", "all"}},
      {"--log-straggler", Switch{FIELD(log_straggler), true}, logging,
       "After each log line, name the ranks with the slowest and fastest forward-backward compute"},
      {"--straggler-minmax-count", FIELD(straggler_minmax_count), logging,
       "How many slowest and fastest ranks the straggler report names"},
      {"--profile-ops-iteration", FIELD(profile_ops_iteration), logging,
       "Print how long each op family took in this iteration (GPU: device time); 0: never"},
      {"--profile", Switch{FIELD(profile), true}, logging,
       "Start the CUDA profiler after --profile-step-start iterations and stop it after --profile-step-end, for "
       "nsys profile --capture-range=cudaProfilerApi --capture-range-end=stop (GPU runs)"},
      {"--profile-step-start", FIELD(profile_step_start), logging,
       "Iterations done when --profile starts the CUDA profiler"},
      {"--profile-step-end", FIELD(profile_step_end), logging, "Iterations done when --profile stops it"},
      {"--profile-ranks", FIELD(profile_ranks), logging, "Global ranks --profile profiles; unset: every rank"},
      {"--use-mcore-models", Switch{FIELD(implementation.use_mcore_models), true}, impl,
       "Megatron-Core's models are the only ones here (Megatron ignores the flag too)"},
      {"--transformer-impl",
       FIELD(implementation.transformer_impl),
       impl,
       "One layer implementation here, whichever is named",
       {"transformer_engine", "local"}},
      {"--use-flash-attn", Switch{FIELD(implementation.use_flash_attn), true}, impl, fused_attention},
      {"--attention-backend",
       FIELD(implementation.attention_backend),
       impl,
       fused_attention,
       {"auto", "flash", "fused", "unfused", "local"}},
      {"--no-masked-softmax-fusion", Switch{FIELD(implementation.masked_softmax_fusion), false}, impl, fixed_fusions},
      {"--no-bias-gelu-fusion", Switch{FIELD(implementation.bias_gelu_fusion), false}, impl, fixed_fusions},
      {"--no-bias-swiglu-fusion", Switch{FIELD(implementation.bias_swiglu_fusion), false}, impl, fixed_fusions},
      {"--no-bias-dropout-fusion", Switch{FIELD(implementation.bias_dropout_fusion), false}, impl, fixed_fusions},
      {"--no-rope-fusion", Switch{FIELD(implementation.apply_rope_fusion), false}, impl, fixed_fusions},
      {"--no-persist-layer-norm", Switch{FIELD(implementation.no_persist_layer_norm), true}, impl, fixed_fusions},
      {"--no-gradient-accumulation-fusion", Switch{FIELD(implementation.gradient_accumulation_fusion), false}, impl,
       "Weight gradients always accumulate into the fp32 main gradients inside the GEMM here (the fused path)"},
      {"--attention-softmax-in-fp32", Switch{FIELD(implementation.attention_softmax_in_fp32), true}, impl,
       "The attention softmax always runs in fp32 here"},
      {"--cross-entropy-loss-fusion", Switch{FIELD(implementation.cross_entropy_loss_fusion), true}, impl,
       fixed_fusions},
      {"--cross-entropy-fusion-impl",
       FIELD(implementation.cross_entropy_fusion_impl),
       impl,
       fixed_fusions,
       {"native", "te"}},
      {"--moe-permute-fusion", Switch{FIELD(implementation.moe_permute_fusion), true}, impl, fixed_fusions},
      {"--accumulate-allreduce-grads-in-fp32", Switch{FIELD(implementation.accumulate_allreduce_grads_in_fp32), true},
       impl, "Gradients always accumulate and reduce in fp32 here"},
      {"--no-mmap-bin-files", Switch{FIELD(implementation.mmap_bin_files), false}, impl,
       "The .bin files are always memory-mapped here: the same samples either way"},
      {"--no-create-attention-mask-in-dataloader",
       Switch{FIELD(implementation.create_attention_mask_in_dataloader), false}, impl,
       "No attention mask tensor is built here: causal (and document) masking happens inside the attention kernels"},
      {"--auto-detect-ckpt-format", Switch{FIELD(implementation.auto_detect_ckpt_format), true}, impl,
       "There is one checkpoint format here"},
      {"--ckpt-format",
       FIELD(implementation.ckpt_format),
       impl,
       "Checkpoints here are per-rank safetensors shards with a metadata.json that load at any parallel layout, "
       "as torch_dist's do (Megatron's default); Megatron's own files are neither written nor read (megatron "
       "export-hf writes a Hugging Face model). The other formats are not built",
       {"torch", "torch_dist", "zarr", "torch_dcp", "fsdp_dtensor"}},
      {"--distributed-backend",
       FIELD(implementation.distributed_backend),
       impl,
       "GPU ranks always communicate through NCCL, CPU ranks through MPI",
       {"nccl", "gloo"}},
      {"--manual-gc", Switch{FIELD(implementation.manual_gc), true}, impl,
       "Python's garbage collector: there is none here"},
      {"--manual-gc-interval", FIELD(implementation.manual_gc_interval), impl,
       "Python's garbage collector: there is none here"},
      {"--empty-unused-memory-level", FIELD(implementation.empty_unused_memory_level), impl,
       "PyTorch's cache emptying (0, 1 or 2): the caching allocator here keeps its memory for the next step"},
      {"--use-cpu-initialization", Switch{FIELD(implementation.use_cpu_initialization), true}, impl,
       "Weights are always drawn on the host here, by a counter-based generator: the same values on every device "
       "and parallel layout"},
      {"--use-checkpoint-args", Switch{FIELD(implementation.use_checkpoint_args), true}, impl,
       "Always on here: a run that loads a checkpoint takes its model flags from it"},
      {"--init-model-with-meta-device", Switch{FIELD(implementation.init_model_with_meta_device), true}, impl,
       "Megatron FSDP's deferred initialization: each rank here allocates only its shards already, and the values "
       "do not depend on where they are drawn"},
      {"--use-nccl-ub", Switch{FIELD(implementation.nccl_ub), true}, impl,
       "NCCL user-buffer registration of the gradient buffers: a transport choice, the same sums"},
      {"--fsdp-double-buffer", Switch{FIELD(implementation.fsdp_double_buffer), true}, impl,
       "Megatron FSDP's reuse of its gather buffers: the caching allocator here reuses them already"},
      {"--fsdp-manual-registration", Switch{FIELD(implementation.fsdp_manual_registration), true}, impl,
       "Megatron FSDP's NCCL user-buffer registration (with --use-nccl-ub, as in Megatron): a transport choice"},
      {"--megatron-fsdp-max-pool-double-buffer",
       Switch{FIELD(implementation.megatron_fsdp_max_pool_double_buffer), true}, impl,
       "Megatron FSDP's allocator for its gather buffers: the caching allocator here serves them"},
      {"--fsdp-db-use-persist-buf-on-alloc-fail",
       Switch{FIELD(implementation.fsdp_db_use_persist_buf_on_alloc_fail), true}, impl,
       "Megatron FSDP's fallback when a bucket outgrows its double buffer: the caching allocator here serves them"},
      {"--disable-gloo-process-groups", Switch{FIELD(implementation.disable_gloo_process_groups), true}, impl,
       "There are no gloo groups here: GPU ranks talk through NCCL, CPU ranks through MPI"},
      {"--enable-experimental", Switch{FIELD(implementation.enable_experimental), true}, impl,
       "Megatron's gate for its experimental features: none of them is behind it here"},
      {"--disable-bf16-reduced-precision-matmul",
       Switch{FIELD(implementation.disable_bf16_reduced_precision_matmul), true}, impl,
       "Every 16-bit GEMM here reduces in fp32 already"},
      {"--cuda-graph-impl",
       FIELD(implementation.cuda_graph_impl),
       impl,
       "No CUDA graphs are captured here (the host keeps the GPU busy: the GPU idles at most 1.2% of a step, "
       "docs/PERFORMANCE.md); the same results either way",
       {"none", "local", "transformer_engine", "full_iteration"}},
      {"--no-save-rng", Switch{FIELD(implementation.save_rng), false}, impl,
       "There is no RNG state to save: dropout masks are functions of --seed and the iteration"},
      {"--no-load-rng", Switch{FIELD(implementation.load_rng), false}, impl,
       "There is no RNG state to load: dropout masks are functions of --seed and the iteration, so a resumed run "
       "draws the masks the uninterrupted run would"},
      {"--moe-router-dtype",
       FIELD(implementation.moe_router_dtype),
       impl,
       "The router's GEMM, softmax and top-k run in fp32 here, Megatron's fp32; fp64 is not built",
       {"fp32", "fp64"}},
      {"--rope-type",
       FIELD(implementation.rope_type),
       impl,
       "RoPE here is Megatron's rope type (Llama-3.x scaling through --use-rope-scaling); yarn is not built",
       {"rope", "yarn"}},
      {"--use-rotary-position-embeddings", Switch{FIELD(implementation.use_rotary_position_embeddings), true}, impl,
       "Megatron's deprecated spelling of --position-embedding-type rope: accepted beside that flag, which it "
       "needs here"},
      {"--no-position-embedding", Switch{FIELD(implementation.add_position_embedding), false}, impl,
       "Megatron's deprecated switch: accepted with --position-embedding-type rope (no learned position table), "
       "which it needs here as in Megatron"},
      {"--use-dist-ckpt", Switch{FIELD(implementation.use_dist_ckpt), true}, impl,
       "Megatron's deprecated flag, without effect there too: --ckpt-format chooses the format"},
      {"--dist-ckpt-format", FIELD(implementation.dist_ckpt_format), impl,
       "Megatron's deprecated flag, without effect there too: --ckpt-format chooses the format"},
      {"--ckpt-fully-parallel-save", Switch{FIELD(implementation.ckpt_fully_parallel_save), true}, impl,
       "Megatron's deprecated flag, without effect there too: every rank writes its own shards here"},
      {"--num-dataset-builder-threads", FIELD(implementation.num_dataset_builder_threads), impl,
       "Threads that build the dataset indices: one per rank here, the same indices"},
      {"--dist-ckpt-workers", FIELD(implementation.dist_ckpt_workers), impl,
       "Processes that write an async save: one thread per rank writes it here, the same files"},
      {"--ddp-pad-buckets-for-high-nccl-busbw", Switch{FIELD(implementation.ddp_pad_buckets_for_high_nccl_busbw), true},
       impl, "Bucket sizes padded for NCCL's bandwidth: a transport choice, the same sums"},
      {"--no-gradient-reduce-div-fusion", Switch{FIELD(implementation.gradient_reduce_div_fusion), false}, impl,
       "Where the 1/DP scaling of the gradients happens: the same products either way"},
      {"--ddp-reduce-scatter-with-fp32-accumulation",
       Switch{FIELD(implementation.ddp_reduce_scatter_with_fp32_accumulation), true}, impl,
       "Gradients always reduce in fp32 here"},
      {"--moe-shared-expert-overlap", Switch{FIELD(implementation.moe_shared_expert_overlap), true}, impl,
       "Megatron's overlap of the shared expert with the token exchange: the shared expert runs before the router "
       "here, Megatron's order without the flag (whose gradients sum in the other order, a rounding apart)"},
      {"--openai-gelu", Switch{FIELD(implementation.openai_gelu), true}, impl,
       "Megatron's legacy GELU switch, read by no Megatron-Core layer: GELU here is the tanh form, openai_gelu's "
       "and Megatron's fused bias-GELU's"},
  };
}

#undef FIELD

const char* const kTrainIntro =
    "Usage: megatron train [--flag VALUE | --flag=VALUE]...\n\n"
    "Flags keep Megatron-LM's names. Values are taken, each overriding the one before, from the defaults,\n"
    "--model-preset, the --config YAML file and the command line. Unset derived values are computed.\n";

// Megatron's flags for what is not built here, each with what to do instead (flags::NotBuilt).
std::vector<flags::NotBuilt> megatron_flags_not_built() {
  const std::string fsdp = "Megatron FSDP is --use-megatron-fsdp with --data-parallel-sharding-strategy: write that";
  const std::string mla = "multi-latent attention (DeepSeek-V2/V3) is not built: attention here is MHA or GQA";
  const std::string yarn = "YaRN RoPE scaling is not built: --use-rope-scaling gives Llama-3.x's frequency scaling";
  const std::string gpt_oss =
      "gpt-oss's attention sinks, alternating windows and clamped GLU are not built: attention here is softmax "
      "attention (--window-size for sliding windows), the MLP GELU or SwiGLU";
  const std::string fsdp_dtypes =
      "Megatron FSDP here keeps fp32 main weights and gradients and reduces gradients in fp32: drop the flag";
  const std::string torch_profiler =
      "there is no PyTorch profiler: use --profile under nsys (the CUDA profiler's capture range), or "
      "--profile-ops-iteration N for the time of each op family";
  const std::string memory_history =
      "there is no PyTorch memory history: the log reports peak and reserved memory (--log-memory-to-tensorboard "
      "too), and megatron plan predicts them";
  const std::string wandb =
      "Weights & Biases logging: use --tensorboard-dir (TensorBoard event files) or --metrics-file (JSONL)";
  const std::string adam_only =
      "the optimizer here is Adam with decoupled weight decay (Megatron's --optimizer adam): drop the flag";
  const std::string fim =
      "fill-in-the-middle data (Megatron's GPTFIMDataset) is not built: the data here is pretraining text as "
      "preprocess-data writes it";
  const std::string hybrid =
      "Mamba and other hybrid or heterogeneous layer stacks are not built: every layer "
      "here is a transformer layer";
  std::vector<flags::NotBuilt> not_built = {
      {"--batch-size", "Megatron's old flag, refused by Megatron too: use --micro-batch-size"},
      {"--warmup", "Megatron's old flag, refused by Megatron too: use --lr-warmup-fraction or --lr-warmup-iters"},
      {"--model-parallel-size", "Megatron's old flag, refused by Megatron too: use --tensor-model-parallel-size"},
      {"--checkpoint-activations",
       "Megatron's old flag, refused by Megatron too: use --recompute-activations, or --recompute-granularity with "
       "--recompute-method"},
      {"--sgd-momentum", adam_only},
      {"--lion-beta1", adam_only},
      {"--lion-beta2", adam_only},
      {"--ddp-num-buckets", "the gradient buckets here are sized by --ddp-bucket-size: write that"},
      {"--ddp-average-in-collective",
       "gradients are scaled by 1/DP before they are summed here (Megatron's default): drop the flag"},
      {"--fp16-lm-cross-entropy", "the cross entropy runs in fp32 here (Megatron's default): drop the flag"},
      {"--check-for-large-grads",
       "Megatron's rerun state machine is not built: a non-finite loss or gradient stops the run (or skips the "
       "step, with --no-check-for-nan-in-loss-and-grad); drop the flag"},
      {"--squared-relu", "squared ReLU is not built: the MLP's activation is GELU, or SwiGLU with --swiglu"},
      {"--use-legacy-models", "Megatron-Core's GPT model is the only model here; drop the flag"},
      {"--apply-layernorm-1p", "norm weights are used as stored, not as 1 + w: drop the flag"},
      {"--use-pytorch-profiler", torch_profiler},
      {"--pytorch-profiler-collect-shapes", torch_profiler},
      {"--pytorch-profiler-collect-callstack", torch_profiler},
      {"--pytorch-profiler-collect-chakra", torch_profiler},
      {"--record-shapes", torch_profiler},
      {"--nvtx-ranges",
       "no NVTX ranges are emitted: nsys with --profile shows the kernels by name, and "
       "--profile-ops-iteration N prints the time of each op family"},
      {"--record-memory-history", memory_history},
      {"--memory-snapshot-path", memory_history},
      {"--logging-level", "the log lines here are Megatron's prints, at one level: drop the flag"},
      {"--grad-reduce-in-bf16", "gradients reduce in fp32 here: drop the flag"},
      {"--num-distributed-optimizer-instances",
       "the distributed optimizer shards over the whole data-parallel group here: drop the flag"},
      {"--multi-latent-attention", mla},
      {"--q-lora-rank", mla},
      {"--kv-lora-rank", mla},
      {"--qk-head-dim", mla},
      {"--qk-pos-emb-head-dim", mla},
      {"--v-head-dim", mla},
      {"--mtp-num-layers", "multi-token prediction is not built: drop the flag"},
      {"--rotary-scaling-factor", yarn},
      {"--mscale", yarn},
      {"--mscale-all-dim", yarn},
      {"--softmax-type", gpt_oss},
      {"--window-attn-skip-freq", gpt_oss},
      {"--quick-geglu", gpt_oss},
      {"--glu-linear-offset", gpt_oss},
      {"--activation-func-clamp-value", gpt_oss},
      {"--enable-gpt-oss", gpt_oss},
      {"--megatron-fsdp-main-params-dtype", fsdp_dtypes},
      {"--megatron-fsdp-main-grads-dtype", fsdp_dtypes},
      {"--megatron-fsdp-grad-comm-dtype", fsdp_dtypes},
      {"--outer-dp-sharding-strategy",
       "hybrid sharding (HSDP) is not built: Megatron FSDP shards over the whole "
       "data-parallel group here; drop the flag"},
      {"--step-batch-size-schedule",
       "the batch size grows here by Megatron's --rampup-batch-size START INCREMENT "
       "SAMPLES: write that"},
      {"--per-split-data-args-path",
       "give the blends on the command line or in --config YAML: --train-data-path, "
       "--valid-data-path, --test-data-path"},
      {"--sft", "supervised fine-tuning data (conversations, prompt formats) is not built: pretraining data only"},
      {"--moe-per-layer-logging", "the log carries the MoE losses summed over the layers: drop the flag"},
      {"--moe-flex-dispatcher-backend",
       "the flex token dispatcher (DeepEP, HybridEP) is not built: "
       "--moe-token-dispatcher-type allgather or alltoall"},
      {"--mtp-loss-scaling-factor", "multi-token prediction is not built: drop the flag"},
      {"--distribute-saved-activations", "drop the flag; --sequence-parallel splits activations over the TP ranks"},
      {"--use-custom-fsdp", fsdp},
      {"--use-torch-fsdp2", fsdp},
      {"--wandb-project", wandb},
      {"--wandb-exp-name", wandb},
      {"--wandb-save-dir", wandb},
      {"--yaml-cfg",
       "Megatron's nested YAML configuration is not read: --config takes a YAML file of flag values "
       "(keys: flag names without the leading dashes)"},
      {"--spec", "the layers here are Megatron-Core's GPT layers, chosen by flags; no module spec is read"},
      {"--encoder-num-layers", "a GPT model's depth is --num-layers: write that"},
      {"--decoder-num-layers", "a GPT model's depth is --num-layers: write that"},
      {"--no-rope-freq", "RoPE is applied in every layer here (Llama-4's layers without it are not built)"},
      {"--moe-use-upcycling", "turning a dense checkpoint into an MoE model is not built"},
      {"--hybrid-layer-pattern", hybrid},
      {"--hybrid-override-pattern", hybrid},
      {"--heterogeneous-layers-config-path", hybrid},
      {"--heterogeneous-layers-config-encoded-json", hybrid},
  };
  for (const char* flag :
       {"--fim-data", "--fim-rate", "--fim-spm-rate", "--fim-split-sample", "--fim-fragment-rate", "--fim-no-prefix",
        "--fim-prefix-token", "--fim-middle-token", "--fim-suffix-token", "--fim-pad-token", "--fim-eod-token"})
    not_built.push_back({flag, fim});
  for (const char* flag :
       {"--muon-momentum", "--muon-nesterov", "--muon-num-ns-steps", "--muon-scale-mode", "--muon-tp-mode",
        "--muon-extra-scale-factor", "--muon-fp32-matmul-prec", "--muon-no-split-qkv", "--muon-coefficient-type",
        "--muon-scalar-optimizer", "--muon-use-syrk"})
    not_built.push_back({flag, adam_only});
  return not_built;
}

const flags::FlagTable<TrainingArgs>& flag_table() {
  static const flags::FlagTable<TrainingArgs> table("megatron train", kTrainIntro, build_flag_table(), nullptr,
                                                    megatron_flags_not_built());
  return table;
}

// Layers in increasing precedence (YAML, then the command line). The preset is the starting
// point under all of them, whichever layer names it.
TrainingArgs resolve(const std::vector<std::vector<flags::Assignment>>& layers, int64_t world_size,
                     std::vector<std::string> problems) {
  const flags::FlagTable<TrainingArgs>& table = flag_table();
  TrainingArgs args;
  const size_t preset_flag = table.index_of("--model-preset");
  for (auto layer = layers.rbegin(); layer != layers.rend(); ++layer) {
    const auto it =
        std::find_if(layer->begin(), layer->end(), [&](const flags::Assignment& a) { return a.flag == preset_flag; });
    if (it == layer->end()) continue;
    // An unknown name is reported when the assignment is written below.
    if (const ModelPreset* preset = find_model_preset(it->values.front())) apply_model_preset(*preset, args.model);
    break;
  }
  table.apply(layers, args, problems);
  if (!problems.empty()) flags::throw_problems(problems, "(the consistency checks run once these are fixed)");
  args.world_size = world_size;
  derive_training_args(args);
  const std::vector<std::string> invalid = validate(args);
  if (!invalid.empty()) flags::throw_problems(invalid);
  return args;
}

// ---- derivation and validation ----------------------------------------------------------------

// The tokenizer's vocabulary size, or nullopt with the reason in *why. The tokenizer itself
// knows which flags it needs and rejects those it does not take, so it is built here.
std::optional<int64_t> known_vocab_size(const datasets::TokenizerOptions& tokenizer, std::string* why) {
  if (tokenizer.type.empty()) {
    *why = concat("--tokenizer-type is required (or --load of a checkpoint, which holds its tokenizer): e.g. ",
                  "GPT2BPETokenizer with --vocab-file/--merge-file, HuggingFaceTokenizer with --tokenizer-model, ",
                  "or NullTokenizer with --vocab-size N for --mock-data");
    return std::nullopt;
  }
  try {
    return datasets::make_tokenizer(tokenizer)->vocab_size();
  } catch (const Error& e) {
    *why = e.what();
    return std::nullopt;
  }
}

// --split weights (Megatron reads every run of [.0-9] as a number), or nullopt if malformed.
std::optional<std::vector<double>> split_weights(const std::string& split) {
  std::vector<double> weights;
  size_t i = 0;
  while (i < split.size()) {
    const size_t begin = split.find_first_of(".0123456789", i);
    if (begin == std::string::npos) break;
    const size_t end = std::min(split.find_first_not_of(".0123456789", begin), split.size());
    const auto weight = flags::parse_double(std::string_view(split).substr(begin, end - begin));
    if (!weight) return std::nullopt;
    weights.push_back(*weight);
    i = end;
  }
  if (weights.empty() || weights.size() > 3 || std::accumulate(weights.begin(), weights.end(), 0.0) <= 0.0) {
    return std::nullopt;
  }
  weights.resize(3, 0.0);
  return weights;
}

void require_positive(std::vector<std::string>& errors, int64_t value, const char* flag, const char* fix) {
  if (value > 0) return;
  errors.push_back(value == 0 ? concat(flag, " is required (got 0): ", fix)
                              : concat(flag, " ", value, " must be positive: ", fix));
}

// Megatron's assertions on the ramp, and every batch size of it whole micro-batches on every replica.
void check_rampup(const TrainingArgs& a, std::vector<std::string>& errors) {
  if (a.rampup_batch_size.empty()) return;
  const std::optional<BatchSizeRampup> r = a.batch_size_rampup();
  if (!r) {
    errors.push_back(concat("--rampup-batch-size ", flags::join(a.rampup_batch_size, " "),
                            " must be three whole numbers START INCREMENT SAMPLES, e.g. 32 32 1000000"));
    return;
  }
  if (a.train_samples == 0)
    errors.push_back(
        concat("--rampup-batch-size needs --train-samples (Megatron ramps only sample-based training): "
               "give the length in samples instead of --train-iters"));
  const int64_t per_step = a.micro_batch_size * a.data_parallel_size;
  if (r->start <= 0 || r->increment <= 0 || r->samples < 0) {
    errors.push_back(concat("--rampup-batch-size ", r->start, " ", r->increment, " ", r->samples,
                            ": START and INCREMENT must be positive and SAMPLES >= 0"));
  } else if (r->start >= a.global_batch_size || (a.global_batch_size - r->start) % r->increment != 0) {
    errors.push_back(concat("--rampup-batch-size ", r->start, " ", r->increment, " ", r->samples,
                            " must ramp up to --global-batch-size ", a.global_batch_size,
                            " in whole increments: START below it and (", a.global_batch_size,
                            " - START) a multiple of INCREMENT"));
  } else if (per_step > 0 && (r->start % per_step != 0 || r->increment % per_step != 0)) {
    errors.push_back(concat("--rampup-batch-size START ", r->start, " and INCREMENT ", r->increment,
                            " must be multiples of --micro-batch-size x data-parallel size = ", per_step,
                            ": every step runs whole micro-batches on every replica"));
  }
}

void check_batch(const TrainingArgs& a, std::vector<std::string>& errors) {
  require_positive(errors, a.micro_batch_size, "--micro-batch-size", "set e.g. --micro-batch-size 8");
  if (a.train_samples == 0) {
    require_positive(errors, a.train_iters, "--train-iters", "set e.g. --train-iters 1000 (or --train-samples N)");
  } else if (a.train_iters != 0) {
    errors.push_back(concat("--train-iters ", a.train_iters, " and --train-samples ", a.train_samples,
                            " are mutually exclusive: train for a number of steps or of samples; keep one"));
  } else if (a.global_batch_size > 0 && a.train_samples < a.global_batch_size) {
    errors.push_back(concat("--train-samples ", a.train_samples, " is less than one global batch (",
                            a.global_batch_size, " samples): train on at least that many"));
  }
  const int64_t per_step = a.micro_batch_size * a.data_parallel_size;
  if (a.global_batch_size <= 0 && a.micro_batch_size > 0) {
    errors.push_back(concat("--global-batch-size ", a.global_batch_size,
                            " must be positive: leave it unset to use micro-batch-size * DP"));
  } else if (per_step > 0 && a.global_batch_size % per_step != 0) {
    errors.push_back(concat("--global-batch-size ", a.global_batch_size, " is not a multiple of --micro-batch-size ",
                            a.micro_batch_size, " x data-parallel size ", a.data_parallel_size, " = ", per_step,
                            ": each step runs whole micro-batches on every replica; use e.g. ",
                            (a.global_batch_size + per_step - 1) / per_step * per_step));
  }
  if (a.seed < 0) errors.push_back(concat("--seed ", a.seed, " must be >= 0: use e.g. 1234"));
}

// Megatron's scheduler lengths come in iterations (with --train-iters) or in samples (with
// --train-samples), never mixed; warmup must end before the decay does.
// The layers' split over pipeline stages, then the schedule's shape (once the batch is valid).
void check_pipeline(const TrainingArgs& a, std::vector<std::string>& errors) {
  if (a.model.num_layers <= 0) return;
  const std::vector<std::string> split_errors =
      pipeline_parallel::validate_pipeline_split(a.parallel, a.model.num_layers);
  errors.insert(errors.end(), split_errors.begin(), split_errors.end());
  const int64_t per_step = a.micro_batch_size * a.data_parallel_size;
  if (!split_errors.empty() || per_step <= 0 || a.global_batch_size <= 0 || a.global_batch_size % per_step != 0) return;
  const pipeline_parallel::ScheduleShape shape{
      .pipeline_size = a.parallel.pipeline_model_parallel_size,
      .virtual_stages = pipeline_parallel::pipeline_split(a.parallel, a.model.num_layers).virtual_stages,
      .microbatches = a.global_batch_size / per_step,
      .microbatch_group_size = a.parallel.microbatch_group_size_per_virtual_pipeline_stage.value_or(0),
      .overlap_p2p = a.pipeline_overlaps_p2p()};
  for (std::string& e : pipeline_parallel::validate(shape)) errors.push_back(std::move(e));
  if (shape.pipeline_size == 1) return;
  // Every batch size of a ramp runs the interleaved schedule too: whole groups of micro-batches.
  const std::optional<BatchSizeRampup> ramp = a.batch_size_rampup();
  if (shape.virtual_stages > 1 && ramp && ramp->start > 0 && ramp->increment > 0 &&
      ((ramp->start / per_step) % shape.group_size() != 0 || (ramp->increment / per_step) % shape.group_size() != 0))
    errors.push_back(concat("--rampup-batch-size START ", ramp->start, " and INCREMENT ", ramp->increment,
                            " with the interleaved schedule: each batch size's micro-batches (batch / (micro-batch "
                            "size x DP = ",
                            per_step, ")) must be a multiple of the group size ", shape.group_size(),
                            " (--microbatch-group-size-per-virtual-pipeline-stage, default the pipeline size); fix: "
                            "make START and INCREMENT multiples of ",
                            per_step * shape.group_size()));
}

// The embedding and output layer's schedule obeys --lr's rules (Megatron checks neither).
void check_decoupled_lr(const OptimizerArgs& o, std::vector<std::string>& errors) {
  if (!o.decoupled_lr) {
    if (o.decoupled_min_lr)
      errors.push_back(concat("--decoupled-min-lr ", *o.decoupled_min_lr,
                              " without --decoupled-lr: it is the end of --decoupled-lr's schedule; give "
                              "--decoupled-lr too, or drop it"));
    return;
  }
  const double max_lr = *o.decoupled_lr;
  if (!(max_lr > 0.0)) {
    errors.push_back(concat("--decoupled-lr ", max_lr, " must be positive: e.g. --decoupled-lr 1e-4"));
    return;
  }
  const double min_lr = o.decoupled_min_lr.value_or(o.min_lr);
  if (o.decoupled_min_lr && min_lr < 0.0) {
    errors.push_back(concat("--decoupled-min-lr ", min_lr, " must be >= 0"));
  } else if (min_lr > max_lr) {
    errors.push_back(o.decoupled_min_lr
                         ? concat("--decoupled-min-lr ", min_lr, " exceeds --decoupled-lr ", max_lr,
                                  ": the schedule decays from one down to the other; lower --decoupled-min-lr")
                         : concat("--min-lr ", min_lr, " exceeds --decoupled-lr ", max_lr,
                                  ": the embedding and output layer decay to --min-lr unless --decoupled-min-lr "
                                  "is given; give a lower --decoupled-min-lr"));
  }
  if (o.lr_warmup_init > max_lr)
    errors.push_back(concat("--lr-warmup-init ", o.lr_warmup_init, " exceeds --decoupled-lr ", max_lr,
                            ": the embedding and output layer's warmup rises from it to --decoupled-lr; lower "
                            "--lr-warmup-init"));
}

void check_schedule(const TrainingArgs& a, std::vector<std::string>& errors) {
  const OptimizerArgs& o = a.optimizer;
  if (!(o.lr > 0.0)) {
    errors.push_back(o.lr == 0.0 ? std::string("--lr is required (got 0): set the peak learning rate, e.g. --lr 3e-4")
                                 : concat("--lr ", o.lr, " must be positive: e.g. --lr 3e-4"));
  }
  if (o.min_lr < 0.0) {
    errors.push_back(concat("--min-lr ", o.min_lr, " must be >= 0: e.g. --min-lr 3e-5"));
  } else if (o.lr > 0.0 && o.min_lr > o.lr) {
    errors.push_back(concat("--min-lr ", o.min_lr, " exceeds --lr ", o.lr,
                            ": the schedule decays from lr down to min_lr; lower --min-lr"));
  }
  if (o.lr_warmup_init < 0.0) errors.push_back(concat("--lr-warmup-init ", o.lr_warmup_init, " must be >= 0"));
  if (o.lr > 0.0 && o.lr_warmup_init > o.lr) {
    errors.push_back(concat("--lr-warmup-init ", o.lr_warmup_init, " exceeds --lr ", o.lr,
                            ": warmup rises from it to lr; lower --lr-warmup-init"));
  }
  check_decoupled_lr(o, errors);
  // The lengths of this run's unit, and those of the other unit, which must stay unset.
  const bool by_samples = a.train_samples > 0;
  const char* unit = by_samples ? "samples" : "iters";
  const int64_t decay = by_samples ? o.lr_decay_samples : o.lr_decay_iters;
  const int64_t warmup = by_samples ? o.lr_warmup_samples : o.lr_warmup_iters;
  const int64_t wsd = by_samples ? o.lr_wsd_decay_samples : o.lr_wsd_decay_iters;
  const std::pair<const char*, int64_t> other[3] = {
      {by_samples ? "--lr-decay-iters" : "--lr-decay-samples", by_samples ? o.lr_decay_iters : o.lr_decay_samples},
      {by_samples ? "--lr-warmup-iters" : "--lr-warmup-samples", by_samples ? o.lr_warmup_iters : o.lr_warmup_samples},
      {by_samples ? "--lr-wsd-decay-iters" : "--lr-wsd-decay-samples",
       by_samples ? o.lr_wsd_decay_iters : o.lr_wsd_decay_samples}};
  for (const auto& [flag, value] : other) {
    if (value != 0) {
      errors.push_back(concat(flag, " ", value, " does not go with ", by_samples ? "--train-samples" : "--train-iters",
                              ": the schedule is counted in ", by_samples ? "samples" : "iterations",
                              " (Megatron); use --lr-*-", unit, " flags, or train with ",
                              by_samples ? "--train-iters" : "--train-samples"));
    }
  }
  if (warmup < 0) errors.push_back(concat("--lr-warmup-", unit, " ", warmup, " must be >= 0"));
  const bool trains = a.train_iters > 0 || a.train_samples > 0;
  if (decay < 0 || (decay == 0 && trains)) {
    errors.push_back(concat("--lr-decay-", unit, " ", decay, " must be positive: leave it unset to use --train-",
                            by_samples ? "samples" : "iters"));
  }
  if (o.lr_warmup_fraction && warmup != 0) {
    errors.push_back(concat("--lr-warmup-fraction ", *o.lr_warmup_fraction, " and --lr-warmup-", unit, " ", warmup,
                            " are mutually exclusive: warmup is a fraction of the decay or a ", "count of ",
                            by_samples ? "samples" : "iterations", "; keep one"));
  } else if (o.lr_warmup_fraction && !(*o.lr_warmup_fraction >= 0.0 && *o.lr_warmup_fraction < 1.0)) {
    errors.push_back(concat("--lr-warmup-fraction ", *o.lr_warmup_fraction,
                            " must lie in [0, 1): warmup must end before the decay does; e.g. 0.01"));
  } else if (!o.lr_warmup_fraction && decay > 0 && warmup >= decay) {
    errors.push_back(concat("--lr-warmup-", unit, " ", warmup, " is not below --lr-decay-", unit, " ", decay,
                            ": Megatron's scheduler needs warmup < decay; shorten the warmup"));
  }
  if (o.lr_decay_style == LrDecayStyle::WSD && wsd <= 0) {
    errors.push_back(concat("--lr-decay-style WSD needs --lr-wsd-decay-", unit, " (got ", wsd,
                            "): the length of the final anneal, e.g. a tenth of --lr-decay-", unit));
  } else if (wsd < 0 || wsd > decay) {
    errors.push_back(concat("--lr-wsd-decay-", unit, " ", wsd, " must lie in [0, --lr-decay-", unit, " ", decay,
                            "]: the anneal is the end of the decay"));
  }
}

void check_optimizer(const OptimizerArgs& o, std::vector<std::string>& errors) {
  if (o.optimizer != "adam")
    errors.push_back(concat("--optimizer ", o.optimizer,
                            " is not built here: the optimizer is Adam with decoupled weight decay (Megatron's "
                            "adam); write --optimizer adam or drop the flag"));
  if (o.weight_decay < 0.0) errors.push_back(concat("--weight-decay ", o.weight_decay, " must be >= 0: e.g. 0.1"));
  if (o.clip_grad < 0.0) errors.push_back(concat("--clip-grad ", o.clip_grad, " must be >= 0 (0 disables): e.g. 1"));
  for (const auto& [beta, flag] : {std::pair{o.adam_beta1, "--adam-beta1"}, std::pair{o.adam_beta2, "--adam-beta2"}}) {
    if (!(beta >= 0.0 && beta < 1.0)) {
      errors.push_back(concat(flag, " ", beta, " must lie in [0, 1): it is a moving-average decay; e.g. 0.9"));
    }
  }
  if (!(o.adam_eps > 0.0)) errors.push_back(concat("--adam-eps ", o.adam_eps, " must be positive: e.g. 1e-8"));
  if (!(o.optimizer_offload_fraction >= 0.0 && o.optimizer_offload_fraction <= 1.0))
    errors.push_back(concat("--optimizer-offload-fraction ", o.optimizer_offload_fraction,
                            " must lie in [0, 1]: the share of the optimizer state kept on the host, e.g. 1.0"));
  for (const auto& [value, flag] :
       {std::pair{&o.main_grads_dtype, "--main-grads-dtype"}, std::pair{&o.main_params_dtype, "--main-params-dtype"},
        std::pair{&o.exp_avg_dtype, "--exp-avg-dtype"}, std::pair{&o.exp_avg_sq_dtype, "--exp-avg-sq-dtype"}}) {
    if (*value != "fp32")
      errors.push_back(concat(flag, " ", *value,
                              ": only fp32 optimizer state is built here (Megatron's lower-precision state is not); "
                              "drop the flag"));
  }
}

void check_data(const TrainingArgs& a, std::vector<std::string>& errors) {
  const DataArgs& d = a.data;
  if (d.dataloader_type != "single")
    errors.push_back(concat("--dataloader-type ", d.dataloader_type,
                            " is not built here: the loader is Megatron's single sampler (each global batch the "
                            "next samples of the dataset's order, resumed at the consumed samples); give single or "
                            "drop the flag"));
  const bool has_path = !d.data_path.empty();
  const bool per_split = d.has_per_split_paths();
  if (d.mock_data && (has_path || per_split)) {
    errors.push_back(
        "--mock-data and data paths are mutually exclusive: train on files or on synthetic data; "
        "drop one");
  } else if (has_path && per_split) {
    errors.push_back(
        "--data-path and --train/valid/test-data-path are mutually exclusive: give one blend with --split, "
        "or one blend per split");
  } else if (!d.mock_data && !has_path && d.train_data_path.empty()) {
    errors.push_back(
        "no training data: give --data-path PREFIX (PREFIX.bin/.idx), --train-data-path PREFIX or --mock-data");
  }
  if (per_split && a.eval_interval > 0 && d.valid_data_path.empty())
    errors.push_back(concat("--eval-interval ", a.eval_interval,
                            " with per-split paths needs --valid-data-path, or set --eval-interval 0"));
  if (per_split && a.eval_interval == 0 && (!d.valid_data_path.empty() || !d.test_data_path.empty()))
    errors.push_back(
        "--valid-data-path and --test-data-path are evaluated only with --eval-interval N (validation every N "
        "iterations and after training, the test data after training): add it, or drop the paths");
  if (d.num_workers < 0) errors.push_back(concat("--num-workers ", d.num_workers, " must be >= 0"));
  if (a.seed < 0 || a.seed > 4294967295LL)
    errors.push_back(concat("--seed ", a.seed, " must lie in [0, 2^32-1] (numpy's RandomState range)"));
  std::string why;
  if (!known_vocab_size(a.tokenizer, &why)) errors.push_back(why);

  const auto weights = split_weights(d.split);
  if (has_path && !weights) {
    errors.push_back(
        concat("--split '", d.split, "' must hold one to three weights >= 0 with a positive sum, ", "e.g. 969,30,1"));
  }
  if (a.eval_interval < 0) errors.push_back(concat("--eval-interval ", a.eval_interval, " must be >= 0 (0: none)"));
  if (a.eval_interval > 0 && a.eval_iters <= 0) {
    errors.push_back(concat("--eval-iters ", a.eval_iters, " must be positive when --eval-interval is set: e.g. 10"));
  }
  // Mock data always has a validation split (Megatron forces 1,1,1).
  if (a.eval_interval > 0 && has_path && !d.mock_data && weights && (*weights)[1] <= 0.0) {
    errors.push_back(concat("--eval-interval ", a.eval_interval, " needs a validation split but --split '", d.split,
                            "' gives it weight 0: give it one, e.g. --split 969,30,1, or set --eval-interval 0"));
  }
}

// Megatron FSDP's flags. The strategy acts only with --use-megatron-fsdp (Megatron ignores it
// otherwise; we refuse a value that would do nothing). The sharded strategies run on the
// distributed optimizer (Megatron-FSDP's guide requires --use-distributed-optimizer); no_shard
// replicates its state, so the flag would shard nothing there. Sharded gradients and parameters
// are built for TP x DP layouts of dense models only.
void check_megatron_fsdp(const TrainingArgs& a, std::vector<std::string>& errors) {
  const std::string& strategy = a.data_parallel_sharding_strategy;
  if (!a.use_megatron_fsdp) {
    if (strategy != "no_shard")
      errors.push_back(concat("--data-parallel-sharding-strategy ", strategy,
                              " takes effect only with --use-megatron-fsdp: add it (for optim alone, "
                              "--use-distributed-optimizer is the same), or drop the strategy"));
    return;
  }
  if (strategy == "no_shard" && a.use_distributed_optimizer)
    errors.push_back(
        "--use-megatron-fsdp --data-parallel-sharding-strategy no_shard replicates the optimizer state, so "
        "--use-distributed-optimizer would shard nothing: drop it, or pick --data-parallel-sharding-strategy optim");
  if (strategy != "no_shard" && !a.use_distributed_optimizer)
    errors.push_back(concat("--use-megatron-fsdp --data-parallel-sharding-strategy ", strategy,
                            " shards the optimizer state with the distributed optimizer: add "
                            "--use-distributed-optimizer (as Megatron-FSDP requires)"));
  if (strategy != "optim_grads" && strategy != "optim_grads_params") return;
  const ParallelArgs& p = a.parallel;
  const auto refuse = [&](const std::string& what, const std::string& fix) {
    errors.push_back(concat("--data-parallel-sharding-strategy ", strategy, " with ", what,
                            ": sharded gradients and parameters are built for tensor x data parallelism of dense "
                            "models only; ",
                            fix));
  };
  if (p.pipeline_model_parallel_size > 1)
    refuse(concat("--pipeline-model-parallel-size ", p.pipeline_model_parallel_size),
           "drop the pipeline, or shard the optimizer state only (--data-parallel-sharding-strategy optim)");
  if (p.context_parallel_size > 1)
    refuse(concat("--context-parallel-size ", p.context_parallel_size),
           "drop context parallelism, or use --data-parallel-sharding-strategy optim");
  if (a.model.moe.num_moe_experts > 0)
    refuse(concat("--num-experts ", a.model.moe.num_moe_experts),
           "train the MoE model with --data-parallel-sharding-strategy optim");
}

void check_data_parallel(const TrainingArgs& a, std::vector<std::string>& errors) {
  if (a.overlap_param_gather && !(a.use_distributed_optimizer && a.overlap_grad_reduce)) {
    errors.push_back(
        "--overlap-param-gather needs --use-distributed-optimizer and --overlap-grad-reduce (as in Megatron): "
        "only sharded parameters are gathered; add both or drop --overlap-param-gather");
  }
  check_megatron_fsdp(a, errors);
  if (a.ddp_bucket_size < 0) {
    errors.push_back(concat("--ddp-bucket-size ", a.ddp_bucket_size,
                            " must be >= 0 elements: leave it unset for max(40000000, 1000000 * DP)"));
  }
  if (!(a.distributed_timeout_minutes > 0.0)) {
    errors.push_back(concat("--distributed-timeout-minutes ", a.distributed_timeout_minutes,
                            " must be positive: e.g. 10 (Megatron's default)"));
  }
}

// The scale is a float (as Megatron's float32 tensor): every scale must be positive and fit it.
void check_mixed_precision(const TrainingArgs& a, std::vector<std::string>& errors) {
  const OptimizerArgs& o = a.optimizer;
  if (a.fp16 && a.bf16) errors.push_back("--fp16 and --bf16 are both given: choose one precision");
  for (std::string& e : validate_fp8(a.model.fp8, a.model.num_layers)) errors.push_back(std::move(e));
  if (a.model.fp8.enabled()) {
    if (!a.bf16)
      errors.push_back(concat("--fp8-format ", a.model.fp8.fp8_format,
                              " runs the GEMMs in FP8 around bf16 activations and weights: add --bf16"));
    if (a.device == "cpu")
      errors.push_back(concat("--fp8-format ", a.model.fp8.fp8_format,
                              " needs a GPU (FP8 tensor cores, compute capability 8.9+) but --device is cpu: run on a "
                              "GPU, or drop --fp8-format"));
  }
  if (a.model.fp8.enabled() && a.model.fp8.fp8_param_gather) {
    // The distributed optimizer casts the FP8 weights from its f32 masters (distributed/fp8_params.h).
    if (!a.use_distributed_optimizer)
      errors.push_back(
          "--fp8-param-gather needs --use-distributed-optimizer (Megatron's rule): its masters are cast into the "
          "FP8 weights after each step; add it");
    if (a.use_megatron_fsdp && a.data_parallel_sharding_strategy != "optim" &&
        a.data_parallel_sharding_strategy != "no_shard")
      errors.push_back(concat("--fp8-param-gather with --data-parallel-sharding-strategy ",
                              a.data_parallel_sharding_strategy,
                              ": FP8 parameters are not built with sharded gradients or parameters here; use "
                              "--data-parallel-sharding-strategy optim, or drop --fp8-param-gather"));
    if (o.optimizer_cpu_offload || o.use_precision_aware_optimizer)
      errors.push_back(concat("--fp8-param-gather with ",
                              o.optimizer_cpu_offload ? "--optimizer-cpu-offload" : "--use-precision-aware-optimizer",
                              ": FP8 parameters keep f32 masters on the device and are not built with it here; drop "
                              "one of the two"));
  }
  if (a.fp16 && a.parallel.expert_model_parallel_size > 1)
    errors.push_back(concat("--fp16 with --expert-model-parallel-size ", a.parallel.expert_model_parallel_size,
                            ": expert parallelism does not train in fp16 (Megatron's rule); use --bf16"));
  const auto check_scale = [&](const char* flag, double value, const char* example) {
    if (!(value > 0.0 && value <= double(std::numeric_limits<float>::max())))
      errors.push_back(
          concat(flag, " ", value, " must be positive and at most 3.4e38 (float's range): e.g. ", example));
  };
  if (o.loss_scale) check_scale("--loss-scale", *o.loss_scale, "65536");
  check_scale("--initial-loss-scale", o.initial_loss_scale, "4294967296 (2^32, the default)");
  check_scale("--min-loss-scale", o.min_loss_scale, "1 (the default)");
  if (o.min_loss_scale > o.initial_loss_scale)
    errors.push_back(concat("--min-loss-scale ", o.min_loss_scale, " exceeds --initial-loss-scale ",
                            o.initial_loss_scale,
                            ": the scale starts at the initial value and never falls below the "
                            "minimum; lower --min-loss-scale"));
  if (!(o.loss_scale_window >= 1.0 && o.loss_scale_window == std::floor(o.loss_scale_window) &&
        o.loss_scale_window <= 1e15))
    errors.push_back(concat("--loss-scale-window ", o.loss_scale_window,
                            " must be a whole number of iterations >= 1: e.g. 1000 (the default)"));
  if (o.hysteresis < 1)
    errors.push_back(concat("--hysteresis ", o.hysteresis, " must be >= 1 overflow: e.g. 2 (the default)"));
}

// Megatron's implementation choices change nothing here, but their values follow Megatron's rules.
void check_implementation_choices(const TrainingArgs& a, std::vector<std::string>& errors) {
  const MegatronImplementationChoices& c = a.implementation;
  if (c.empty_unused_memory_level < 0 || c.empty_unused_memory_level > 2)
    errors.push_back(concat("--empty-unused-memory-level ", c.empty_unused_memory_level,
                            " must be 0, 1 or 2 (as in Megatron; it has no effect here)"));
  if (c.manual_gc_interval < 0)
    errors.push_back(
        concat("--manual-gc-interval ", c.manual_gc_interval, " must be >= 0 (as in Megatron; it has no effect here)"));
  if (c.fsdp_manual_registration && !c.nccl_ub)
    errors.push_back(
        "--fsdp-manual-registration registers NCCL user buffers, so Megatron requires --use-nccl-ub "
        "beside it: add it, or drop the flag (neither changes anything here)");
  if (c.rope_type == "yarn")
    errors.push_back(
        "--rope-type yarn is not built here: RoPE is Megatron's rope type (with --use-rope-scaling for Llama-3.x); "
        "write rope or drop the flag");
  for (const auto& [count, flag] : {std::pair{c.num_dataset_builder_threads, "--num-dataset-builder-threads"},
                                    std::pair{c.dist_ckpt_workers, "--dist-ckpt-workers"}})
    if (count < 1) errors.push_back(concat(flag, " ", count, " must be >= 1 (as in Megatron; it has no effect here)"));
  if (c.moe_shared_expert_overlap && a.model.moe.moe_shared_expert_intermediate_size > 0 &&
      a.model.moe.moe_token_dispatcher_type != TokenDispatcherType::alltoall)
    errors.push_back(
        "--moe-shared-expert-overlap overlaps the shared expert with the alltoall token exchange, and Megatron "
        "refuses it beside --moe-token-dispatcher-type allgather: add --moe-token-dispatcher-type alltoall or drop "
        "the flag");
  if (!c.ckpt_format.empty() && c.ckpt_format != "torch_dist")
    errors.push_back(concat("--ckpt-format ", c.ckpt_format,
                            " is not built here: checkpoints here reshard at load as torch_dist's do (Megatron's "
                            "default); write torch_dist or drop the flag"));
  if (c.moe_router_dtype == "fp64")
    errors.push_back(
        "--moe-router-dtype fp64 is not built here: the router runs in fp32 (Megatron's --moe-router-dtype fp32); "
        "write fp32 or drop the flag");
  // Megatron's document masks (--reset-attention-mask) are built by its data loader, which the
  // flag tells not to; here they are always applied.
  if (!c.create_attention_mask_in_dataloader && a.data.reset_attention_mask)
    errors.push_back(
        "--no-create-attention-mask-in-dataloader with --reset-attention-mask: Megatron then builds no document "
        "masks, while here --reset-attention-mask always masks documents: drop one of the two");
  const bool rope = a.model.position_embedding_type == PositionEmbeddingType::rope;
  // Megatron turns --use-rotary-position-embeddings into rope; flags here are never rewritten
  // from one another, so the flag that chooses must be given.
  if (c.use_rotary_position_embeddings && !rope)
    errors.push_back(
        "--use-rotary-position-embeddings is Megatron's deprecated spelling of --position-embedding-type rope: add "
        "--position-embedding-type rope (or replace it with that)");
  if (!c.add_position_embedding && !rope)
    errors.push_back(
        "--no-position-embedding needs --position-embedding-type rope (Megatron refuses it otherwise too): add that "
        "for rotary embeddings, or write --position-embedding-type none for no position encoding");
}

// --log-params-norm reads the model's weights as each rank holds them after the step.
void check_params_norm(const TrainingArgs& a, std::vector<std::string>& errors) {
  if (!a.log_params_norm) return;
  if (a.model.fp8.enabled() && a.model.fp8.fp8_param_gather)
    errors.push_back(
        "--log-params-norm with --fp8-param-gather: the weights are held as FP8 codes, whose norm is not built "
        "here; drop one of the two");
  if (a.use_megatron_fsdp && a.data_parallel_sharding_strategy == "optim_grads_params")
    errors.push_back(
        "--log-params-norm with --data-parallel-sharding-strategy optim_grads_params: each rank holds a shard of "
        "the weights between steps, whose norm is not built here; use optim_grads, or drop --log-params-norm");
}

void check_run(const TrainingArgs& a, std::vector<std::string>& errors) {
  if (!a.save.empty() && a.save_interval <= 0) {
    errors.push_back(concat("--save ", a.save, " needs --save-interval N (got ", a.save_interval,
                            "): how many iterations between checkpoints, e.g. --save-interval 1000"));
  } else if (a.save_interval < 0) {
    errors.push_back(concat("--save-interval ", a.save_interval, " must be >= 0"));
  }
  if (a.ckpt_step < 0 || (a.ckpt_step > 0 && a.load.empty())) {
    errors.push_back(concat("--ckpt-step ", a.ckpt_step,
                            " chooses the iteration of --load DIR to resume from: give a saved iteration (> 0) and "
                            "--load, or leave it out to resume from the tracker's"));
  }
  if (a.override_ckpt_iteration && (*a.override_ckpt_iteration < 0 || a.load.empty() || a.finetune))
    errors.push_back(concat("--override-ckpt-iteration ", *a.override_ckpt_iteration,
                            " sets the iteration a run resumed from --load continues at: give an iteration >= 0 and "
                            "--load, without --finetune (which starts at iteration 0; Megatron refuses both too)"));
  if (a.finetune && a.load.empty()) {
    errors.push_back(
        "--finetune needs --load DIR: it starts from a checkpoint's weights; give --load or drop "
        "--finetune");
  }
  if (a.non_persistent_save_interval < 0)
    errors.push_back(concat("--non-persistent-save-interval ", a.non_persistent_save_interval, " must be >= 0"));
  if (a.non_persistent_ckpt_type == "global" || a.non_persistent_ckpt_type == "in_memory")
    errors.push_back(concat("--non-persistent-ckpt-type ", a.non_persistent_ckpt_type,
                            " is not built here: use --non-persistent-ckpt-type local with "
                            "--non-persistent-local-ckpt-dir DIR, or a shorter --save-interval"));
  if (a.non_persistent_save_interval > 0 && a.non_persistent_ckpt_type.empty())
    errors.push_back(concat("--non-persistent-save-interval ", a.non_persistent_save_interval,
                            " needs --non-persistent-ckpt-type local and --non-persistent-local-ckpt-dir DIR: "
                            "where the checkpoints go"));
  if (a.non_persistent_ckpt_type == "local" && a.non_persistent_local_ckpt_dir.empty())
    errors.push_back(
        "--non-persistent-ckpt-type local needs --non-persistent-local-ckpt-dir DIR: each rank writes its own "
        "checkpoints under DIR/rank_RRRRR (node-local storage is fine)");
  if (!a.non_persistent_local_ckpt_dir.empty() && a.non_persistent_ckpt_type != "local")
    errors.push_back(concat("--non-persistent-local-ckpt-dir ", a.non_persistent_local_ckpt_dir,
                            " is used only with --non-persistent-ckpt-type local: add it, or drop the directory"));
  if (a.keep_last_checkpoints < 0)
    errors.push_back(concat("--keep-last-checkpoints ", a.keep_last_checkpoints,
                            " must be >= 0: the number of newest checkpoints kept, e.g. 2 (0 keeps all)"));
  if (a.exit_interval < 0)
    errors.push_back(concat("--exit-interval ", a.exit_interval, " must be >= 0 iterations (0: never), e.g. 1000"));
  if (!(a.exit_duration_in_mins >= 0.0))
    errors.push_back(concat("--exit-duration-in-mins ", a.exit_duration_in_mins,
                            " must be >= 0 minutes (0: never), e.g. 230 for a 4-hour allocation"));
  if (a.timing_log_level < 0 || a.timing_log_level > 2)
    errors.push_back(concat("--timing-log-level ", a.timing_log_level,
                            " must be 0, 1 or 2 (Megatron's levels: 0 none, 1 the main timers, 2 all)"));
  if (a.straggler_minmax_count < 1)
    errors.push_back(concat("--straggler-minmax-count ", a.straggler_minmax_count, " must be >= 1"));
  if (a.profile && !(a.profile_step_start >= 0 && a.profile_step_end > a.profile_step_start))
    errors.push_back(concat("--profile-step-start ", a.profile_step_start, " and --profile-step-end ",
                            a.profile_step_end,
                            ": --profile captures the iterations after the start's and up to the end's, so they "
                            "need 0 <= start < end, e.g. 10 and 12"));
  for (const std::string& rank : a.profile_ranks) {
    const std::optional<int64_t> r = flags::parse_int(rank);
    if (!r || *r < 0 || (a.world_size > 0 && *r >= a.world_size))
      errors.push_back(concat("--profile-ranks ", rank, ": each must be a global rank, 0 to ",
                              a.world_size > 0 ? a.world_size - 1 : 0, " in this run of ", a.world_size, " rank(s)"));
  }
  if (!a.profile_ranks.empty() && !a.profile)
    errors.push_back("--profile-ranks is read only with --profile: add --profile, or drop the ranks");
  if (a.tensorboard_log_interval <= 0)
    errors.push_back(concat("--tensorboard-log-interval ", a.tensorboard_log_interval, " must be positive: e.g. 1"));
  if (a.tensorboard_queue_size <= 0)
    errors.push_back(concat("--tensorboard-queue-size ", a.tensorboard_queue_size, " must be positive: e.g. 1000"));
  if (a.log_interval <= 0) {
    errors.push_back(concat("--log-interval ", a.log_interval, " must be positive: e.g. --log-interval 10"));
  }
  // Restricted string fields may have been set by code rather than by the parser.
  flag_table().check_choices(a, errors);
}

}  // namespace

bool TrainingArgs::pipeline_overlaps_p2p() const {
  return parallel.overlap_p2p_comm && parallel.pipeline_model_parallel_size > 1 && model.num_layers > 0 &&
         pipeline_parallel::validate_pipeline_split(parallel, model.num_layers).empty() &&
         pipeline_parallel::pipeline_split(parallel, model.num_layers).virtual_stages > 1;
}

std::optional<BatchSizeRampup> TrainingArgs::batch_size_rampup() const {
  if (rampup_batch_size.size() != 3) return std::nullopt;
  int64_t values[3];
  for (size_t i = 0; i < 3; ++i) {
    const std::optional<int64_t> v = flags::parse_int(rampup_batch_size[i]);
    if (!v) return std::nullopt;
    values[i] = *v;
  }
  return BatchSizeRampup{values[0], values[1], values[2], global_batch_size};
}

int64_t TrainingArgs::total_iterations() const {
  if (train_samples == 0) return train_iters;
  const std::optional<BatchSizeRampup> rampup = batch_size_rampup();
  return rampup ? rampup->train_iterations(train_samples) : train_samples / global_batch_size;
}

int64_t TrainingArgs::global_batch_size_at(int64_t consumed_samples) const {
  const std::optional<BatchSizeRampup> rampup = batch_size_rampup();
  return rampup ? rampup->batch_size_at(consumed_samples) : global_batch_size;
}

datasets::TokenizerOptions tokenizer_options(const DataArgs& data) {
  return {data.tokenizer_type,
          data.vocab_size,
          data.tokenizer_model,
          data.vocab_file,
          data.merge_file,
          data.tiktoken_pattern,
          data.tiktoken_num_special_tokens,
          data.special_tokens};
}

std::vector<std::pair<std::string, std::string>> tokenizer_flags(const datasets::TokenizerOptions& options) {
  std::string specials;
  for (const std::string& t : options.special_tokens) specials += (specials.empty() ? "" : " ") + t;
  return {{"--tokenizer-type", options.type},
          {"--vocab-size", std::to_string(options.vocab_size)},
          {"--tokenizer-model", options.model},
          {"--vocab-file", options.vocab_file},
          {"--merge-file", options.merge_file},
          {"--tiktoken-pattern", options.tiktoken_pattern},
          {"--tiktoken-num-special-tokens", std::to_string(options.tiktoken_num_special_tokens)},
          {"--special-tokens", specials}};
}

int64_t tokenizer_vocab_size(const DataArgs& data) {
  std::string why;
  const std::optional<int64_t> size = known_vocab_size(tokenizer_options(data), &why);
  MEGATRON_CHECK(size, why);
  return *size;
}

void derive_training_args(TrainingArgs& a) {
  a.model.params_dtype = a.bf16 ? DType::bf16 : a.fp16 ? DType::f16 : DType::f32;
  a.tokenizer = run_tokenizer_options(tokenizer_options(a.data), a.load, a.ckpt_step);
  std::string unused;
  if (const auto vocab = known_vocab_size(a.tokenizer, &unused)) a.model.vocab_size = *vocab;
  if (const auto window = parse_window_size(a.window_size)) {
    a.model.window_size_left = window->first;
    a.model.window_size_right = window->second;
  }
  derive_model_fields(a.model, a.parallel.tensor_model_parallel_size);
  const ParallelSizes sizes = a.parallel.sizes();
  const int64_t model_parallel = sizes.tp * sizes.cp * sizes.pp;
  // A layout that does not divide the world keeps DP = 1; validate() reports it.
  if (model_parallel > 0 && a.world_size > 0 && a.world_size % model_parallel == 0) {
    a.data_parallel_size = a.world_size / model_parallel;
  }
  if (a.global_batch_size == 0) a.global_batch_size = a.micro_batch_size * a.data_parallel_size;
  if (a.optimizer.lr_decay_iters == 0) a.optimizer.lr_decay_iters = a.train_iters;
  if (a.optimizer.lr_decay_samples == 0) a.optimizer.lr_decay_samples = a.train_samples;
}

std::optional<std::pair<int64_t, int64_t>> parse_window_size(const std::string& text) {
  std::string digits;  // Megatron's tuple_type takes "L,R" and "(L,R)"
  for (char c : text)
    if (c != '(' && c != ')' && c != ' ') digits += c;
  const size_t comma = digits.find(',');
  if (comma == std::string::npos) return std::nullopt;
  const auto number = [](const std::string& t) -> std::optional<int64_t> {
    size_t used = 0;
    try {
      const int64_t v = std::stoll(t, &used);
      if (used == t.size()) return v;
    } catch (const std::exception&) {
    }
    return std::nullopt;
  };
  const auto left = number(digits.substr(0, comma)), right = number(digits.substr(comma + 1));
  if (!left || !right) return std::nullopt;
  return std::pair{*left, *right};
}

std::vector<std::string> validate(const TrainingArgs& args) {
  std::vector<std::string> errors = validate(args.model);
  if (!args.window_size.empty() && !parse_window_size(args.window_size)) {
    errors.push_back(concat("--window-size '", args.window_size,
                            "' is not two integers \"L,R\": give e.g. --window-size 4096,0 (-1 for unlimited)"));
  }
  // The vocabulary comes from the tokenizer: when that fails, check_data says why, and the
  // model's "vocab size 0" would only repeat it.
  if (args.model.vocab_size <= 0)
    std::erase_if(errors, [](const std::string& e) { return e.rfind("vocab size ", 0) == 0; });
  for (std::string& e : validate(args.parallel, args.world_size)) errors.push_back(std::move(e));
  for (std::string& e : validate_tensor_parallel_split(args.model, args.parallel)) errors.push_back(std::move(e));
  check_batch(args, errors);
  check_pipeline(args, errors);
  check_context_parallel(args, errors);
  const int64_t layers_per_pipeline_rank =
      args.model.num_layers / std::max<int64_t>(args.parallel.pipeline_model_parallel_size, 1);
  for (std::string& e : validate_recompute(args.model.recompute, layers_per_pipeline_rank))
    errors.push_back(std::move(e));
  check_rampup(args, errors);
  check_schedule(args, errors);
  check_optimizer(args.optimizer, errors);
  check_data(args, errors);
  check_data_parallel(args, errors);
  check_mixed_precision(args, errors);
  check_run(args, errors);
  check_params_norm(args, errors);
  check_implementation_choices(args, errors);
  return errors;
}

// The value of the last assignment to `flag` in any layer ("" when none).
std::string last_value(const std::vector<std::vector<flags::Assignment>>& layers, size_t flag) {
  std::string value;
  for (const auto& layer : layers)
    for (const flags::Assignment& a : layer)
      if (a.flag == flag && !a.values.empty()) value = a.values.front();
  return value;
}

// Megatron's --use-checkpoint-args, always on: a run that loads a checkpoint starts from the model
// flags that checkpoint was saved with, under every layer given (whose model flags must agree with
// the checkpoint anyway: check_same_architecture), so `train --load CKPT --finetune` needs no
// model flags. Empty when --load holds no checkpoint yet.
std::vector<flags::Assignment> checkpoint_model_layer(const std::vector<std::vector<flags::Assignment>>& layers,
                                                      std::vector<std::string>& problems) {
  const flags::FlagTable<TrainingArgs>& table = flag_table();
  const std::string load = last_value(layers, table.index_of("--load"));
  if (load.empty()) return {};
  int64_t ckpt_step = 0;
  try {
    const std::string step = last_value(layers, table.index_of("--ckpt-step"));
    if (!step.empty()) ckpt_step = std::stoll(step);
  } catch (const std::exception&) {
    return {};  // the table reports the value
  }
  std::vector<std::string> model_flags;
  for (const Flag& flag : build_flag_table())
    if ((flag.section == kModelSection || flag.section == kMoESection) && flag.name != "--model-preset")
      model_flags.push_back(flag.name);
  std::vector<std::pair<std::string, std::string>> pairs;
  for (auto& [flag, value] : saved_flags(load, ckpt_step))
    if (std::find(model_flags.begin(), model_flags.end(), flag) != model_flags.end())
      pairs.emplace_back(flag, std::move(value));
  return table.read_pairs(pairs, problems);
}

TrainingArgs parse_training_args(const std::vector<std::string>& argv, int64_t world_size) {
  std::vector<std::string> problems;
  auto layers = flags::read_command_line(flag_table().syntax(), argv, problems);
  layers.insert(layers.begin(), checkpoint_model_layer(layers, problems));
  return resolve(layers, world_size, std::move(problems));
}

TrainingArgs parse_training_args_from_flags(const std::vector<std::pair<std::string, std::string>>& flags,
                                            int64_t world_size) {
  std::vector<std::string> problems;
  std::vector<flags::Assignment> assignments = flag_table().read_pairs(flags, problems);
  return resolve({assignments}, world_size, std::move(problems));
}

std::string training_args_help() { return flag_table().help(); }

bool TrainingArgs::profiles_rank(int rank) const {
  return profile_ranks.empty() || std::any_of(profile_ranks.begin(), profile_ranks.end(), [rank](const std::string& r) {
           return flags::parse_int(r) == int64_t(rank);
         });
}

std::vector<std::string> flags_without_effect(const TrainingArgs& args) {
  const auto given = flag_table().to_flags(args), defaults = flag_table().to_flags(TrainingArgs{});
  const auto value_of = [](const std::vector<std::pair<std::string, std::string>>& pairs, const std::string& name) {
    return std::find_if(pairs.begin(), pairs.end(), [&](const auto& pair) { return pair.first == name; })->second;
  };
  std::vector<std::string> lines;
  for (const Flag& flag : build_flag_table()) {
    if (flag.section != kImplementationSection) continue;
    const std::string value = value_of(given, flag.name);
    if (value == value_of(defaults, flag.name)) continue;
    const bool takes_value = !std::holds_alternative<Switch>(flag.field);
    lines.push_back(concat(flag.name, takes_value ? " " + value : std::string(),
                           ": Megatron's implementation choice, no effect: ", flag.help));
  }
  return lines;
}

std::vector<std::pair<std::string, std::string>> training_args_to_flags(const TrainingArgs& args) {
  return flag_table().to_flags(args);
}

}  // namespace megatron
