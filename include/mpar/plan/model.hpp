#pragma once
/**
 * @file What the planner plans for: a GPT-style model (GPT-2's blocks or Llama's) and a cluster of identical GPUs.
 *
 * GPT-2's sizes follow Narayanan et al. (arXiv 2104.04473): a layer holds 12h^2 + 13h parameters, the
 * embedding V*h (word, tied with the output layer) + s*h (positions). A Llama layer holds 2h (two RMSNorm gains)
 * + h (a + 2 kv) d (the fused QKV, d = h / a) + h^2 (the output projection) + 3 h f (SwiGLU: gate and up [h, 2f],
 * down [f, h]), no biases; the model has a word embedding V*h, no positions, a final RMSNorm h and an untied head
 * V*h (docs/planner.md, "Llama").
 */
#include <cstddef>

#include "mpar/core/error.hpp"
#include "mpar/nn/model_family.hpp"

namespace mpar::plan {

using nn::ModelFamily;

/**
 * @brief A GPT-style decoder: `layers` transformer layers of width `hidden`, `heads` attention heads; with
 * `experts` > 0 every `moe_every`-th layer's MLP is a mixture of that many experts of width 4h, each token
 * routed to `moe_top_k` of them, `moe_capacity` the capacity factor (as `models::GptConfig`). `family` Llama:
 * Llama's blocks with `kv_heads` key/value heads (0: `heads`) and a SwiGLU MLP of width `ffn` (0: 4h).
 */
struct GptModel {
  std::size_t layers = 0, hidden = 0, heads = 0, seq = 0, vocab = 0;
  std::size_t experts = 0, moe_every = 1, moe_top_k = 2;
  double moe_capacity = 1.25;  ///< <= 0: unlimited (every expert may take every token)
  ModelFamily family = ModelFamily::gpt2;
  std::size_t kv_heads = 0;  ///< Llama: key/value heads of grouped-query attention (0: heads)
  std::size_t ffn = 0;       ///< the MLP width (0: 4h); GPT-2's is 4h

  [[nodiscard]] constexpr bool is_llama() const { return family == ModelFamily::llama; }
  /** Key/value heads: `kv_heads`, or `heads` (GPT-2's multi-head attention, or Llama's with kv_heads 0). */
  [[nodiscard]] constexpr std::size_t kv_head_count() const { return is_llama() && kv_heads > 0 ? kv_heads : heads; }
  [[nodiscard]] constexpr std::size_t ffn_size() const { return ffn ? ffn : 4 * hidden; }
  /** Llama: the fused QKV projection's columns, (a + 2 kv) d with d = h / a (h + 2 kv d: h for the queries). */
  [[nodiscard]] constexpr double qkv_width() const {
    return double(hidden) + 2.0 * double(kv_head_count()) * double(hidden / (heads ? heads : 1));
  }

  /** Whether layer `b` (0-based) holds a mixture of experts: layers moe_every - 1, 2 moe_every - 1, ... */
  [[nodiscard]] constexpr bool is_moe_layer(std::size_t b) const {
    return experts > 0 && moe_every > 0 && b % moe_every == moe_every - 1;
  }
  /** One expert: W1 [h, 4h] and W2 [4h, h], no biases (`parallel::MoeMlp`). */
  [[nodiscard]] constexpr double expert_parameters() const { return 8.0 * double(hidden) * double(hidden); }
  /**
   * An MoE layer: the dense layer without its MLP (8h^2 + 5h), with the gate [h, E] and every expert. The
   * pipeline-parallel count is `rank_parameters` and `rank_expert_parameters` (memory_model.hpp).
   */
  [[nodiscard]] constexpr double moe_layer_parameters() const {
    const double h = double(hidden);
    return 4.0 * h * h + 8.0 * h + h * double(experts) + double(experts) * expert_parameters();
  }

