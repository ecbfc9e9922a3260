// Checkpoints: format, resharding between layouts, replica de-duplication, ZeRO-1 flat states,
// crash safety and detection of damaged or mismatched checkpoints.
#include <catch2/catch.hpp>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include <sys/wait.h>
#include <unistd.h>

#include "mpar/comm/threads.hpp"
#include "mpar/core/layout.hpp"
#include "mpar/core/mesh.hpp"
#include "mpar/io.hpp"
#include "mpar/optim/adamw.hpp"
#include "mpar/parallel/zero.hpp"
#include "support/rank_checks.hpp"

using namespace mpar;
namespace fs = std::filesystem;

namespace {

/** Catch2 is not thread-safe: assertions inside thread ranks take this lock. */

/** A fresh directory under the system temp dir, removed at the end of the test. */
struct TempDir {
  fs::path path;
  explicit TempDir(const std::string& tag) {
    static std::atomic<int> counter{0};
    path = fs::temp_directory_path() /
           ("mpar_io_" + tag + "_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};

/** A parameter of a small GPT-like model: its shape, how it is sharded over tensor ranks, its stage. */
struct ParamSpec {
  std::string name;
  std::vector<std::size_t> shape;
  int shard_dim;      ///< -1: Replicate; d: Shard<d, tensor>
  std::size_t block;  ///< transformer block (stage assignment); 0 = embedding, blocks+1 = head
};

constexpr std::size_t kBlocks = 4, kVocab = 18, kHidden = 8, kFfn = 30;  // 30 splits unevenly over 4

std::vector<ParamSpec> model_specs() {
  std::vector<ParamSpec> s;
  s.push_back({"embed.weight", {kVocab, kHidden}, 0, 0});  // vocab-parallel
  for (std::size_t b = 0; b < kBlocks; ++b) {
    const std::string p = "block" + std::to_string(b) + ".";
    s.push_back({p + "ln.gain", {kHidden}, -1, b + 1});
    s.push_back({p + "fc1.weight", {kHidden, kFfn}, 1, b + 1});  // column-parallel
    s.push_back({p + "fc1.bias", {kFfn}, 0, b + 1});
    s.push_back({p + "fc2.weight", {kFfn, kHidden}, 0, b + 1});  // row-parallel
    s.push_back({p + "fc2.bias", {kHidden}, -1, b + 1});
  }
  s.push_back({"head.weight", {kHidden, kVocab}, 1, kBlocks + 1});
  return s;
}

/** The pipeline stage of a block: transformer blocks split by the block rule, embedding first, head last. */
std::size_t stage_of(const ParamSpec& s, std::size_t pp) {
  if (s.block == 0) return 0;
  if (s.block == kBlocks + 1) return pp - 1;
  for (std::size_t st = 0; st < pp; ++st) {
    const auto b = block_of(kBlocks, pp, st);
    if (s.block - 1 >= b.offset && s.block - 1 < b.offset + b.extent) return st;
  }
  return pp - 1;
}

template <std::size_t R>
Box<R> box_for(const ParamSpec& s, const DeviceMesh<>& mesh, const MeshCoord& c) {
  std::array<std::size_t, R> g{};
  for (std::size_t d = 0; d < R; ++d) g[d] = s.shape[d];
  if (s.shard_dim == 0) return Shard<0, axis::tensor>::local_box<R>(g, mesh, c);
  if constexpr (R > 1)
    if (s.shard_dim == 1) return Shard<1, axis::tensor>::local_box<R>(g, mesh, c);
  return Replicate::local_box<R>(g, mesh, c);
}

std::string layout_name(const ParamSpec& s) {
  if (s.shard_dim == 0) return Shard<0, axis::tensor>::name();
  if (s.shard_dim == 1) return Shard<1, axis::tensor>::name();
  return Replicate::name();
}

/** The parameters rank `rank` holds in layout (tp, pp, dp), initialised with `seed` (values depend on global index only). */
std::vector<nn::Parameter> rank_params(std::size_t tp, std::size_t pp, std::size_t dp, std::size_t rank,
                                       std::uint64_t seed) {
  DeviceMesh<> mesh(tp, pp, dp);
  const MeshCoord c = mesh.coord(rank);
  std::vector<nn::Parameter> out;
  const auto specs = model_specs();
  for (std::size_t i = 0; i < specs.size(); ++i) {
    const auto& s = specs[i];
    if (stage_of(s, pp) != c.pipeline) continue;
    nn::Parameter p;
    if (s.shape.size() == 1) {
      p = nn::make_parameter<1>(s.name, i, {s.shape[0]}, box_for<1>(s, mesh, c), layout_name(s), s.shard_dim >= 0, seed,
                                InitSpec::normal(1.0));
    } else {
      p = nn::make_parameter<2>(s.name, i, {s.shape[0], s.shape[1]}, box_for<2>(s, mesh, c), layout_name(s),
                                s.shard_dim >= 0, seed, InitSpec::normal(1.0));
    }
    out.push_back(std::move(p));
  }
  return out;
}

/** Save blocks: values, and two AdamW-like states drawn from other seeds (bit patterns differ per tensor). */
struct RankState {
  std::vector<nn::Parameter> params, m, v;
  std::vector<io::SaveBlock> save_blocks() const {
    std::vector<io::SaveBlock> b;
    for (std::size_t i = 0; i < params.size(); ++i) {
      b.push_back(io::save_block(params[i]));
      b.push_back(io::state_block(params[i], "adamw.m", std::span<const float>(m[i].value)));
      b.push_back(io::state_block(params[i], "adamw.v", std::span<const float>(v[i].value)));
    }
    return b;
  }
};
RankState rank_state(std::size_t tp, std::size_t pp, std::size_t dp, std::size_t rank, std::uint64_t seed = 1) {
  return {rank_params(tp, pp, dp, rank, seed), rank_params(tp, pp, dp, rank, seed + 100),
          rank_params(tp, pp, dp, rank, seed + 200)};
}

io::TrainingState example_state(std::uint64_t step) {
  io::TrainingState s;
  s.step = step;
  s.data_position = 64 * step;
  s.rng = {42, 7 * step, 0xdeadbeefcafef00dull};
  s.loss_scale = io::LossScaleState{32768.0f, 17, 2};
  s.user["adamw.steps"] = std::to_string(step);
  s.user["note with spaces"] = "a=b, c:d %";
  return s;
}

void save_layout(const fs::path& root, std::size_t tp, std::size_t pp, std::size_t dp, const io::TrainingState& st,
                 io::SaveOptions opts = {}, std::uint64_t seed = 1) {
  opts.mesh = {tp, pp, dp};
  testing::RankChecks checks;
  run_threads(int(tp * pp * dp), [&](ThreadsCommunicator& comm) {
    const auto rs = rank_state(tp, pp, dp, std::size_t(comm.rank()), seed);
    const auto blocks = rs.save_blocks();
    const auto r = io::save_checkpoint(root, blocks, st, comm, opts);
    checks.expect(r.path.filename() == io::step_dir_name(st.step),
                  "rank " + std::to_string(comm.rank()) + " published " + r.path.string());
  });
  checks.assert_all(tp * pp * dp);
}

bool bits_equal(std::span<const float> a, std::span<const float> b) {
  // memcmp's pointers must not be null, even for zero bytes (an empty block's span has a null data()).
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size_bytes()) == 0);
}

/** Loads layout (tp, pp, dp) from `root` and checks every block bit for bit against the original values. */
std::vector<io::LoadStats> load_and_check(const fs::path& root, std::size_t tp, std::size_t pp, std::size_t dp,
                                          std::uint64_t seed = 1) {
  std::vector<io::LoadStats> stats(tp * pp * dp);
  testing::RankChecks checks;
  run_threads(int(tp * pp * dp), [&](ThreadsCommunicator& comm) {
    const auto want = rank_state(tp, pp, dp, std::size_t(comm.rank()), seed);
    RankState got = want;
    for (auto* group : {&got.params, &got.m, &got.v})
      for (auto& p : *group) std::fill(p.value.begin(), p.value.end(), -1.0f);
    std::vector<io::LoadBlock> blocks;
    for (std::size_t i = 0; i < got.params.size(); ++i) {
      blocks.push_back(io::load_block(got.params[i]));
      blocks.push_back(io::state_block(got.params[i], "adamw.m", std::span<float>(got.m[i].value)));
      blocks.push_back(io::state_block(got.params[i], "adamw.v", std::span<float>(got.v[i].value)));
    }
    const auto res = io::load_checkpoint(root, blocks, comm);
    const std::string where = "layout " + std::to_string(tp) + "x" + std::to_string(pp) + "x" + std::to_string(dp) +
                              " rank " + std::to_string(comm.rank());
    checks.expect(res.state == example_state(res.state.step), where + ": training state");
    for (std::size_t i = 0; i < want.params.size(); ++i) {
      const std::string tensor = where + " tensor " + want.params[i].name;
      checks.expect(bits_equal(got.params[i].value, want.params[i].value), tensor + " value");
      checks.expect(bits_equal(got.m[i].value, want.m[i].value), tensor + " adamw.m");
      checks.expect(bits_equal(got.v[i].value, want.v[i].value), tensor + " adamw.v");
    }
    stats[std::size_t(comm.rank())] = res.stats;
  });
  checks.assert_all(tp * pp * dp);
  return stats;
}

std::size_t total_model_bytes() {
  std::size_t n = 0;
  for (const auto& s : model_specs()) n += 3 * 4 * io::volume(s.shape);
  return n;
}

}  // namespace

TEST_CASE("CRC-32 matches the standard check value and is incremental", "[io]") {
  CHECK(io::crc32(std::string_view("123456789")) == 0xCBF43926u);
  CHECK(io::crc32(std::string_view("")) == 0u);
  const std::string s = "The quick brown fox jumps over the lazy dog";
  CHECK(io::crc32(std::string_view(s)) == 0x414FA339u);
  const auto bytes = std::as_bytes(std::span<const char>(s.data(), s.size()));
  auto c = io::crc32_update(io::crc32_init, bytes.first(10));
  c = io::crc32_update(c, bytes.subspan(10));
  CHECK(io::crc32_final(c) == 0x414FA339u);
  // Combining the CRCs of two parts gives the CRC of the whole, for every split (odd lengths included).
  for (std::size_t k = 0; k <= bytes.size(); ++k)
    CHECK(io::crc32_combine(io::crc32(bytes.first(k)), io::crc32(bytes.subspan(k)), bytes.size() - k) == 0x414FA339u);
}

TEST_CASE("flat ranges decompose into boxes that cover them in order", "[io]") {
  const io::BoxN local{{2, 3}, {0, 4}, {1, 5}};  // 60 elements at a global offset
  for (std::size_t b = 0; b <= 60; b += 7)
    for (std::size_t e = b; e <= 60; e += 5) {
      const auto pieces = io::flat_range_boxes(local, b, e);
      CHECK(pieces.size() <= 7);
      std::size_t next = 0;
      for (const auto& p : pieces) {
        CHECK(p.flat_offset == next);
        // Each piece's elements are consecutive in the local block's row-major order.
        std::size_t k = 0;
        io::for_each_row(local, p.box, p.box, [&](std::size_t src, std::size_t dst, std::size_t n) {
          CHECK(dst == k);
          CHECK(src == b + p.flat_offset + k);
          k += n;
        });
        next += io::volume(p.box);
      }
      CHECK(next == e - b);
    }
}

TEST_CASE("manifest round-trips and rejects damage", "[io]") {
  io::Manifest m;
  m.mesh = {2, 2, 1};
  m.state = example_state(12);
  io::TensorRecord t{"w x", "f32", {4, 6}, "Shard<1, tensor>", {}};
  t.shards.push_back({{{0, 4}, {0, 3}}, "rank-00000.bin", 0, 48, 0x1234abcd, 16, 48});
  t.shards.push_back({{{0, 4}, {3, 3}}, "rank-00001.bin", 0, 48, 0x0badf00d, 16, 48});
  m.tensors.push_back(t);
  const std::string text = io::format_manifest(m);
  const auto back = io::parse_manifest(text, "m.txt");
  CHECK(back.state == m.state);
  CHECK(back.mesh == m.mesh);
  REQUIRE(back.tensors.size() == 1);
  CHECK(back.tensors[0].name == "w x");
  CHECK(back.tensors[0].layout == "Shard<1, tensor>");
  CHECK(back.tensors[0].shards[1].crc32 == 0x0badf00du);
  CHECK(io::format_manifest(back) == text);

  SECTION("truncated") {
    CHECK_THROWS_WITH(io::parse_manifest(text.substr(0, text.size() / 2), "m.txt"),
                      Catch::Contains("m.txt") && Catch::Contains("truncated"));
  }
  SECTION("edited") {
    std::string bad = text;
    bad[bad.find("shape=4,6")] = 'S';
    CHECK_THROWS_WITH(io::parse_manifest(bad, "m.txt"), Catch::Contains("checksum"));
  }
  SECTION("a missing shard is found even with a valid checksum") {
    io::Manifest gap = m;
    gap.tensors[0].shards.pop_back();
    CHECK_THROWS_WITH(io::parse_manifest(io::format_manifest(gap), "m.txt"),
                      Catch::Contains("'w x'") && Catch::Contains("shard is missing"));
  }
  SECTION("overlapping shards") {
    io::Manifest ov = m;
    ov.tensors[0].shards[1].box = {{0, 4}, {2, 3}};
    ov.tensors[0].shards[1].bytes = 48;
    CHECK_THROWS_WITH(io::parse_manifest(io::format_manifest(ov), "m.txt"), Catch::Contains("overlap"));
  }
  SECTION("a file name with a directory") {
    io::Manifest esc = m;
    esc.tensors[0].shards[0].file = "../../etc/passwd";
    CHECK_THROWS_WITH(io::parse_manifest(io::format_manifest(esc), "m.txt"), Catch::Contains("plain file name"));
  }
}

TEST_CASE("the manifest records the context-parallel size; one written before cp was recorded reads as cp = 1",
          "[io]") {
  io::Manifest m;
  m.mesh = {2, 1, 2, 4};
  m.state = example_state(3);
  io::TensorRecord t{"w", "f32", {2, 2}, "Replicate", {}};
  t.shards.push_back({{{0, 2}, {0, 2}}, "rank-00000.bin", 0, 16, 0x1234abcd, 16, 16});
  m.tensors.push_back(t);
  const std::string text = io::format_manifest(m);
  CHECK(text.find("\nmesh tp=2 pp=1 dp=2 cp=4\n") != std::string::npos);
  CHECK(io::parse_manifest(text, "m.txt").mesh == io::MeshShape{2, 1, 2, 4});
  // The same manifest as an older build wrote it: no cp= token, and its own checksum over the shorter text.
  std::string old = text.substr(0, text.rfind("end crc32="));
  old.erase(old.find(" cp=4"), 5);
  char crc[9];
  std::snprintf(crc, sizeof crc, "%08x", unsigned(io::crc32(std::string_view(old))));
  old += std::string("end crc32=") + crc + "\n";
  const io::Manifest back = io::parse_manifest(old, "old.txt");
  CHECK(back.mesh == io::MeshShape{2, 1, 2, 1});
  CHECK(back.state == m.state);
  // A malformed mesh line names what it needs.
  std::string bad = text.substr(0, text.rfind("end crc32="));
  bad.replace(bad.find(" cp=4"), 5, " cp=4 ep=1");
  std::snprintf(crc, sizeof crc, "%08x", unsigned(io::crc32(std::string_view(bad))));
  bad += std::string("end crc32=") + crc + "\n";
  CHECK_THROWS_WITH(io::parse_manifest(bad, "bad.txt"), Catch::Contains("bad.txt") && Catch::Contains("cp="));
}

TEST_CASE("a (2,2,1) checkpoint loads bit-exactly into every other layout", "[io]") {
  TempDir dir("reshard");
  io::SaveOptions opts;
  opts.chunk_elems = 4;  // small chunks, so partial reads are visible at this model size
  save_layout(dir.path, 2, 2, 1, example_state(100), opts);
  const auto m = io::read_manifest(dir.path);
  CHECK(m.mesh == io::MeshShape{2, 2, 1});
  CHECK(m.state == example_state(100));
  CHECK(m.tensors.size() == 3 * model_specs().size());
  CHECK(m.find("block1.fc1.weight")->layout == "Shard<1, tensor>");
  CHECK(m.find("block1.fc1.weight")->shards.size() == 2);
  // Replicated tensors were written once, not once per tensor rank.
  CHECK(m.find("block1.ln.gain")->shards.size() == 1);
  CHECK(m.find("block1.ln.gain/adamw.v")->shards.size() == 1);

  const std::size_t total = total_model_bytes();
  SECTION("(1,1,1)") {
    const auto st = load_and_check(dir.path, 1, 1, 1);
    CHECK(st[0].bytes_needed == total);
  }
  SECTION("(4,1,1): each rank reads about its quarter") {
    const auto st = load_and_check(dir.path, 4, 1, 1);
    for (const auto& s : st) {
      CHECK(s.bytes_read < total / 2);
      // Reads are the needed bytes plus chunk rounding and checksum tables, never whole shards.
      CHECK(s.bytes_read <= 2 * s.bytes_needed);
    }
  }
  SECTION("(1,4,1): each stage reads only its own parameters") {
    const auto st = load_and_check(dir.path, 1, 4, 1);
    for (const auto& s : st) {
      CHECK(s.bytes_read < total / 2);
      CHECK(s.bytes_read <= 2 * s.bytes_needed);
    }
  }
  SECTION("(1,2,2)") {
    const auto st = load_and_check(dir.path, 1, 2, 2);
    for (const auto& s : st) CHECK(s.bytes_read <= 2 * s.bytes_needed);
  }
  SECTION("(2,2,1) itself, verifying whole shards") {
    testing::RankChecks checks;
    run_threads(4, [&](ThreadsCommunicator& comm) {
      auto rs = rank_state(2, 2, 1, std::size_t(comm.rank()));
      std::vector<io::LoadBlock> blocks;
      for (auto& p : rs.params) blocks.push_back(io::load_block(p));
      io::LoadOptions lo;
      lo.verify_whole_shards = true;
      const auto r = io::load_checkpoint(dir.path, blocks, comm, lo);
      checks.expect(r.stats.bytes_read >= r.stats.bytes_needed, "rank " + std::to_string(comm.rank()) + " read " +
                                                                    std::to_string(r.stats.bytes_read) + " of " +
                                                                    std::to_string(r.stats.bytes_needed) + " bytes");
    });
    checks.assert_all(4);
  }
}

TEST_CASE("more tensor ranks than rows: empty blocks save and load as nothing", "[io]") {
  TempDir wide("wide"), narrow("narrow");
  save_layout(wide.path, 32, 1, 1, example_state(6));  // 30- and 18-wide dimensions leave some ranks empty
  load_and_check(wide.path, 1, 1, 1);
  save_layout(narrow.path, 1, 1, 1, example_state(6));
  load_and_check(narrow.path, 32, 1, 1);
}

TEST_CASE("data-parallel replicas are written once, by the lowest rank", "[io]") {
  TempDir dir("dedup");
  std::vector<io::SaveResult> results(4);
  run_threads(4, [&](ThreadsCommunicator& comm) {  // (1,1,4): four identical replicas
    const auto rs = rank_state(1, 1, 4, std::size_t(comm.rank()));
    const auto blocks = rs.save_blocks();
    results[std::size_t(comm.rank())] = io::save_checkpoint(dir.path, blocks, example_state(3), comm);
  });
  CHECK(results[0].blocks_written == 3 * model_specs().size());
  for (int r = 1; r < 4; ++r) {
    CHECK(results[std::size_t(r)].blocks_written == 0);
    CHECK(results[std::size_t(r)].blocks_replicated == 3 * model_specs().size());
    CHECK_FALSE(fs::exists(results[0].path / io::rank_file_name(r, "bin")));
  }
  load_and_check(dir.path, 2, 1, 1);
}

TEST_CASE("ZeRO-1 flat optimizer states load into a plain layout", "[io]") {
  TempDir dir("zero");
  const std::size_t tp = 2, dp = 2;
  // Moments are sharded over data ranks as flat ranges of each rank's local parameter block.
  run_threads(int(tp * dp), [&](ThreadsCommunicator& comm) {
    const auto rs = rank_state(tp, 1, dp, std::size_t(comm.rank()));
    const std::size_t data = DeviceMesh<>(tp, 1, dp).coord(std::size_t(comm.rank())).data;
    std::vector<io::SaveBlock> blocks;
    for (std::size_t i = 0; i < rs.params.size(); ++i) {
      blocks.push_back(io::save_block(rs.params[i]));
      const auto range = block_of(rs.params[i].local_size(), dp, data);
      for (const auto* st : {&rs.m, &rs.v}) {
        const auto span = std::span<const float>((*st)[i].value).subspan(range.offset, range.extent);
        for (auto& b : io::flat_state_blocks(rs.params[i], st == &rs.m ? "adamw.m" : "adamw.v", range.offset, span))
          blocks.push_back(b);
      }
    }
    io::save_checkpoint(dir.path, blocks, example_state(5), comm);
  });
  load_and_check(dir.path, 1, 1, 1);
  load_and_check(dir.path, 4, 1, 1);
  // And back into ZeRO ranges of another layout.
  testing::RankChecks checks;
  run_threads(4, [&](ThreadsCommunicator& comm) {
    const auto want = rank_state(4, 1, 1, std::size_t(comm.rank()));
    for (std::size_t i = 0; i < want.params.size(); ++i) {
      const auto range = block_of(want.params[i].local_size(), 3, 1);  // the middle third
      std::vector<float> got(range.extent, -1.0f);
      auto blocks = io::flat_state_blocks(want.params[i], "adamw.m", range.offset, std::span<float>(got));
      io::load_checkpoint(dir.path, blocks);
      checks.expect(bits_equal(got, std::span<const float>(want.m[i].value).subspan(range.offset, range.extent)),
                    "rank " + std::to_string(comm.rank()) + " " + want.params[i].name + "/adamw.m middle third");
    }
  });
  checks.assert_all(4);
}

TEST_CASE("parallel::Zero1AdamW moments saved from (2,1,2) resume a single-rank AdamW exactly", "[io]") {
  TempDir dir("zero_adamw");
  optim::AdamWConfig cfg;
  cfg.lr = 1e-2f;
  auto with_grads = [](std::vector<nn::Parameter> ps, const std::vector<nn::Parameter>& g) {
    for (std::size_t i = 0; i < ps.size(); ++i) ps[i].grad = g[i].value;  // gradients depend on global index only
    return ps;
  };
  run_threads(4, [&](ThreadsCommunicator& world) {
    const auto r = std::size_t(world.rank());
    const MeshCoord c = DeviceMesh<>(2, 1, 2).coord(r);
    auto data = world.split(int(c.tensor), int(c.data));
    auto params = with_grads(rank_params(2, 1, 2, r, 1), rank_params(2, 1, 2, r, 9));
    std::vector<nn::Parameter*> ptrs;
    for (auto& p : params) ptrs.push_back(&p);
    parallel::Zero1AdamW<ThreadsCommunicator> zero(ptrs, data, cfg, {.bucket_bytes = 256});
    zero.step();
    std::vector<io::SaveBlock> blocks;
    for (const auto& p : params) blocks.push_back(io::save_block(p));
    for (const auto& piece : zero.state_pieces()) {
      for (auto& b :
           io::flat_state_blocks(*piece.param, "adamw.m", piece.param_offset, std::span<const float>(piece.m)))
        blocks.push_back(b);
      for (auto& b :
           io::flat_state_blocks(*piece.param, "adamw.v", piece.param_offset, std::span<const float>(piece.v)))
        blocks.push_back(b);
    }
    io::TrainingState st;
    st.step = 1;
    st.user["adamw.steps"] = std::to_string(zero.steps());
    io::save_checkpoint(dir.path, blocks, st, world);
  });
  // The single-rank reference takes the same step.
  auto ref = with_grads(rank_params(1, 1, 1, 0, 1), rank_params(1, 1, 1, 0, 9));
  std::vector<nn::Parameter*> ref_ptrs;
  for (auto& p : ref) ref_ptrs.push_back(&p);
  optim::AdamW ref_opt(ref_ptrs, cfg);
  ref_opt.step();
  // A fresh single-rank model and optimizer resume from the ZeRO checkpoint.
  auto fresh = rank_params(1, 1, 1, 0, 77);
  std::vector<nn::Parameter*> ptrs;
  for (auto& p : fresh) ptrs.push_back(&p);
  optim::AdamW opt(ptrs, cfg);
  std::vector<io::LoadBlock> blocks;
  for (std::size_t i = 0; i < fresh.size(); ++i) {
    blocks.push_back(io::load_block(fresh[i]));
    blocks.push_back(io::state_block(fresh[i], "adamw.m", opt.first_moment_mut(i)));
    blocks.push_back(io::state_block(fresh[i], "adamw.v", opt.second_moment_mut(i)));
  }
  const auto res = io::load_checkpoint(dir.path, blocks);
  opt.set_steps(std::stoul(res.state.user.at("adamw.steps")));
  CHECK(opt.steps() == 1);
  for (std::size_t i = 0; i < fresh.size(); ++i) {
    INFO(fresh[i].name);
    CHECK(bits_equal(fresh[i].value, ref[i].value));
    CHECK(bits_equal(opt.first_moment(i), ref_opt.first_moment(i)));
    CHECK(bits_equal(opt.second_moment(i), ref_opt.second_moment(i)));
  }
  // The next step from the restored state equals the reference's next step.
  for (std::size_t i = 0; i < fresh.size(); ++i) fresh[i].grad = ref[i].grad;
  opt.step();
  ref_opt.step();
  for (std::size_t i = 0; i < fresh.size(); ++i) CHECK(bits_equal(fresh[i].value, ref[i].value));
}

TEST_CASE("a crash at any point of a save leaves the previous checkpoint loadable", "[io]") {
  TempDir dir("crash");
  io::SaveOptions opts;
  opts.write_chunk_bytes = 256;  // many write events: crashes land inside files too
  const auto rs1 = rank_state(1, 1, 1, 0, 1);
  const auto rs2 = rank_state(1, 1, 1, 0, 2);
  io::save_checkpoint(dir.path, rs1.save_blocks(), example_state(1), opts);

  // Count the disk-changing operations of the next save.
  std::size_t events = 0;
  {
    TempDir probe("crash_probe");
    io::save_checkpoint(probe.path, rs1.save_blocks(), example_state(1), opts);
    io::SaveOptions counting = opts;
    counting.hook = [&](const io::IoEvent&) { ++events; };
    io::save_checkpoint(probe.path, rs2.save_blocks(), example_state(2), counting);
  }
  REQUIRE(events > 20);
  struct Crash {};
  for (std::size_t k = 0; k < events; ++k) {
    INFO("crash before operation " << k << " of " << events);
    io::SaveOptions crashing = opts;
    std::size_t seen = 0;
    crashing.hook = [&](const io::IoEvent&) {
      if (seen++ == k) throw Crash{};
    };
    CHECK_THROWS_AS(io::save_checkpoint(dir.path, rs2.save_blocks(), example_state(2), crashing), Crash);
    CHECK(io::resolve_checkpoint(dir.path).filename() == "step-00000001");
    auto got = rank_state(1, 1, 1, 0, 7);
    std::vector<io::LoadBlock> blocks;
    for (auto& p : got.params) blocks.push_back(io::load_block(p));
    CHECK(io::load_checkpoint(dir.path, blocks).state.step == 1);
    bool same = true;
    for (std::size_t i = 0; i < got.params.size(); ++i)
      same = same && bits_equal(got.params[i].value, rs1.params[i].value);
    CHECK(same);
  }
  // After all those crashes, a clean save succeeds and becomes latest.
  io::save_checkpoint(dir.path, rs2.save_blocks(), example_state(2), opts);
  CHECK(io::resolve_checkpoint(dir.path).filename() == "step-00000002");
  CHECK(io::read_manifest(dir.path).state.step == 2);
}

TEST_CASE("a rank that fails while saving fails the save on every rank; latest is unchanged", "[io]") {
  TempDir dir("rankfail");
  save_layout(dir.path, 2, 1, 1, example_state(1));
  io::SaveOptions opts;
  struct Crash {};
  std::vector<std::string> errors(2);
  run_threads(2, [&](ThreadsCommunicator& comm) {
    io::SaveOptions o = opts;
    if (comm.rank() == 1)
      o.hook = [](const io::IoEvent& e) {
        if (e.kind == io::IoEvent::Kind::write) throw Crash{};
      };
    const auto rs = rank_state(2, 1, 1, std::size_t(comm.rank()), 5);
    try {
      io::save_checkpoint(dir.path, rs.save_blocks(), example_state(2), comm, o);
    } catch (const Crash&) {
      errors[1] = "crash";
    } catch (const io::checkpoint_error& e) {
      errors[std::size_t(comm.rank())] = e.what();
    }
  });
  CHECK(errors[1] == "crash");
  CHECK_THAT(errors[0], Catch::Contains("failed on rank(s) 1"));
  CHECK(io::resolve_checkpoint(dir.path).filename() == "step-00000001");
  load_and_check(dir.path, 1, 1, 1);
}

TEST_CASE("saving the step that latest names again keeps the old one until the new one is complete", "[io]") {
  TempDir dir("resave");
  const auto rs = rank_state(1, 1, 1, 0);
  io::save_checkpoint(dir.path, rs.save_blocks(), example_state(4));
  const auto r = io::save_checkpoint(dir.path, rs.save_blocks(), example_state(4));
  CHECK(r.path.filename() == "step-00000004.1");
  CHECK(io::resolve_checkpoint(dir.path) == r.path);
  io::SaveOptions keep;
  keep.keep_last = 1;
  io::save_checkpoint(dir.path, rs.save_blocks(), example_state(5), keep);
  CHECK_FALSE(fs::exists(dir.path / "step-00000004"));
  CHECK_FALSE(fs::exists(dir.path / "step-00000004.1"));
  CHECK(fs::exists(dir.path / "step-00000005" / "manifest.txt"));
}

TEST_CASE("damaged, missing or foreign checkpoints are reported, never loaded", "[io]") {
  TempDir dir("damage");
  io::SaveOptions opts;
  opts.chunk_elems = 8;
  save_layout(dir.path, 2, 1, 1, example_state(9), opts);
  const fs::path ck = io::resolve_checkpoint(dir.path);
  auto load_all = [&] {
    auto rs = rank_state(1, 1, 1, 0);
    std::vector<io::LoadBlock> blocks;
    for (std::size_t i = 0; i < rs.params.size(); ++i) {
      blocks.push_back(io::load_block(rs.params[i]));
      blocks.push_back(io::state_block(rs.params[i], "adamw.m", std::span<float>(rs.m[i].value)));
    }
    return io::load_checkpoint(dir.path, blocks);
  };
  REQUIRE_NOTHROW(load_all());
  const auto m = io::read_manifest(dir.path);
  const auto& victim = m.find("block2.fc1.weight")->shards[1];

  SECTION("a corrupted shard") {
    {
      std::fstream f(ck / victim.file, std::ios::in | std::ios::out | std::ios::binary);
      f.seekp(std::streamoff(victim.offset + 13));
      f.put('\x5a');
    }
    CHECK_THROWS_WITH(load_all(), Catch::Contains("checksum mismatch") && Catch::Contains(victim.file) &&
                                      Catch::Contains("block2.fc1.weight"));
  }
  SECTION("a truncated shard file") {
    fs::resize_file(ck / victim.file, victim.offset + 8);
    CHECK_THROWS_WITH(load_all(), Catch::Contains("truncated") && Catch::Contains(victim.file));
  }
  SECTION("a missing shard file") {
    fs::remove(ck / victim.file);
    CHECK_THROWS_WITH(load_all(), Catch::Contains("missing file") && Catch::Contains(victim.file));
  }
  SECTION("a missing manifest") {
    fs::remove(ck / "manifest.txt");
    CHECK_THROWS_WITH(load_all(), Catch::Contains("manifest.txt"));
  }
  SECTION("a corrupted manifest") {
    {
      std::fstream f(ck / "manifest.txt", std::ios::in | std::ios::out | std::ios::binary);
      f.seekp(60);
      f.put('#');
    }
    CHECK_THROWS_WITH(load_all(), Catch::Contains("manifest.txt") && Catch::Contains("checksum"));
  }
  SECTION("a manifest of another model: different shape") {
    auto rs = rank_state(1, 1, 1, 0);
    REQUIRE(rs.params[2].global_shape.size() == 2);
    auto b = io::load_block(rs.params[2]);
    b.global_shape[1] += 2;
    std::vector<float> buf(io::volume(b.global_shape));
    b.box = io::full_box(b.global_shape);
    b.data = buf;
    CHECK_THROWS_WITH(
        io::load_checkpoint(dir.path, std::span<const io::LoadBlock>(&b, 1)),
        Catch::Contains(rs.params[2].name) && Catch::Contains("different model") && Catch::Contains("manifest.txt"));
  }
  SECTION("a manifest of another model: unknown parameter") {
    std::vector<float> buf(4);
    io::LoadBlock b{"decoder.extra.bias", {4}, {{0, 4}}, "Replicate", buf};
    CHECK_THROWS_WITH(io::load_checkpoint(dir.path, std::span<const io::LoadBlock>(&b, 1)),
                      Catch::Contains("decoder.extra.bias") && Catch::Contains("different model"));
  }
  SECTION("no checkpoint at all") {
    TempDir empty("empty");
    CHECK_THROWS_WITH(io::load_checkpoint(empty.path, {}), Catch::Contains("latest"));
  }
  SECTION("a failure on one rank fails the load on every rank") {
    fs::remove(ck / victim.file);
    std::vector<std::string> errors(2);
    run_threads(2, [&](ThreadsCommunicator& comm) {
      auto rs = rank_state(2, 1, 1, std::size_t(comm.rank()));
      std::vector<io::LoadBlock> blocks;
      for (auto& p : rs.params) blocks.push_back(io::load_block(p));
      try {
        io::load_checkpoint(dir.path, blocks, comm);
      } catch (const io::checkpoint_error& e) {
        errors[std::size_t(comm.rank())] = e.what();
      }
    });
    CHECK_THAT(errors[1], Catch::Contains("missing file"));
    CHECK_THAT(errors[0], Catch::Contains("failed on rank(s) 1"));
  }
  SECTION("the run's error shows the failing rank's own message, whichever rank fails first") {
    {
      std::fstream f(ck / victim.file, std::ios::in | std::ios::out | std::ios::binary);
      f.seekp(std::streamoff(victim.offset + 13));
      f.put('\x5a');
    }
    // Rank 1 names the damage, rank 0 reports that rank 1 failed: rank 1's own words come first.
    for (int round = 0; round < 10; ++round) {
      std::string msg;
      int failed_rank = -1;
      try {
        run_threads(2, [&](ThreadsCommunicator& comm) {
          auto rs = rank_state(2, 1, 1, std::size_t(comm.rank()));
          std::vector<io::LoadBlock> blocks;
          for (auto& p : rs.params) blocks.push_back(io::load_block(p));
          io::load_checkpoint(dir.path, blocks, comm);
        });
      } catch (const rank_failure& e) {
        msg = e.what();
        failed_rank = e.rank();
      }
      CAPTURE(round, msg);
      CHECK(failed_rank == 1);
      CHECK_THAT(msg,
                 Catch::StartsWith("rank 1: ") && Catch::Contains("checksum mismatch") && Catch::Contains(victim.file));
      const auto own = msg.find("checksum mismatch"),
                 report = msg.find("\nrank 0: load_checkpoint failed on rank(s) 1");
      CHECK(own < report);
      CHECK(report != std::string::npos);
    }
  }
}

TEST_CASE("a damaged latest or an unreadable step directory is reported as such", "[io]") {
  TempDir dir("latest");
  save_layout(dir.path, 1, 1, 1, example_state(3));
  const auto latest = dir.path / "latest";
  SECTION("NUL and control bytes are shown escaped, not printed raw or cut off") {
    {
      std::ofstream f(latest, std::ios::binary);
      f << std::string("step\0\x1b[31m-x", 12) << "\n";
    }
    CHECK_THROWS_WITH(
        io::resolve_checkpoint(dir.path),
        Catch::Contains("does not name a checkpoint directory: it holds 'step\\x00\\x1b[31m-x' (12 bytes)"));
  }
  SECTION("a path is refused") {
    {
      std::ofstream f(latest);
      f << "../elsewhere\n";
    }
    CHECK_THROWS_WITH(io::resolve_checkpoint(dir.path), Catch::Contains("it holds '../elsewhere'"));
  }
  SECTION("a step directory that cannot be read is not called missing") {
    // A symbolic link to itself fails every lookup with ELOOP: unreadable, as a directory without
    // permissions is for a user who is not root.
    const auto step = io::resolve_checkpoint(dir.path);
    fs::rename(step, dir.path / "moved");
    fs::create_directory_symlink(step.filename(), step);
    CHECK_THROWS_WITH(io::resolve_checkpoint(dir.path),
                      Catch::Contains("cannot read checkpoint") && Catch::Contains(step.filename().string()) &&
                          Catch::Contains("symbolic links") && !Catch::Contains("has no manifest"));
  }
  SECTION("an empty path is refused") {
    CHECK_THROWS_WITH(io::resolve_checkpoint(""), Catch::Contains("no checkpoint path given (the path is empty)"));
  }
}

TEST_CASE("two jobs saving into one directory: the second is refused, naming the first", "[io]") {
  TempDir dir("lock");
  // Another job: a child process takes the lock and holds it until the parent says so.
  int ready[2], release[2];
  REQUIRE(::pipe(ready) == 0);
  REQUIRE(::pipe(release) == 0);
  const pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    char c = 0;
    {
      io::DirectoryLock held(dir.path);
      (void)!::write(ready[1], "r", 1);
      (void)!::read(release[0], &c, 1);
    }
    ::_exit(0);
  }
  char c = 0;
  REQUIRE(::read(ready[0], &c, 1) == 1);
  const std::string holder = "in use by job pid " + std::to_string(child) + " on host ";
  CHECK_THROWS_WITH(io::DirectoryLock(dir.path), Catch::Contains(holder));
  // A save (which takes the lock itself) is refused before it writes anything.
  auto rs = rank_state(1, 1, 1, 0);
  const auto blocks = rs.save_blocks();
  CHECK_THROWS_WITH(io::save_checkpoint(dir.path, blocks, example_state(5)),
                    Catch::Contains(holder) && Catch::Contains("another --save directory"));
  CHECK_FALSE(fs::exists(dir.path / "latest"));
  CHECK_FALSE(fs::exists(dir.path / ".partial-step-00000005"));
  (void)!::write(release[1], "x", 1);
  int status = 0;
  REQUIRE(::waitpid(child, &status, 0) == child);
  // Once the other job has ended, the directory is free; a job holding the lock saves under it.
  io::DirectoryLock mine(dir.path);
  CHECK(io::DirectoryLock::held_here(dir.path));
  CHECK_NOTHROW(io::save_checkpoint(dir.path, blocks, example_state(5)));
  CHECK(fs::exists(dir.path / "latest"));
}

