// gpt_logits: loads a safetensors file (mpar, Hugging Face GPT-2 or LlamaForCausalLM names) into a GPT laid out over
// --tp x --pp thread ranks, runs one sequence through the stages and writes the logits of every
// position — all padded-vocabulary columns included — as a float32 .npy array [seq, padded vocab];
// prints the mean cross-entropy over --targets as computed by the model's own loss layer.
//
//   gpt_logits --safetensors model.safetensors --hf-gpt2 --vocab 100 --layers 2 --hidden 32 --heads 4
//              --seq 16 --tp 2 --pp 2 --ids 1,2,...(seq ids) --targets 2,3,... --out logits.npy
//
//   gpt_logits --safetensors dir/model.safetensors --hf-llama --tp 2 --ids ... --out logits.npy   (Llama; with
//              Hugging Face names the sizes come from the config.json beside the file when it has one)
//
// The tests tests/data/check_transformers.py and check_transformers_llama.py compare its output with
// transformers' GPT2LMHeadModel and LlamaForCausalLM.
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <mutex>
#include <numeric>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include <mpar/cli/parser.hpp>
#include <mpar/io/hf_config.hpp>
#include <mpar/io/safetensors_gpt2.hpp>
#include <mpar/models/gpt.hpp>
#include <mpar/models/gpt_config_from_hf.hpp>
#include <mpar/mpar.hpp>

using namespace mpar;

namespace {

std::vector<std::int32_t> parse_ids(const std::string& s) {
  std::vector<std::int32_t> out;
  std::stringstream ss(s);
  for (std::string t; std::getline(ss, t, ',');) out.push_back(std::int32_t(std::stol(t)));
  return out;
}

/** Copies `p`'s local block out of the row-major whole tensor `full`. */
void copy_block(nn::Parameter& p, std::span<const float> full) {
  require(full.size() == p.global_size(), "gpt_logits: '", p.name, "' has ", full.size(), " values, expected ",
          p.global_size());
  for (std::size_t k = 0; k < p.value.size(); ++k) {
    const std::size_t g = p.global_index(k);
    p.value[k] = full[g];
  }
}

void write_npy(const std::string& path, const std::vector<float>& v, std::size_t rows, std::size_t cols) {
  std::string header = "{'descr': '<f4', 'fortran_order': False, 'shape': (" + std::to_string(rows) + ", " +
                       std::to_string(cols) + "), }";
  while ((10 + header.size() + 1) % 64 != 0) header += ' ';
  header += '\n';
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  require(bool(f), "gpt_logits: cannot write ", path);
  f.write("\x93NUMPY\x01\x00", 8);
  const auto n = std::uint16_t(header.size());
  f.put(char(n & 0xff));
  f.put(char(n >> 8));
  f.write(header.data(), std::streamsize(header.size()));
  f.write(reinterpret_cast<const char*>(v.data()), std::streamsize(v.size() * sizeof(float)));  // little-endian host
}

}  // namespace

