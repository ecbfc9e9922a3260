// generate: samples text (or token ids) from a trained GPT, loaded from an mpar checkpoint (any
// layout) or a safetensors file (mpar, GPT-2 or LlamaForCausalLM names), with temperature and top-k, on one host
// rank. A Llama model (train_gpt --model llama) takes the same --model, --kv-heads, --ffn and --rope-theta.
//
//   generate --checkpoint ckpt/ --data text.txt --prompt "To be" --tokens 200   (character model)
//   generate --safetensors gpt2.safetensors --hf-gpt2 --vocab 50257 --layers 12 --hidden 768
//            --heads 12 --seq 1024 --prompt-ids 464,2068 --tokens 20           (token model: ids out)
//   generate --safetensors llama/model.safetensors --hf-llama --prompt-ids 1,2 --tokens 20
//            (Hugging Face names: the family and sizes come from the config.json beside the file, when it has one)
// A checkpoint saved at a tensor-parallel size that 16 does not divide needs --vocab-multiple lcm(16, tp).
#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <mpar/cli/parser.hpp>
#include <mpar/data/char_dataset.hpp>
#include <mpar/io/checkpoint.hpp>
#include <mpar/io/hf_config.hpp>
#include <mpar/io/safetensors_gpt2.hpp>
#include <mpar/models/gpt.hpp>
#include <mpar/models/gpt_config_from_hf.hpp>
#include <mpar/models/gpt_generate.hpp>
#include <mpar/mpar.hpp>

using namespace mpar;

