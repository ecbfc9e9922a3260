// safetensors: the format against hand-built files (good and damaged), export from any layout
// through the checkpoint machinery, import into any layout, GPT-2 naming and vocabulary un-padding.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include <mpar/io/safetensors.hpp>
#include <mpar/io/safetensors_gpt2.hpp>
#include <mpar/models/gpt_trainer.hpp>
#include <mpar/mpar.hpp>

#include "models/gpt_test_config.hpp"

using namespace mpar;
namespace fs = std::filesystem;

namespace {

fs::path scratch(const std::string& name) {
  const fs::path dir = fs::temp_directory_path() / "mpar-test-safetensors";
  fs::create_directories(dir);
  return dir / name;
}

/** A safetensors file built by hand: the 8-byte length, the JSON text as given, the raw buffer. */
fs::path raw_file(const std::string& name, const std::string& json, const std::vector<unsigned char>& buffer,
                  std::int64_t header_len = -1) {
  const fs::path p = scratch(name);
  std::ofstream f(p, std::ios::binary | std::ios::trunc);
  const std::uint64_t n = header_len < 0 ? json.size() : std::uint64_t(header_len);
  for (int i = 0; i < 8; ++i) f.put(char((n >> (8 * i)) & 0xff));
  f.write(json.data(), std::streamsize(json.size()));
  f.write(reinterpret_cast<const char*>(buffer.data()), std::streamsize(buffer.size()));
  return p;
}

std::vector<unsigned char> le_floats(const std::vector<float>& v) {
  std::vector<unsigned char> b;
  for (float x : v) {
    std::uint32_t u;
    std::memcpy(&u, &x, 4);
    for (int k = 0; k < 4; ++k) b.push_back(static_cast<unsigned char>((u >> (8 * k)) & 0xff));
  }
  return b;
}

/** Every parameter's whole tensor, assembled from the ranks' blocks. */
using Full = std::map<std::string, std::vector<float>>;
void gather_into(Full& full, const nn::Parameter& p, std::mutex& m) {
  std::lock_guard lock(m);
  auto& dst = full[p.name];
  if (dst.size() != p.global_size()) dst.assign(p.global_size(), std::nanf(""));
  for (std::size_t k = 0; k < p.value.size(); ++k) {
    const std::size_t g = p.global_index(k);
    dst[g] = p.value[k];
  }
}

bool bitwise_equal(const Full& a, const Full& b) {
  if (a.size() != b.size()) return false;
  for (const auto& [n, v] : a) {
    const auto& w = b.at(n);
    if (v.size() != w.size() || std::memcmp(v.data(), w.data(), 4 * v.size()) != 0) return false;
  }
  return true;
}

}  // namespace

