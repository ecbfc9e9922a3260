// libFuzzer target: the checkpoint reader (manifest parser and shard reads) on arbitrary input.
//
// Input layout: byte 0 selects the mode; the rest is a manifest body, optionally followed by
// "\n--data--\n" and the content of the data file rank-00000.bin. Mode bit 0 set: the correct
// `end crc32=` line is appended to the body, so mutations get past the checksum into the parser
// and the reads; clear: the body is parsed as is (checksum handling itself is fuzzed).
// Anything the reader rejects must be a checkpoint_error; anything it accepts must round-trip.
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>
#include <vector>

#include "mpar/io.hpp"

namespace fs = std::filesystem;
using namespace mpar;

namespace {
const fs::path& work_dir() {
  static const fs::path dir = [] {
    fs::path d = fs::temp_directory_path() / ("mpar_fuzz_checkpoint_" + std::to_string(::getpid()));
    fs::create_directories(d);
    return d;
  }();
  return dir;
}

void write_file(const fs::path& p, std::string_view s) {
  std::ofstream f(p, std::ios::binary | std::ios::trunc);
  f.write(s.data(), std::streamsize(s.size()));
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  const bool fix_checksum = (data[0] & 1) != 0;
  std::string_view rest(reinterpret_cast<const char*>(data + 1), size - 1);
  std::string_view body = rest, shard;
  const std::string_view sep = "\n--data--\n";
  if (auto p = rest.find(sep); p != std::string_view::npos) {
    body = rest.substr(0, p + 1);
    shard = rest.substr(p + sep.size());
  }
  std::string manifest(body);
  if (fix_checksum) manifest += "end crc32=" + io::detail::hex32(io::crc32(manifest)) + "\n";

  io::Manifest m;
  try {
    m = io::parse_manifest(manifest, "fuzz-manifest");
  } catch (const io::checkpoint_error&) {
    return 0;
  }
  // Accepted: formatting and parsing again must give the same text.
  const std::string again = io::format_manifest(m);
  if (io::format_manifest(io::parse_manifest(again, "fuzz-again")) != again) std::abort();

  // Read every (small) tensor whole through the real reader; damage must surface as checkpoint_error.
  const fs::path dir = work_dir();
  write_file(dir / "manifest.txt", manifest);
  write_file(dir / "rank-00000.bin", shard);
  try {
    io::CheckpointReader reader(dir);
    for (const auto& t : reader.manifest().tensors) {
      const std::size_t n = io::volume(t.shape);
      if (n > (std::size_t(1) << 16)) continue;
      std::vector<float> buf(n);
      const io::LoadBlock b{t.name, t.shape, io::full_box(t.shape), t.layout, buf};
      reader.read(std::span<const io::LoadBlock>(&b, 1));
    }
  } catch (const io::checkpoint_error&) {}
  return 0;
}