  /**
   * Parameters of one transformer layer. GPT-2: QKV 3h^2+3h, projection h^2+h, MLP 8h^2+5h, two layer norms 4h.
   * Llama: QKV h (h + 2 kv d), projection h^2, SwiGLU 3 h f, two RMSNorm gains 2h.
   */
  [[nodiscard]] constexpr double layer_parameters() const {
    const double h = double(hidden);
    if (is_llama()) return h * qkv_width() + h * h + 3.0 * h * double(ffn_size()) + 2.0 * h;
    return 12.0 * h * h + 13.0 * h;
  }
  /** Word embedding (GPT-2: tied with the output layer) and GPT-2's position embedding (Llama has none: rotary). */
  [[nodiscard]] constexpr double embedding_parameters() const {
    return double(is_llama() ? vocab : vocab + seq) * double(hidden);
  }
  /** Final layer norm (GPT-2: gain and bias) or RMSNorm (Llama: gain). */
  [[nodiscard]] constexpr double final_norm_parameters() const { return (is_llama() ? 1.0 : 2.0) * double(hidden); }
  /** The output head's own weight: Llama's untied [V, h]; none for GPT-2, whose head is the word embedding. */
  [[nodiscard]] constexpr double head_parameters() const { return is_llama() ? double(vocab) * double(hidden) : 0.0; }
  /** GPT-2: P = 12 l h^2 (1 + 13/(12h) + (V+s)/(12 l h)) plus the final layer norm; Llama: the layers, 2 V h, h. */
  [[nodiscard]] constexpr double parameters() const {
    double blocks = 0;
    for (std::size_t b = 0; b < layers; ++b) blocks += is_moe_layer(b) ? moe_layer_parameters() : layer_parameters();
    return blocks + embedding_parameters() + final_norm_parameters() + head_parameters();
  }
  /**
   * FLOPs of layer `b`'s forward over `batch` sequences (a Llama layer: its QKV, projection and three SwiGLU products
   * of h x f, and the attention scores): a dense GPT-2 layer 24 B s h^2 + 4 B s^2 h (QKV, projection,
   * MLP; scores and their product with V); an MoE layer swaps the MLP's 16 B s h^2 for its routed work, each
   * token through k experts (16 k B s h^2) and the gate (2 B s h E). The capacity's empty slots are not counted:
   * they are work the hardware does, not work the model needs.
   */
  [[nodiscard]] constexpr double layer_forward_flops(std::size_t b, double batch) const {
    const double s = double(seq), h = double(hidden);
    if (is_llama())  // QKV 2 B s h (h + 2 kv d), projection 2 B s h^2, SwiGLU 6 B s h f; the scores as GPT-2's
      return 2.0 * batch * s * h * (qkv_width() + h + 3.0 * double(ffn_size())) + 4.0 * batch * s * s * h;
    const double attention = 8.0 * batch * s * h * h + 4.0 * batch * s * s * h;
    if (!is_moe_layer(b)) return attention + 16.0 * batch * s * h * h;
    return attention + 16.0 * double(moe_top_k) * batch * s * h * h + 2.0 * batch * s * h * double(experts);
  }
  /**
   * FLOPs of one iteration over `batch` sequences without recomputation, counted as Narayanan et al.
   * do: 72 B s l h^2 (1 + s/(6h) + V/(12 l h)) for a dense model, i.e. three times every layer's forward plus
   * the logits (their 96 with full recomputation adds one more forward of every layer; see `iteration_flops` in
   * cost_model.hpp).
   */
  [[nodiscard]] constexpr double model_flops(double batch) const {
    double f = 6.0 * batch * double(seq) * double(hidden) * double(vocab);
    for (std::size_t b = 0; b < layers; ++b) f += 3.0 * layer_forward_flops(b, batch);
    return f;
  }