namespace {

struct Options {
  models::GptConfig model;
  std::string checkpoint, safetensors, data, prompt, prompt_ids;
  bool hf_gpt2 = false, hf_llama = false;
  double temperature = 0.8;
  std::size_t top_k = 0, tokens = 200;
  std::uint64_t seed = 1;
};

/** `--prompt-ids 464,2068`: each item a token id below `vocab`; an error names the item that is not one. */
std::vector<std::int32_t> parse_prompt_ids(const std::string& text, std::size_t vocab) {
  require(!text.empty(), "generate: a token model needs --prompt-ids 1,2,3 (ids from the tokenizer)");
  std::vector<std::int32_t> ids;
  std::size_t start = 0;
  for (std::size_t item = 1;; ++item) {
    const std::size_t comma = std::min(text.find(',', start), text.size());
    std::string_view t(text.data() + start, comma - start);
    while (!t.empty() && t.front() == ' ') t.remove_prefix(1);
    while (!t.empty() && t.back() == ' ') t.remove_suffix(1);
    std::uint64_t id = 0;
    const auto [end, ec] = std::from_chars(t.data(), t.data() + t.size(), id);
    require(!t.empty() && ec == std::errc() && end == t.data() + t.size(), "generate: --prompt-ids item ", item, " '",
            t, "' is not a token id; give comma-separated ids from the tokenizer, e.g. --prompt-ids 464,2068");
    require(id < vocab, "generate: --prompt-ids item ", item, " is ", id, ", outside the vocabulary of ", vocab,
            " ids (--vocab)");
    ids.push_back(std::int32_t(id));
    if (comma == text.size()) return ids;
    start = comma + 1;
  }
}

int run(const Options& o) {
  require(o.checkpoint.empty() != o.safetensors.empty(),
          "generate: pass exactly one of --checkpoint DIR and --safetensors FILE");
  // A character model (--data) reads --prompt; a token model (--vocab) reads --prompt-ids. The other one would be
  // ignored, so it is refused.
  require(o.data.empty() || o.prompt_ids.empty(),
          "generate: --prompt-ids is for a token model (--vocab, no --data); a character model (--data) takes "
          "--prompt TEXT");
  require(!o.data.empty() || o.prompt.empty(),
          "generate: --prompt is for a character model (--data TEXT gives its vocabulary); a token model takes "
          "--prompt-ids 1,2,3");
  std::optional<data::CharDataset> chars;
  models::GptConfig mc = o.model;
  if (!o.data.empty()) {
    chars.emplace(o.data, 1);
    mc.vocab = chars->vocab_size();
  }
  require(mc.vocab > 0, "generate: give --data TEXT (a character model's training text) or --vocab N (a token model)");
  mc.validate(1, 1);
  require(!o.hf_gpt2 || !mc.is_llama(), "generate: --hf-gpt2 is GPT-2's names; a --model llama file takes --hf-llama");
  require(!o.hf_llama || mc.is_llama(), "generate: --hf-llama (LlamaForCausalLM names) needs --model llama");
  // The prompt, checked before any weights are read: characters through the text's vocabulary, or ids.
  std::vector<std::int32_t> ctx;
  if (chars)
    for (char c : o.prompt.empty() ? std::string("\n") : o.prompt) ctx.push_back(chars->encode(c));
  else
    ctx = parse_prompt_ids(o.prompt_ids, mc.vocab);
  int rc = 0;
  run_threads(1, [&](ThreadsCommunicator& world) {
    models::GptPipelinePart<ThreadsCommunicator> model(world, mc, true, true, 0, mc.layers);
    std::size_t loaded = 0;
    if (!o.checkpoint.empty()) {
      std::vector<io::LoadBlock> blocks;
      for (auto* p : model.parameters())
        blocks.push_back({p->name, p->global_shape, io::BoxN(p->local_box.begin(), p->local_box.end()), p->layout,
                          std::span<float>(p->value)});
      (void)io::load_checkpoint(o.checkpoint, std::span<const io::LoadBlock>(blocks));
      loaded = blocks.size();
    } else {
      std::optional<io::HfLlamaConfig> llama;
      if (o.hf_llama) llama = models::hf_llama_config(mc);
      io::SafetensorsWeights w(o.safetensors,
                               o.hf_gpt2    ? io::WeightNaming::hf_gpt2
                               : o.hf_llama ? io::WeightNaming::hf_llama
                                            : io::WeightNaming::mpar,
                               llama);
      for (auto& [name, p] : model.named_parameters()) {
        const auto full = w(name, p->global_shape);
        require(!full.empty(), "generate: ", o.safetensors, " has no tensor for '", name,
                "'; pass the model sizes it was exported with (and --hf-gpt2 or --hf-llama for Hugging Face names)");
        std::copy(full.begin(), full.end(), p->value.begin());  // one rank: the local block is the whole tensor
        ++loaded;
      }
    }
    std::printf("generate: %zu tensors loaded, vocab %zu, temperature %g, top-k %zu\n", loaded, mc.vocab, o.temperature,
                o.top_k);
    // The library's generation (models::generate): any backend, any tensor group; here one host rank.
    const std::vector<std::int32_t> out =
        models::generate(model, ctx, o.tokens, models::SamplingConfig{o.temperature, o.top_k, o.seed});
    std::string text;
    if (chars)
      for (auto id : out) text += chars->decode(id);
    if (chars)
      std::printf("%s%s\n", o.prompt.c_str(), text.c_str());
    else {
      for (std::size_t i = 0; i < out.size(); ++i) std::printf("%s%d", i ? "," : "", out[i]);
      std::printf("\n");
    }
  });
  return rc;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    Options o;
    o.model.hidden = 64;
    o.model.heads = 4;
    o.model.layers = 4;
    o.model.seq = 64;
    cli::Parser p("generate", "Samples from a GPT trained by train_gpt (checkpoint) or exported to safetensors.");
    p.option("checkpoint", o.checkpoint, "an mpar checkpoint directory (saved with any layout)");
    p.option("safetensors", o.safetensors, "a safetensors file (train_gpt --export)");
    p.flag("hf-gpt2", o.hf_gpt2,
           "the safetensors file uses Hugging Face GPT-2 names (sizes from the config.json beside it, if any)");
    p.flag("hf-llama", o.hf_llama,
           "the safetensors file uses Hugging Face LlamaForCausalLM names (--model llama; sizes from the config.json "
           "beside it, if any)");
    p.choice("model", o.model.family, {{"gpt2", models::ModelFamily::gpt2}, {"llama", models::ModelFamily::llama}},
             "decoder family the weights were trained with");
    p.option("kv-heads", o.model.kv_heads, "--model llama: key/value heads (0: as many as --heads)").range(0, 4096);
    p.option("ffn", o.model.ffn, "MLP width (0: 4 x --hidden)").range(0, 1 << 24);
    p.option("rope-theta", o.model.rope_theta, "--model llama: the rotary frequency base").range(1, 1e12);
    p.option("norm-eps", o.model.norm_eps, "--model llama: RMSNorm's epsilon").range(1e-12, 1);
    p.option("data", o.data, "the training text of a character model (its vocabulary)");
    p.option("vocab", o.model.vocab, "vocabulary of a token model (e.g. 50257)").range(0, 1 << 30);
    p.option("layers", o.model.layers, "transformer blocks").range(1, 4096);
    p.option("hidden", o.model.hidden, "model width").range(1, 1 << 20);
    p.option("heads", o.model.heads, "attention heads").range(1, 4096);
    p.option("seq", o.model.seq, "context length").range(2, 1 << 20);
    p.option("vocab-multiple", o.model.vocab_multiple,
             "padding multiple of the vocabulary the checkpoint was saved with: lcm(16, tp) of its run (default 16)")
        .range(1, 1 << 20);
    p.option("seed", o.model.seed, "the model's initialisation seed (irrelevant once loaded)");
    p.option("prompt", o.prompt, "prompt text (character model)");
    p.option("prompt-ids", o.prompt_ids, "prompt token ids, comma-separated (token model)");
    p.option("temperature", o.temperature, "softmax temperature (0: greedy)").range(0, 100);
    p.option("top-k", o.top_k, "sample among the k most likely (0: all)").range(0, 1 << 30);
    p.option("tokens", o.tokens, "tokens to generate").range(0, 1 << 30);
    p.option("sample-seed", o.seed, "sampling seed");
    if (!p.parse(argc, argv)) {
      std::cout << p.help();
      return 0;
    }
    // A Hugging Face export (train_gpt --export --hf-llama, or a model downloaded from the Hub) keeps its sizes in
    // the config.json beside the weights: they are taken from there, and sizes also given must agree.
    if (!o.safetensors.empty() && (o.hf_gpt2 || o.hf_llama)) {
      models::apply_hf_config_beside(o.model, o.safetensors, p, "generate");
    }
    return run(o);
  } catch (const std::exception& e) {
    const std::string what = e.what();
    std::fprintf(stderr, "%s%s\n", what.starts_with("generate") ? "" : "generate: ", what.c_str());
    return 2;
  }
}
