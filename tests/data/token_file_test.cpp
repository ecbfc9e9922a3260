// Token files (llm.c .bin, .npy), the common sampler and the token sources: good files read back
// exactly, each damaged file is refused naming the file and the byte offset.
#include <catch2/catch.hpp>

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <mpar/core/init.hpp>
#include <mpar/data/char_dataset.hpp>
#include <mpar/data/token_file.hpp>
#include <mpar/data/token_range.hpp>
#include <mpar/data/token_source.hpp>
#include <mpar/data/token_vector.hpp>

using namespace mpar;
namespace fs = std::filesystem;

namespace {

fs::path token_file_scratch(const std::string& name) {
  const fs::path dir = fs::temp_directory_path() / "mpar-test-data";
  fs::create_directories(dir);
  return dir / name;
}

void put_le(std::vector<unsigned char>& out, std::uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<unsigned char>((v >> (8 * i)) & 0xff));
}

/** llm.c's .bin: 256 int32 header (magic, version, count), then the tokens; written byte by byte here. */
std::vector<unsigned char> llmc_bytes(const std::vector<std::uint32_t>& ids, std::int32_t magic = 20240520,
                                      std::int32_t version = 1, std::int64_t count = -1) {
  std::vector<unsigned char> b;
  put_le(b, std::uint32_t(magic), 4);
  put_le(b, std::uint32_t(version), 4);
  put_le(b, std::uint32_t(count < 0 ? std::int64_t(ids.size()) : count), 4);
  b.resize(1024, 0);
  for (auto id : ids) put_le(b, id, version == 2 ? 4 : 2);
  return b;
}

/** A .npy 1.0 file with a hand-written header dictionary, padded so the data starts at a multiple of 64. */
std::vector<unsigned char> npy_bytes(const std::vector<std::uint32_t>& ids, const std::string& descr, int width,
                                     std::string shape = "") {
  if (shape.empty()) shape = "(" + std::to_string(ids.size()) + ",)";
  std::string dict = "{'descr': '" + descr + "', 'fortran_order': False, 'shape': " + shape + ", }";
  while ((10 + dict.size() + 1) % 64 != 0) dict += ' ';
  dict += '\n';
  std::vector<unsigned char> b = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0};
  put_le(b, dict.size(), 2);
  b.insert(b.end(), dict.begin(), dict.end());
  for (auto id : ids) put_le(b, id, width);
  return b;
}

fs::path write(const std::string& name, const std::vector<unsigned char>& bytes) {
  const fs::path p = token_file_scratch(name);
  std::ofstream f(p, std::ios::binary | std::ios::trunc);
  f.write(reinterpret_cast<const char*>(bytes.data()), std::streamsize(bytes.size()));
  return p;
}

std::vector<std::uint32_t> some_ids(std::size_t n, std::uint32_t vocab) {
  std::vector<std::uint32_t> ids(n);
  const CounterRng rng{7, 3};
  for (std::size_t i = 0; i < n; ++i) ids[i] = std::uint32_t(rng.bits(i) % vocab);
  return ids;
}

}  // namespace

TEST_CASE("token files: llm.c .bin (uint16 and uint32) and .npy (uint16 and uint32) read back every id", "[data]") {
  const auto ids = some_ids(500, 50257);
  const auto v32 = some_ids(500, 128256);
  const std::vector<std::pair<fs::path, const std::vector<std::uint32_t>*>> files = {
      {write("ok_v1.bin", llmc_bytes(ids)), &ids},
      {write("ok_v2.bin", llmc_bytes(v32, 20240520, 2)), &v32},
      {write("ok_u2.npy", npy_bytes(ids, "<u2", 2)), &ids},
      {write("ok_u4.npy", npy_bytes(v32, "<u4", 4)), &v32},
  };
  for (const auto& [path, want] : files) {
    INFO(path.string());
    const data::TokenFile tf(path.string(), 128256, 8);
    REQUIRE(tf.size() == want->size());
    for (std::size_t i = 0; i < want->size(); ++i) REQUIRE(std::uint32_t(tf[i]) == (*want)[i]);
    // The fingerprint is the content's, whatever the storage width.
    data::DataFingerprint f;
    f.vocab = 128256;
    for (auto id : *want) f.add(id);
    CHECK(tf.fingerprint() == f);
  }
  // The same ids in two formats: equal fingerprints; other ids: different.
  CHECK(data::TokenFile(files[0].first.string(), 128256, 8).fingerprint() ==
        data::TokenFile(files[2].first.string(), 128256, 8).fingerprint());
  CHECK_FALSE(data::TokenFile(files[0].first.string(), 128256, 8).fingerprint() ==
              data::TokenFile(files[1].first.string(), 128256, 8).fingerprint());
}