  /** Throws config_error naming the field to change when the model is malformed. */
  void validate() const {
    require(layers > 0, "model: --layers must be at least 1");
    require(hidden > 0, "model: --hidden must be at least 1");
    require(heads > 0, "model: --heads must be at least 1");
    require(seq > 0, "model: --seq must be at least 1");
    require(vocab > 0, "model: --vocab must be at least 1");
    require(hidden % heads == 0, "model: --hidden ", hidden, " is not divisible by --heads ", heads,
            "; choose a head count that divides the hidden size");
    require(experts == 0 || (moe_every >= 1 && moe_top_k >= 1 && moe_top_k <= experts), "model: ", experts,
            " experts need --moe-every >= 1 and --topk between 1 and ", experts);
    if (!is_llama()) {
      require(kv_heads == 0 || kv_heads == heads, "model: --kv-heads ", kv_heads,
              " is Llama's (grouped-query attention); add --model llama, or drop --kv-heads");
      require(ffn == 0 || ffn == 4 * hidden, "model: --ffn ", ffn,
              ": the planner counts GPT-2's MLP at 4h = ", 4 * hidden, "; drop --ffn, or use --model llama");
      return;
    }
    const std::size_t kv = kv_head_count();
    require(heads % kv == 0, "model: --heads ", heads, " is not divisible by --kv-heads ", kv,
            "; each key/value head serves a whole group of query heads, so choose --kv-heads dividing --heads");
    require((hidden / heads) % 2 == 0, "model: the head size --hidden / --heads = ", hidden / heads,
            " is odd; Llama's rotary embedding rotates pairs, so choose an even head size");
    require(experts == 0, "model: --experts ", experts,
            " with --model llama: mpar's mixture of experts is built for GPT-2's blocks only; drop --experts");
  }
};

/**
 * @brief A homogeneous GPU cluster. Bandwidths are nominal, per direction, in bytes per second:
 * `intra_node_bandwidth` per GPU (NVLink), `inter_node_bandwidth` per node with all its NICs
 * together (each GPU owns an equal share, as with one NIC per GPU).
 */
struct Cluster {
  std::size_t gpus = 0, gpus_per_node = 0;
  double memory_bytes = 0;            ///< per GPU
  double peak_flops = 0;              ///< dense 16-bit tensor-core peak per GPU
  double intra_node_bandwidth = 0;    ///< bytes/s per GPU per direction
  double inter_node_bandwidth = 0;    ///< bytes/s per node per direction
  double hbm_bandwidth = 2.0e12;      ///< bytes/s per GPU (A100 80 GB: 2.0 TB/s)
  double intra_node_latency = 5e-6;   ///< seconds per message hop inside a node
  double inter_node_latency = 10e-6;  ///< seconds per message hop between nodes

  [[nodiscard]] constexpr std::size_t nodes() const {
    return gpus_per_node ? (gpus + gpus_per_node - 1) / gpus_per_node : 0;
  }
  /** One GPU's share of its node's network bandwidth. */
  [[nodiscard]] constexpr double inter_node_bandwidth_per_gpu() const {
    return gpus_per_node ? inter_node_bandwidth / double(gpus_per_node) : 0.0;
  }

  void validate() const {
    require(gpus > 0, "cluster: --gpus must be at least 1");
    require(gpus_per_node > 0, "cluster: --gpus-per-node must be at least 1");
    require(gpus % gpus_per_node == 0 || gpus < gpus_per_node, "cluster: --gpus ", gpus,
            " is not a whole number of nodes of --gpus-per-node ", gpus_per_node, "; use a multiple of ",
            gpus_per_node);
    require(memory_bytes > 0, "cluster: --gpu-mem-gib must be positive");
    require(peak_flops > 0, "cluster: --peak-tflops must be positive");
    require(intra_node_bandwidth > 0, "cluster: --intra-node-gbps must be positive");
    require(inter_node_bandwidth > 0 || gpus <= gpus_per_node,
            "cluster: --inter-node-gbps must be positive when the cluster has more than one node");
    require(hbm_bandwidth > 0, "cluster: --hbm-gbps must be positive");
    require(intra_node_latency >= 0 && inter_node_latency >= 0, "cluster: latencies must not be negative");
  }
};

/** @brief The A100 80 GB cluster of Narayanan et al.: 8 GPUs per node, NVLink 300 GB/s, 8x200 Gb/s InfiniBand. */
[[nodiscard]] inline Cluster a100_selene(std::size_t gpus) {
  Cluster c;
  c.gpus = gpus;
  c.gpus_per_node = 8;
  c.memory_bytes = 80.0 * 1024 * 1024 * 1024;
  c.peak_flops = 312e12;
  c.intra_node_bandwidth = 300e9;
  c.inter_node_bandwidth = 8 * 200e9 / 8;  // eight 200 Gb/s HCAs = 200 GB/s per node
  c.hbm_bandwidth = 2.039e12;
  return c;
}

}  // namespace mpar::plan
