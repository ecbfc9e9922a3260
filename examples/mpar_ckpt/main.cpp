// mpar-ckpt: inspect, verify and convert mpar checkpoints offline (see docs/checkpoints.md).
//
//   mpar-ckpt info DIR                          contents, layout and training state
//   mpar-ckpt verify DIR                        read every shard and check every checksum
//   mpar-ckpt convert DIR OUT --tp N [--pp N] [--dp N] [--cp N]
//   mpar-ckpt convert DIR OUT --single          one shard per tensor
//
// Conversion is generic: a tensor recorded as Shard<d, tensor> is split along d over the new tensor
// size, anything else is written whole. Pipeline and data sizes change which rank holds a tensor, not
// how it is cut, so they are recorded in the manifest only. One output shard is in memory at a time.
#include <charconv>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "mpar/io.hpp"
#include "mpar/tools.hpp"

namespace fs = std::filesystem;
using namespace mpar;

namespace {

/** The dimension a layout name shards over the tensor axis: "Shard<1, tensor>" -> 1; nullopt otherwise. */
std::optional<std::size_t> tensor_sharded_dim(std::string layout) {
  const std::string flat = " (flat)";  // ZeRO-1 states keep their parameter's layout
  if (layout.size() > flat.size() && layout.ends_with(flat)) layout.resize(layout.size() - flat.size());
  const std::string head = "Shard<", tail = ", tensor>";
  if (!layout.starts_with(head) || !layout.ends_with(tail) || layout.size() <= head.size() + tail.size())
    return std::nullopt;
  const std::string digits = layout.substr(head.size(), layout.size() - head.size() - tail.size());
  std::size_t d = 0;
  auto [p, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), d);
  if (ec != std::errc{} || p != digits.data() + digits.size()) return std::nullopt;
  return d;
}

int cmd_info(int argc, const char* const* argv) {
  std::string dir;
  bool shards = false;
  cli::Parser p("mpar-ckpt info", "Prints a checkpoint's training state, mesh and tensors.");
  p.positional("DIR", dir, "checkpoint directory, or a directory with a `latest` file");
  p.flag("shards", shards, "also list every shard (box, file, offset, checksum)");
  if (!p.parse(argc, argv)) return std::cout << p.help(), 0;
  const fs::path path = io::resolve_checkpoint(dir);
  const io::Manifest m = io::read_manifest(path);
  std::cout << "checkpoint " << path.string() << "\n";
  std::cout << "step " << m.state.step << ", data position " << m.state.data_position << "\n";
  std::cout << "saved with mesh tp=" << m.mesh.tp << " pp=" << m.mesh.pp << " dp=" << m.mesh.dp << " cp=" << m.mesh.cp
            << "\n";
  std::cout << "rng state:";
  for (auto w : m.state.rng) std::cout << ' ' << w;
  std::cout << "\n";
  if (m.state.loss_scale)
    std::cout << "loss scale " << m.state.loss_scale->scale << " (good steps in a row "
              << m.state.loss_scale->good_steps << ", skipped " << m.state.loss_scale->skipped << ")\n";
  for (const auto& [k, v] : m.state.user) std::cout << "user " << k << " = " << v << "\n";
  std::size_t elems = 0;
  std::map<std::string, std::size_t> files;
  for (const auto& t : m.tensors) {
    elems += io::volume(t.shape);
    std::cout << "tensor " << t.name << " " << t.dtype << io::shape_string(t.shape) << " layout " << t.layout << ", "
              << t.shards.size() << " shard(s)\n";
    for (const auto& s : t.shards) {
      files[s.file] += s.bytes;
      if (shards)
        std::cout << "  shard " << io::box_string(s.box) << " in " << s.file << " at " << s.offset << ", " << s.bytes
                  << " bytes, crc32 " << io::detail::hex32(s.crc32) << "\n";
    }
  }
  std::cout << m.tensors.size() << " tensors, " << elems << " elements, " << files.size() << " data file(s)\n";
  return 0;
}

int cmd_verify(int argc, const char* const* argv) {
  std::string dir;
  cli::Parser p("mpar-ckpt verify", "Reads every shard of a checkpoint and checks every checksum.");
  p.positional("DIR", dir, "checkpoint directory, or a directory with a `latest` file");
  if (!p.parse(argc, argv)) return std::cout << p.help(), 0;
  io::CheckpointReader reader(dir, io::LoadOptions{.verify_whole_shards = true});
  for (const auto& t : reader.manifest().tensors)
    for (const auto& s : t.shards) {  // one shard at a time keeps memory at one shard
      std::vector<float> buf(io::volume(s.box));
      const io::LoadBlock b{t.name, t.shape, s.box, t.layout, buf};
      reader.read(std::span<const io::LoadBlock>(&b, 1));
    }
  std::cout << "ok: " << reader.path().string() << ", " << reader.stats().bytes_read << " bytes verified\n";
  return 0;
}