TEST_CASE("a checkpoint directory that cannot be written is refused when locked, before any work", "[io]") {
  TempDir dir("unwritable");
  const auto file = dir.path / "a-file";
  std::ofstream(file) << "x";
  CHECK_THROWS_WITH(io::DirectoryLock(file / "ckpt"),
                    Catch::Contains("cannot create checkpoint directory") && Catch::Contains("a-file/ckpt"));
  CHECK_THROWS_WITH(io::DirectoryLock(file), Catch::Contains("is not a directory"));
}

TEST_CASE("probing that a directory can be created beside a file holds when every rank probes at once", "[io]") {
  TempDir dir("probe");
  const auto out = dir.path / "model.safetensors";
  // Eight ranks probing the same export path 200 times each, as the ranks of one job do before they train: a probe
  // under one shared name would see another rank's directory come and go and report it as an error.
  std::vector<std::string> first_failure(8);
  std::vector<std::thread> ranks;
  for (int r = 0; r < 8; ++r)
    ranks.emplace_back([&, r] {
      for (int i = 0; i < 200 && first_failure[r].empty(); ++i) first_failure[r] = io::cannot_create_beside(out);
    });
  for (auto& t : ranks) t.join();
  for (int r = 0; r < 8; ++r) CHECK(first_failure[r] == "");
  CHECK(fs::is_empty(dir.path));  // every probe removed its directory
  CHECK(io::cannot_create_beside(dir.path / "missing" / "model.safetensors") != "");
}