int main(int argc, char** argv) {
  try {
    models::GptConfig mc;
    std::string file, ids_s, targets_s, out;
    bool hf = false, hf_llama = false;
    std::size_t tp = 1, pp = 1;
    cli::Parser p("gpt_logits", "Logits of one sequence from a safetensors GPT in a (tp, pp) layout of thread ranks.");
    p.option("safetensors", file, "the weights").required();
    p.flag("hf-gpt2", hf, "Hugging Face GPT-2 names");
    p.flag("hf-llama", hf_llama, "Hugging Face LlamaForCausalLM names (with --model llama)");
    p.choice("model", mc.family, {{"gpt2", models::ModelFamily::gpt2}, {"llama", models::ModelFamily::llama}},
             "decoder family");
    p.option("kv-heads", mc.kv_heads, "Llama: key/value heads (0: --heads)").range(0, 4096);
    p.option("ffn", mc.ffn, "MLP width (0: 4 x --hidden)").range(0, 1 << 24);
    p.option("rope-theta", mc.rope_theta, "Llama: the rotary frequency base").range(1, 1e12);
    p.option("norm-eps", mc.norm_eps, "Llama: RMSNorm's epsilon").range(1e-12, 1);
    p.option("vocab", mc.vocab, "vocabulary (Hugging Face names: from config.json when beside the file)")
        .range(1, 1 << 30);
    p.option("layers", mc.layers, "blocks").range(1, 4096);
    p.option("hidden", mc.hidden, "width").range(1, 1 << 20);
    p.option("heads", mc.heads, "heads").range(1, 4096);
    p.option("seq", mc.seq, "context length").range(1, 1 << 20);
    p.option("tp", tp, "tensor-parallel size").range(1, 64);
    p.option("pp", pp, "pipeline stages").range(1, 64);
    p.option("ids", ids_s, "seq token ids, comma-separated").required();
    p.option("targets", targets_s, "seq target ids for the loss, comma-separated");
    p.option("out", out, "the .npy file of the logits").required();
    if (!p.parse(argc, argv)) {
      std::cout << p.help();
      return 0;
    }
    if (hf || hf_llama) {  // the sizes of a Hugging Face directory, as generate takes them
      models::apply_hf_config_beside(mc, file, p, "gpt_logits");
    }
    require(mc.vocab > 0, "gpt_logits: give --vocab N (no config.json beside ", file, ")");
    mc.vocab_multiple = std::lcm(std::size_t(16), tp);  // as GptTrainConfig::pad_vocab_for_mesh
    mc.validate(tp);
    require(!hf || !hf_llama, "gpt_logits: give one of --hf-gpt2 and --hf-llama");
    require(!hf_llama || mc.is_llama(), "gpt_logits: --hf-llama needs --model llama");
    const io::WeightNaming naming = hf         ? io::WeightNaming::hf_gpt2
                                    : hf_llama ? io::WeightNaming::hf_llama
                                               : io::WeightNaming::mpar;
    std::optional<io::HfLlamaConfig> llama;
    if (hf_llama) llama = models::hf_llama_config(mc);
    require(mc.layers % pp == 0, "gpt_logits: --layers ", mc.layers, " does not split evenly over --pp ", pp);
    const auto ids = parse_ids(ids_s), targets = parse_ids(targets_s);
    require(ids.size() == mc.seq, "gpt_logits: give exactly --seq ", mc.seq, " ids, got ", ids.size());
    require(targets.empty() || targets.size() == ids.size(), "gpt_logits: --targets needs one id per position");
    const std::size_t Vp = mc.padded_vocab(), T = mc.seq;
    std::vector<std::vector<float>> handoff(pp * tp);  // stage s, tensor rank t: the hidden states it sends on
    std::vector<float> logits;
    float loss = 0;
    std::mutex m;
    run_threads(int(tp * pp), [&](ThreadsCommunicator& world) {
      const std::size_t stage_of = std::size_t(world.rank()) / tp, t = std::size_t(world.rank()) % tp;
      ThreadsCommunicator group = world.split(int(stage_of), int(t));
      const std::size_t per = mc.layers / pp;
      const bool first = stage_of == 0, last = stage_of + 1 == pp;
      models::GptPipelinePart<ThreadsCommunicator> stage(group, mc, first, last, stage_of * per, per);
      io::SafetensorsWeights w(file, naming, llama);
      auto named = stage.named_parameters();
      if (stage.head_is_copy()) named.emplace_back("embed.token.weight", stage.head_weight());  // the tied head
      for (auto& [name, param] : named) {
        const auto full = w(name, param->global_shape);
        require(!full.empty(), "gpt_logits: ", file, " has no tensor for '", name, "'");
        copy_block(*param, full);
      }
      for (std::size_t s = 0; s < pp; ++s) {
        if (s == stage_of) {
          nn::Act<Replicate> x = first ? models::GptPipelinePart<ThreadsCommunicator>::tokens_as_activation(ids)
                                       : nn::Act<Replicate>(nn::Activation({T, mc.hidden}));
          if (!first) std::copy(handoff[(s - 1) * tp + t].begin(), handoff[(s - 1) * tp + t].end(), x.data());
          if (!last) {
            const nn::Act<Replicate> y = stage.forward(x, 0);
            handoff[s * tp + t].assign(y.data(), y.data() + y.size());
          } else {
            const nn::Act<nn::FeatureShard> y = stage.forward_to_loss(x, 0);
            const std::size_t local = y.extent(1);
            Buffer<float> all(T * Vp);
            group.all_gather(std::span<const float>(y.data(), T * local), std::span<float>(all));
            float l = targets.empty() ? 0.0f : stage.loss().forward(y, targets, 0);
            if (t == 0) {
              std::lock_guard lock(m);
              logits.assign(T * Vp, 0.0f);
              for (std::size_t r = 0; r < std::size_t(tp); ++r)  // rank r's block is its [T, local] vocabulary shard
                for (std::size_t i = 0; i < T; ++i)
                  for (std::size_t c = 0; c < local; ++c)
                    logits[i * Vp + r * local + c] = all[r * T * local + i * local + c];
              loss = l;
            }
          }
        }
        world.barrier();
      }
    });
    write_npy(out, logits, T, Vp);
    std::printf("gpt_logits: tp %zu pp %zu, padded vocabulary %zu, loss %.9g\n", tp, pp, Vp, double(loss));
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gpt_logits: %s\n", e.what());
    return 2;
  }
}