int cmd_convert(int argc, const char* const* argv) {
  std::string dir, out;
  std::size_t tp = 1, pp = 1, dp = 1, cp = 1;
  bool single = false;
  cli::Parser p("mpar-ckpt convert",
                "Writes a checkpoint with another layout. Shard<d, tensor> tensors are split along d over --tp;\n"
                "others are written whole. --pp, --dp and --cp are recorded (they do not change how tensors are cut).");
  p.positional("DIR", dir, "checkpoint to read (directory, or one with a `latest` file)");
  p.positional("OUT", out, "directory to write the converted checkpoint into (its `latest` is updated)");
  p.option("tp", tp, "tensor-parallel size of the output").range(1, 65536);
  p.option("pp", pp, "pipeline-parallel size of the output").range(1, 65536);
  p.option("dp", dp, "data-parallel size of the output").range(1, 65536);
  p.option("cp", cp, "context-parallel size of the output").range(1, 65536);
  p.flag("single", single, "one shard per tensor, in one file");
  if (!p.parse(argc, argv)) return std::cout << p.help(), 0;
  const bool layout_given = p.given("tp") || p.given("pp") || p.given("dp") || p.given("cp");
  if (single && layout_given)
    throw cli::usage_error(
        "mpar-ckpt convert: --single writes one shard per tensor; drop --tp/--pp/--dp/--cp or --single");
  if (!single && !layout_given)
    throw cli::usage_error(
        "mpar-ckpt convert: give a target layout with --tp N [--pp N] [--dp N] [--cp N], or --single");
  if (single) tp = pp = dp = cp = 1;

  io::CheckpointReader reader(dir);
  const io::Manifest& in = reader.manifest();
  io::Manifest outm;
  outm.mesh = {tp, pp, dp, cp};
  outm.state = in.state;
  io::SaveOptions opts;
  opts.mesh = outm.mesh;
  const fs::path root = out, staging = root / (".partial-" + io::step_dir_name(in.state.step));
  fs::create_directories(root);
  io::detail::remove_all_path(staging, nullptr);
  fs::create_directory(staging);
  std::map<std::size_t, io::ShardFileWriter> writers;  // by tensor rank
  auto writer = [&](std::size_t t) -> io::ShardFileWriter& {
    auto it = writers.find(t);
    if (it == writers.end()) it = writers.try_emplace(t, staging, io::rank_file_name(int(t), "bin"), opts).first;
    return it->second;
  };
  for (const auto& t : in.tensors) {
    io::TensorRecord rec{t.name, t.dtype, t.shape, t.layout, {}};
    const auto rule = single ? std::nullopt : tensor_sharded_dim(t.layout);
    const std::size_t dim = rule.value_or(0);
    const std::size_t parts = rule.has_value() && dim < t.shape.size() ? tp : 1;
    for (std::size_t r = 0; r < parts; ++r) {
      io::BoxN box = io::full_box(t.shape);
      if (parts > 1) box[dim] = block_of(t.shape[dim], parts, r);
      if (io::volume(box) == 0) continue;  // more tensor ranks than rows: this rank holds nothing
      std::vector<float> buf(io::volume(box));
      const io::LoadBlock b{t.name, t.shape, box, t.layout, buf};
      reader.read(std::span<const io::LoadBlock>(&b, 1));
      rec.shards.push_back(writer(r).append(box, buf));
    }
    outm.tensors.push_back(std::move(rec));
  }
  for (auto& [t, w] : writers) w.finish();
  (void)io::parse_manifest(io::format_manifest(outm), (staging / io::manifest_file_name).string());
  const fs::path done = io::publish_checkpoint(root, staging, outm, opts);
  std::cout << "wrote " << done.string() << " (" << outm.tensors.size() << " tensors, tp=" << tp << " pp=" << pp
            << " dp=" << dp << " cp=" << cp << ", " << writers.size() << " data file(s))\n";
  return 0;
}

const char* const usage =
    "usage: mpar-ckpt COMMAND ...\n\n"
    "commands:\n"
    "  info DIR [--shards]                    training state, mesh, tensors and layouts\n"
    "  verify DIR                             read every shard and check every checksum\n"
    "  convert DIR OUT --tp N [--pp N] [--dp N] [--cp N]\n"
    "                                         write the checkpoint in another layout\n"
    "  convert DIR OUT --single               write one shard per tensor\n\n"
    "Run `mpar-ckpt COMMAND --help` for a command's options.\n";

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || std::string_view(argv[1]) == "--help" || std::string_view(argv[1]) == "-h") {
    std::cout << usage;
    return argc < 2 ? 2 : 0;
  }
  const std::string_view cmd = argv[1];
  try {
    if (cmd == "info") return cmd_info(argc - 1, argv + 1);
    if (cmd == "verify") return cmd_verify(argc - 1, argv + 1);
    if (cmd == "convert") return cmd_convert(argc - 1, argv + 1);
    std::cerr << "mpar-ckpt: unknown command '" << cmd << "'\n\n" << usage;
    return 2;
  } catch (const cli::usage_error& e) {
    std::cerr << e.what() << "\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "mpar-ckpt " << cmd << ": " << e.what() << "\n";
    return 1;
  }
}