TEST_CASE("safetensors: write then read returns every tensor, metadata and dtype exactly", "[data][io]") {
  const std::vector<float> a = {1.5f, -2.0f, 3.25f, 0.0f, -0.0f, 1e-30f}, b = {7.0f};
  const std::vector<io::NamedTensor> ts = {{"a.weight", {2, 3}, a}, {"b \"quoted\"", {1}, b}};
  const fs::path p = scratch("ok.safetensors");
  io::write_safetensors(p, std::span<const io::NamedTensor>(ts), {{"format", "pt"}});
  // The bytes are the format: length, JSON, buffer (checked against the spec by hand).
  std::ifstream in(p, std::ios::binary);
  std::vector<unsigned char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= std::uint64_t(bytes[std::size_t(i)]) << (8 * i);
  REQUIRE(n % 8 == 0);
  const std::string json(bytes.begin() + 8, bytes.begin() + 8 + std::ptrdiff_t(n));
  CHECK_THAT(json, Catch::Contains(R"("a.weight":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]})"));
  CHECK_THAT(json, Catch::Contains(R"("b \"quoted\"":{"dtype":"F32","shape":[1],"data_offsets":[24,28]})"));
  CHECK(std::vector<unsigned char>(bytes.begin() + 8 + std::ptrdiff_t(n), bytes.end()) == [&] {
    auto v = le_floats(a);
    auto w = le_floats(b);
    v.insert(v.end(), w.begin(), w.end());
    return v;
  }());
  io::SafetensorsFile f(p);
  REQUIRE(f.entries().size() == 2);
  CHECK(f.metadata().at("format") == "pt");
  const auto ra = f.read("a.weight");
  CHECK(std::memcmp(ra.data(), a.data(), 4 * a.size()) == 0);
  CHECK(f.read("b \"quoted\"") == b);
  // F16 and BF16 tensors widen to fp32.
  const std::vector<unsigned char> half = {0x00, 0x3c, 0x00, 0xc0, 0x80, 0x3f, 0x40, 0xc0};  // f16 1, -2; bf16 1, -3
  io::SafetensorsFile g(raw_file(
      "half.safetensors",
      R"({"h":{"dtype":"F16","shape":[2],"data_offsets":[0,4]},"b":{"dtype":"BF16","shape":[2],"data_offsets":[4,8]}})",
      half));
  CHECK(g.read("h") == std::vector<float>{1.0f, -2.0f});
  CHECK(g.read("b") == std::vector<float>{1.0f, -3.0f});
}

TEST_CASE("safetensors: each damaged file is refused naming the file and the fault", "[data][io]") {
  const auto buf = le_floats({1, 2, 3, 4});
  const std::string good = R"({"t":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]}})";
  auto refuse = [](const fs::path& p, const std::string& what) {
    INFO(p.string());
    CHECK_THROWS_WITH(io::SafetensorsFile(p), Catch::Contains(p.string()) && Catch::Contains(what));
  };
  REQUIRE_NOTHROW(io::SafetensorsFile(raw_file("good.safetensors", good, buf)));
  {
    auto cut = buf;
    cut.resize(10);
    refuse(raw_file("truncated.safetensors", good, cut), "outside the 10-byte data buffer");
  }
  {
    const fs::path p = scratch("tiny.safetensors");
    std::ofstream(p, std::ios::binary).write("\x10\x00\x00", 3);
    refuse(p, "too short for the 8-byte header length");
  }
  refuse(raw_file("bad_len.safetensors", good, buf, 1 << 20), "bad header length 1048576");
  refuse(raw_file("bad_json.safetensors", R"({"t":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]})", buf),
         "JSON header ends early");
  refuse(raw_file("bad_json2.safetensors", R"({"t":{"dtype":"F32","shape":[2.5],"data_offsets":[0,16]}})", buf),
         "non-integer number");
  refuse(raw_file("bad_json3.safetensors", R"({"t":{"dtype":F32,"shape":[2,2],"data_offsets":[0,16]}})", buf),
         "unexpected 'F'");
  refuse(
      raw_file(
          "dup.safetensors",
          R"({"t":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"t":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}})",
          buf),
      "key \"t\" twice");
  refuse(
      raw_file(
          "overlap.safetensors",
          R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,12]},"b":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}})",
          buf),
      "overlap");
  refuse(
      raw_file(
          "gap.safetensors",
          R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"b":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}})",
          buf),
      "gap of 4 bytes before tensor 'b'");
  refuse(raw_file("range.safetensors", R"({"t":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]}})", buf),
         "data_offsets [0, 24] outside the 16-byte data buffer");
  refuse(raw_file("reversed.safetensors", R"({"t":{"dtype":"F32","shape":[0],"data_offsets":[16,0]}})", buf),
         "data_offsets [16, 0]");
  refuse(raw_file("dtype.safetensors", R"({"t":{"dtype":"I64","shape":[2],"data_offsets":[0,16]}})", buf), "dtype I64");
  refuse(raw_file("size.safetensors", R"({"t":{"dtype":"F32","shape":[3],"data_offsets":[0,16]}})", buf),
         "needs 12 bytes but data_offsets give 16");
  refuse(raw_file("trailing.safetensors", R"({"t":{"dtype":"F32","shape":[3],"data_offsets":[0,12]}})", buf),
         "trailing bytes");
  refuse(raw_file("field.safetensors", R"({"t":{"dtype":"F32","shape":[4],"offsets":[0,16]}})", buf),
         "unknown field \"offsets\"");
  CHECK_THROWS_WITH(io::SafetensorsFile(raw_file("good2.safetensors", good, buf)).read("u"),
                    Catch::Contains("no tensor 'u'"));
}