TEST_CASE("token files: each damaged file is refused naming the file and the byte offset", "[data]") {
  const auto ids = some_ids(100, 1000);
  auto refuse = [](const fs::path& p, std::size_t vocab, const std::string& what, const std::string& offset) {
    INFO(p.string());
    CHECK_THROWS_WITH(data::TokenFile(p.string(), vocab, 8),
                      Catch::Contains(p.string()) && Catch::Contains(what) && Catch::Contains(offset));
  };
  refuse(write("bad_magic.bin", llmc_bytes(ids, 20240521)), 1000, "bad magic 20240521", "byte offset 0");
  refuse(write("bad_version.bin", llmc_bytes(ids, 20240520, 7)), 1000, "unsupported version 7", "byte offset 4");
  {
    auto b = llmc_bytes(ids);
    b.resize(b.size() - 3);  // the last token and a half are missing
    refuse(write("short.bin", b), 1000, "is short", "ends at byte offset " + std::to_string(b.size()));
  }
  {
    auto b = llmc_bytes(ids);
    b.resize(600);  // ends inside the header
    refuse(write("short_header.bin", b), 1000, "is short", "byte offset 600");
  }
  refuse(write("count_too_big.bin", llmc_bytes(ids, 20240520, 1, 150)), 1000, "promises 150 tokens",
         "byte offset " + std::to_string(1024 + 200));
  {
    auto b = llmc_bytes(ids);
    b.push_back(0);
    refuse(write("trailing.bin", b), 1000, "unexpected bytes", "byte offset " + std::to_string(1024 + 200));
  }
  {
    auto bad = ids;
    bad[37] = 1000;  // == vocab
    refuse(write("big_id.bin", llmc_bytes(bad)), 1000, "token 1000", "byte offset " + std::to_string(1024 + 2 * 37));
    refuse(write("big_id.npy", npy_bytes(bad, "<u2", 2)), 1000, "token 1000", "token index 37");
  }
  refuse(write("float.npy", npy_bytes(ids, "<f4", 4)), 1000, "dtype '<f4'", "byte offset 10");
  refuse(write("big_endian.npy", npy_bytes(ids, ">u2", 2)), 1000, "dtype '>u2'", "byte offset 10");
  refuse(write("two_dim.npy", npy_bytes(ids, "<u2", 2, "(10, 10)")), 1000, "shape (10, 10)", "byte offset 10");
  refuse(write("huge_shape.npy", npy_bytes(ids, "<u2", 2, "(123456789012345678901,)")), 1000, "a length of 21 digits",
         "the header is damaged");
  {
    auto b = npy_bytes(ids, "<u2", 2);
    b.resize(b.size() - 1);
    refuse(write("short.npy", b), 1000, "is short", "ends at byte offset " + std::to_string(b.size()));
  }
  {
    auto b = npy_bytes(ids, "<u2", 2);
    b.resize(40);  // inside the header dictionary
    refuse(write("short_header.npy", b), 1000, "is short", "byte offset 40");
  }
  CHECK_THROWS_WITH(data::TokenFile(token_file_scratch("missing.bin").string(), 1000, 8),
                    Catch::Contains("missing.bin") && Catch::Contains("cannot open"));
  // Too few tokens for the sequence length.
  CHECK_THROWS_WITH(data::TokenFile(write("tiny.bin", llmc_bytes({1, 2, 3})).string(), 1000, 8),
                    Catch::Contains("tiny.bin") && Catch::Contains("too few for sequences of 8"));
}