// ---- fixtures for the mpar-ckpt tests registered in examples/mpar_ckpt (hidden: run by tag only) ----

namespace {
fs::path tool_dir() {
  const char* d = std::getenv("MPAR_IO_TOOL_DIR");
  REQUIRE(d != nullptr);
  return d;
}
}  // namespace

TEST_CASE("mpar-ckpt sample: a (2,2,1) checkpoint", "[.tool-sample]") {
  fs::remove_all(tool_dir());
  save_layout(tool_dir() / "src", 2, 2, 1, example_state(100));
}

TEST_CASE("mpar-ckpt convert --tp 4 output", "[.tool-check-tp4]") {
  const auto m = io::read_manifest(tool_dir() / "tp4");
  CHECK(m.mesh == io::MeshShape{4, 1, 2, 2});  // --pp, --dp and --cp recorded as given
  CHECK(m.find("block1.fc1.weight")->shards.size() == 4);
  CHECK(m.find("block1.fc2.weight/adamw.m")->shards.size() == 4);
  CHECK(m.find("block1.ln.gain")->shards.size() == 1);
  load_and_check(tool_dir() / "tp4", 4, 1, 1);
  load_and_check(tool_dir() / "tp4", 1, 1, 1);
}

TEST_CASE("mpar-ckpt convert --single output", "[.tool-check-single]") {
  const auto m = io::read_manifest(tool_dir() / "single");
  CHECK(m.mesh == io::MeshShape{1, 1, 1});
  for (const auto& t : m.tensors) {
    CHECK(t.shards.size() == 1);
    CHECK(t.shards[0].file == "rank-00000.bin");
  }
  load_and_check(tool_dir() / "single", 2, 2, 1);
}