TEST_CASE("safetensors: export from tp2 x pp2, import into one rank and back, exactly", "[data][io][train]") {
  auto c4 = testing::small_gpt(2, 2, 1);
  c4.model.layers = 2;
  auto c1 = c4;
  c1.tp = c1.pp = 1;
  const fs::path first = scratch("tp2pp2.safetensors"), second = scratch("single.safetensors");
  fs::remove(first);
  fs::remove(second);
  std::mutex m;
  // Trained a little under tp 2 x pp 2, so the values are not the (layout-independent) initial ones.
  Full trained, single, back;
  double val4 = 0, val1 = 0;
  run_threads(4, [&](ThreadsCommunicator& world) {
    models::GptTrainer<ThreadsCommunicator> t(world, c4, testing::gpt_dataset());
    for (int s = 0; s < 2; ++s) (void)t.train_step();
    t.export_safetensors(first);
    const double v = t.evaluate(testing::gpt_dataset(), 2, 3);
    if (world.rank() == 0) val4 = v;
    for (auto& [n, p] : t.named_parameters()) gather_into(trained, *p, m);
  });
  CHECK_FALSE(fs::exists(first.string() + ".staging"));
  {
    io::SafetensorsFile f(first);
    CHECK(f.entries().size() == trained.size());
    for (const auto& [n, v] : trained) CHECK(f.read(n) == v);  // what the file holds is what the ranks held
  }
  run_threads(1, [&](ThreadsCommunicator& world) {
    models::GptTrainer<ThreadsCommunicator> t(world, c1, testing::gpt_dataset());
    io::SafetensorsWeights w(first, io::WeightNaming::mpar);
    CHECK(t.load_weights(w) == trained.size());
    CHECK(w.missing().empty());
    val1 = t.evaluate(testing::gpt_dataset(), 2, 3);
    for (auto& [n, p] : t.named_parameters()) gather_into(single, *p, m);
    t.export_safetensors(second);
  });
  CHECK(bitwise_equal(single, trained));
  CHECK(val1 == Approx(val4).epsilon(2e-5));
  run_threads(4, [&](ThreadsCommunicator& world) {
    models::GptTrainer<ThreadsCommunicator> t(world, c4, testing::gpt_dataset());
    io::SafetensorsWeights w(second, io::WeightNaming::mpar);
    (void)t.load_weights(w);
    for (auto& [n, p] : t.named_parameters()) gather_into(back, *p, m);
    // The tied head copy on the last stage received the embedding too.
    for (auto* p : t.parameters())
      if (p->name == "embed.token.weight") gather_into(back, *p, m);
  });
  CHECK(bitwise_equal(back, trained));
  // A file from a model of other sizes is refused naming the tensor and both shapes.
  auto wide = c1;
  wide.model.hidden = 64;
  run_threads(1, [&](ThreadsCommunicator& world) {
    models::GptTrainer<ThreadsCommunicator> t(world, wide, testing::gpt_dataset());
    io::SafetensorsWeights w(second, io::WeightNaming::mpar);
    CHECK_THROWS_WITH(t.load_weights(w), Catch::Contains("single.safetensors") && Catch::Contains("shape [") &&
                                             Catch::Contains("needs [") && Catch::Contains("other sizes"));
  });
}