TEST_CASE("sampler: batches are a pure function of (seed, step); data ranks split the global batch", "[data]") {
  const auto ids = some_ids(3000, 500);
  const data::TokenFile tf(write("sampler.bin", llmc_bytes(ids)).string(), 500, 16);
  const data::TokenVector tv(std::vector<std::int32_t>(ids.begin(), ids.end()), 500, 16);
  for (std::uint64_t step : {0ull, 1ull, 17ull}) {
    const auto whole = tf.batch(99, step, 12);
    REQUIRE(whole.batch == 12);
    // Independent reference: each sample is a window of the stream at the documented start.
    for (std::size_t s = 0; s < 12; ++s) {
      const std::size_t start = std::size_t(CounterRng{99, step}.bits(s) % (3000 - 16));
      for (std::size_t t = 0; t < 16; ++t) {
        REQUIRE(whole.tokens[s * 16 + t] == std::int32_t(ids[start + t]));
        REQUIRE(whole.targets[s * 16 + t] == std::int32_t(ids[start + t + 1]));
      }
    }
    CHECK(tv.batch(99, step, 12).tokens == whole.tokens);
    // Every data-parallel split concatenates to the same global batch.
    for (std::size_t dp : {2u, 3u, 4u}) {
      std::vector<std::int32_t> joined, joined_t;
      for (std::size_t r = 0; r < dp; ++r) {
        const auto part = data::SourceRef(tf).batch(99, step, 12, dp, r);
        joined.insert(joined.end(), part.tokens.begin(), part.tokens.end());
        joined_t.insert(joined_t.end(), part.targets.begin(), part.targets.end());
      }
      CHECK(joined == whole.tokens);
      CHECK(joined_t == whole.targets);
    }
  }
  CHECK(tf.batch(99, 0, 4).tokens != tf.batch(99, 1, 4).tokens);
  CHECK(tf.batch(99, 0, 4).tokens != tf.batch(98, 0, 4).tokens);
}

TEST_CASE("token sources: every model satisfies the concept; a reference forwards to it", "[data]") {
  STATIC_REQUIRE(data::token_source<data::CharDataset>);
  STATIC_REQUIRE(data::token_source<data::TokenFile>);
  STATIC_REQUIRE(data::token_source<data::TokenVector>);
  STATIC_REQUIRE(data::token_source<data::SourceRef>);
  const data::CharDataset cd(data::default_text_path, 16);
  const data::SourceRef ref(cd);
  CHECK(ref.vocab_size() == cd.vocab_size());
  CHECK(ref.batch(5, 3, 6, 2, 1).tokens == cd.batch(5, 3, 6, 2, 1).tokens);
  CHECK(ref.fingerprint() == cd.fingerprint());
  CHECK(cd.fingerprint().vocab == cd.vocab_size());
  CHECK_THAT(ref.describe(), Catch::Contains(data::default_text_path));
  CHECK_THROWS_WITH(data::TokenVector({1, 2, 5, 3}, 5, 1, "my ids"),
                    Catch::Contains("my ids") && Catch::Contains("token 5 at index 2"));
}

TEST_CASE("token ranges: a held-out split samples only inside its part", "[data]") {
  const auto ids = some_ids(2000, 300);
  const data::TokenFile tf(write("split.bin", llmc_bytes(ids)).string(), 300, 16);
  STATIC_REQUIRE(data::token_source<data::TokenRange<data::TokenFile>>);
  const auto [train, val] = data::split_tail(tf, 0.1, 16);
  REQUIRE(train.size() == 1800);
  REQUIRE(val.size() == 200);
  // Independent reference: the split's batches are windows of the sub-stream at the documented starts.
  for (std::uint64_t step : {0ull, 5ull}) {
    const auto b = val.batch(3, step, 8);
    for (std::size_t s = 0; s < 8; ++s) {
      const std::size_t start = 1800 + std::size_t(CounterRng{3, step}.bits(s) % (200 - 16));
      for (std::size_t t = 0; t < 16; ++t) {
        REQUIRE(b.tokens[s * 16 + t] == std::int32_t(ids[start + t]));
        REQUIRE(b.targets[s * 16 + t] == std::int32_t(ids[start + t + 1]));
      }
    }
    const auto a = train.batch(3, step, 8);
    for (std::size_t s = 0; s < 8; ++s) {
      const std::size_t start = std::size_t(CounterRng{3, step}.bits(s) % (1800 - 16));
      REQUIRE(a.tokens[s * 16] == std::int32_t(ids[start]));
      REQUIRE(a.targets[s * 16 + 15] == std::int32_t(ids[start + 16]));  // the last target stays inside [0, 1800)
    }
  }
  // Content fingerprints: the range equals the same ids held in memory.
  const data::TokenVector tail(std::vector<std::int32_t>(ids.begin() + 1800, ids.end()), 300, 16);
  CHECK(val.fingerprint() == tail.fingerprint());
  CHECK_THROWS_WITH(data::split_tail(tf, 1.0, 16), Catch::Contains("between 0 and 1"));
  CHECK_THROWS_WITH(data::split_tail(tf, 0.005, 16),
                    Catch::Contains("split.bin") && Catch::Contains("too few for sequences of 16"));
}