TEST_CASE("safetensors: GPT-2 names and shapes, vocabulary un-padding, and back", "[data][io][train]") {
  CHECK(io::hf_gpt2_name("embed.token.weight") == "transformer.wte.weight");
  CHECK(io::hf_gpt2_name("embed.position") == "transformer.wpe.weight");
  CHECK(io::hf_gpt2_name("block11.attn.qkv.weight") == "transformer.h.11.attn.c_attn.weight");
  CHECK(io::hf_gpt2_name("block0.attn.qkv.bias") == "transformer.h.0.attn.c_attn.bias");
  CHECK(io::hf_gpt2_name("block3.attn.proj.bias") == "transformer.h.3.attn.c_proj.bias");
  CHECK(io::hf_gpt2_name("block0.ln1.weight") == "transformer.h.0.ln_1.weight");
  CHECK(io::hf_gpt2_name("block0.ln2.bias") == "transformer.h.0.ln_2.bias");
  CHECK(io::hf_gpt2_name("block2.mlp.fc1.weight") == "transformer.h.2.mlp.c_fc.weight");
  CHECK(io::hf_gpt2_name("block2.mlp.fc2.weight") == "transformer.h.2.mlp.c_proj.weight");
  CHECK(io::hf_gpt2_name("final_norm.bias") == "transformer.ln_f.bias");
  CHECK_FALSE(io::hf_gpt2_name("block0.moe.gate.weight").has_value());
  CHECK_FALSE(io::hf_gpt2_name("blockx.ln1.weight").has_value());

  auto c = testing::small_gpt(2, 1, 1);
  c.model.layers = 1;
  const std::size_t V = c.model.vocab, Vp = c.model.padded_vocab(), h = c.model.hidden;
  REQUIRE(Vp > V);  // the test needs padding rows to drop
  const fs::path p = scratch("gpt2.safetensors");
  fs::remove(p);
  std::mutex m;
  Full model, loaded, loaded_head;
  run_threads(2, [&](ThreadsCommunicator& world) {
    models::GptTrainer<ThreadsCommunicator> t(world, c, testing::gpt_dataset());
    (void)t.train_step();
    t.export_safetensors(p, io::WeightNaming::hf_gpt2);
    for (auto& [n, q] : t.named_parameters()) gather_into(model, *q, m);
  });
  io::SafetensorsFile f(p);
  using S = std::vector<std::size_t>;
  std::map<std::string, S> shapes;
  for (const auto& e : f.entries()) shapes[e.name] = e.shape;
  const std::map<std::string, S> want = {{"transformer.wte.weight", {V, h}},
                                         {"transformer.wpe.weight", {16, h}},
                                         {"transformer.h.0.ln_1.weight", {h}},
                                         {"transformer.h.0.ln_1.bias", {h}},
                                         {"transformer.h.0.attn.c_attn.weight", {h, 3 * h}},
                                         {"transformer.h.0.attn.c_attn.bias", {3 * h}},
                                         {"transformer.h.0.attn.c_proj.weight", {h, h}},
                                         {"transformer.h.0.attn.c_proj.bias", {h}},
                                         {"transformer.h.0.ln_2.weight", {h}},
                                         {"transformer.h.0.ln_2.bias", {h}},
                                         {"transformer.h.0.mlp.c_fc.weight", {h, 4 * h}},
                                         {"transformer.h.0.mlp.c_fc.bias", {4 * h}},
                                         {"transformer.h.0.mlp.c_proj.weight", {4 * h, h}},
                                         {"transformer.h.0.mlp.c_proj.bias", {h}},
                                         {"transformer.ln_f.weight", {h}},
                                         {"transformer.ln_f.bias", {h}}};
  CHECK(shapes == want);  // no lm_head: tied to wte
  // Values: the embedding's first V rows; c_attn[i, g*h + j] = qkv[i, g, j] (row-major reshape).
  const auto wte = f.read("transformer.wte.weight");
  CHECK(std::equal(wte.begin(), wte.end(), model.at("embed.token.weight").begin()));
  const auto cat = f.read("transformer.h.0.attn.c_attn.weight");
  const auto& qkv = model.at("block0.attn.qkv.weight");
  bool same = true;
  for (std::size_t i = 0; i < h; ++i)
    for (std::size_t g = 0; g < 3; ++g)
      for (std::size_t j = 0; j < h; ++j) same = same && cat[i * 3 * h + g * h + j] == qkv[(i * 3 + g) * h + j];
  CHECK(same);
  CHECK(f.read("transformer.h.0.mlp.c_proj.weight") == model.at("block0.mlp.fc2.weight"));
  // Back into a tp 2 model: the same values, the padding rows zero.
  run_threads(2, [&](ThreadsCommunicator& world) {
    models::GptTrainer<ThreadsCommunicator> t(world, c, testing::gpt_dataset());
    io::SafetensorsWeights w(p, io::WeightNaming::hf_gpt2);
    (void)t.load_weights(w);
    for (auto& [n, q] : t.named_parameters()) gather_into(loaded, *q, m);
  });
  for (const auto& [n, v] : model) {
    INFO(n);
    if (n != "embed.token.weight") {
      CHECK(loaded.at(n) == v);
      continue;
    }
    const auto& e = loaded.at(n);
    CHECK(std::equal(e.begin(), e.begin() + std::ptrdiff_t(V * h), v.begin()));
    CHECK(std::all_of(e.begin() + std::ptrdiff_t(V * h), e.end(), [](float x) { return x == 0.0f; }));
    CHECK(e.size() == Vp * h);
  }
}

TEST_CASE("safetensors: Python's safetensors + numpy (and transformers, when installed) read mpar's export",
          "[data][io][python]") {
  // Skipped (with a warning) unless python3 can import safetensors and numpy.
  if (std::system("python3 -c 'import safetensors, numpy' > /dev/null 2>&1") != 0) {
    WARN("skipped: python3 with the safetensors and numpy packages is not installed");
    return;
  }
  auto c = testing::small_gpt(1, 1, 1);
  c.model.layers = 2;
  const fs::path dir = scratch("python");
  fs::create_directories(dir);
  std::vector<std::int32_t> ids;
  for (std::int32_t i = 0; i < 16; ++i) ids.push_back((i * 7 + 3) % std::int32_t(c.model.vocab));
  run_threads(2, [&](ThreadsCommunicator& world) {
    auto c2 = c;
    c2.tp = 2;
    models::GptTrainer<ThreadsCommunicator> t(world, c2, testing::gpt_dataset());
    (void)t.train_step();
    t.export_safetensors(dir / "mpar.safetensors");
    t.export_safetensors(dir / "gpt2.safetensors", io::WeightNaming::hf_gpt2);
  });
  // mpar's values and logits, from a single-rank stage loaded from the export.
  run_threads(1, [&](ThreadsCommunicator& world) {
    models::GptPipelinePart<ThreadsCommunicator> stage(world, c.model, true, true, 0, c.model.layers);
    io::SafetensorsWeights w(dir / "mpar.safetensors", io::WeightNaming::mpar);
    std::ofstream ex(dir / "expected.txt");
    ex.precision(9);
    for (auto& [name, p] : stage.named_parameters()) {
      const auto full = w(name, p->global_shape);
      std::copy(full.begin(), full.end(), p->value.begin());
      ex << name << ' ' << p->global_shape.size();
      for (auto d : p->global_shape) ex << ' ' << d;
      for (float v : full) ex << ' ' << v;
      ex << '\n';
    }
    const nn::Activation logits =
        stage.forward_to_loss(models::GptPipelinePart<ThreadsCommunicator>::tokens_as_activation(ids), 0).tensor();
    std::ofstream lg(dir / "logits.txt");
    lg.precision(9);
    lg << "vocab " << c.model.vocab << " seq " << c.model.seq << " hidden " << c.model.hidden << " layers "
       << c.model.layers << " heads " << c.model.heads << '\n';
    for (auto id : ids) lg << id << ' ';
    lg << '\n';
    for (std::size_t r = 0; r < ids.size(); ++r)
      for (std::size_t v = 0; v < c.model.vocab; ++v) lg << logits.data()[r * logits.extent(1) + v] << ' ';
  });
  const std::string cmd = "python3 " MPAR_TEST_DATA_DIR "/check_safetensors.py " + dir.string();
  CHECK(std::system(cmd.c_str()) == 0);
}

TEST_CASE("safetensors: an export from tp 3 (vocabulary padded to 48) loads into one rank (padded to 16)",
          "[data][io][train]") {
  auto c3 = testing::small_gpt(3, 1, 1);
  c3.model.hidden = 36;
  c3.model.heads = 6;
  c3.model.layers = 1;
  auto c1 = c3;
  c1.tp = 1;
  const fs::path p = scratch("tp3.safetensors");
  fs::remove(p);
  std::mutex m;
  Full from, into;
  std::size_t rows3 = 0, rows1 = 0;
  run_threads(3, [&](ThreadsCommunicator& world) {
    models::GptTrainer<ThreadsCommunicator> t(world, c3, testing::gpt_dataset());
    (void)t.train_step();
    t.export_safetensors(p);
    rows3 = t.config().model.padded_vocab();
    for (auto& [n, q] : t.named_parameters()) gather_into(from, *q, m);
  });
  run_threads(1, [&](ThreadsCommunicator& world) {
    models::GptTrainer<ThreadsCommunicator> t(world, c1, testing::gpt_dataset());
    io::SafetensorsWeights w(p, io::WeightNaming::mpar);
    (void)t.load_weights(w);
    rows1 = t.config().model.padded_vocab();
    for (auto& [n, q] : t.named_parameters()) gather_into(into, *q, m);
  });
  REQUIRE(rows3 != rows1);
  const std::size_t V = c1.model.vocab, h = c1.model.hidden;
  for (const auto& [n, v] : from) {
    INFO(n);
    const auto& w = into.at(n);
    if (n != "embed.token.weight") {
      CHECK(w == v);
      continue;
    }
    CHECK(w.size() == rows1 * h);
    CHECK(std::equal(w.begin(), w.begin() + std::ptrdiff_t(V * h), v.begin()));
    CHECK(std::all_of(w.begin() + std::ptrdiff_t(V * h), w.end(), [](float x) { return x == 0.0f; }));
  }
}
