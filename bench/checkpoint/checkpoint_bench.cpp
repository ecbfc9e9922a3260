// Checkpoint save and load throughput against raw durable file I/O of the same bytes.
//
// Two thread ranks hold a column-sharded model (tp = 2). "ours" = io::save_checkpoint / io::load_checkpoint
// (CRC-32 of every chunk and shard, replica fingerprints, manifest, staging directory, fsyncs, renames,
// `latest`). "baseline" = each rank writes its blocks to one file with write + fsync + rename, and reads
// them back with pread: the least any durable checkpoint must do. ratio = baseline time / our time.
#include <fcntl.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "bench_util.hpp"
#include "mpar/comm/threads.hpp"
#include "mpar/io.hpp"
#include "mpar/tools.hpp"

using namespace mpar;
namespace fs = std::filesystem;

namespace {

struct RankModel {
  std::vector<std::vector<float>> data;
  std::vector<io::BoxN> boxes;
  std::vector<std::vector<std::size_t>> shapes;
};

RankModel make_rank(int rank, std::size_t tensors, std::size_t rows, std::size_t cols) {
  RankModel m;
  for (std::size_t t = 0; t < tensors; ++t) {
    const Block b = block_of(cols, 2, std::size_t(rank));
    m.shapes.push_back({rows, cols});
    m.boxes.push_back({{0, rows}, b});
    std::vector<float> v(rows * b.extent);
    for (std::size_t i = 0; i < v.size(); ++i) v[i] = float((i * 2654435761u + t) % 1000) * 1e-3f;
    m.data.push_back(std::move(v));
  }
  return m;
}

void write_all(int fd, const void* p, std::size_t n) {
  const char* c = static_cast<const char*>(p);
  while (n > 0) {
    const ssize_t w = ::write(fd, c, n);
    if (w <= 0) throw std::runtime_error("baseline write failed");
    c += w;
    n -= std::size_t(w);
  }
}

}  // namespace

int main(int argc, char** argv) {
  std::size_t mb = 64;
  int reps = 5;
  bool smoke = false;
  std::string dir = (fs::temp_directory_path() / "mpar_bench_checkpoint").string();
  cli::Parser p("bench_checkpoint", "Checkpoint save/load throughput vs raw durable file I/O.");
  p.option("mb", mb, "model size in MiB (fp32)").range(1, 65536);
  p.option("reps", reps, "timed repetitions of each side (medians reported)").range(1, 1000);
  p.option("dir", dir, "scratch directory (removed afterwards)");
  p.flag("smoke", smoke, "a tiny, fast run");
  try {
    if (!p.parse(argc, argv)) return std::printf("%s", p.help().c_str()), 0;
  } catch (const cli::usage_error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 2;
  }
  if (smoke) mb = 2, reps = 2;
  const std::size_t tensors = 16, rows = 1024;
  const std::size_t cols = std::max<std::size_t>(2, mb * (std::size_t(1) << 20) / 4 / tensors / rows);
  const double bytes = double(tensors * rows * cols * 4);
  const fs::path root = fs::path(dir) / "ours", raw = fs::path(dir) / "raw";
  fs::remove_all(dir);
  fs::create_directories(raw);

  std::vector<double> save_ours, save_base, load_ours, load_base;
  auto run = [&](auto&& body) {
    run_threads(2, [&](ThreadsCommunicator& comm) { body(comm, make_rank(comm.rank(), tensors, rows, cols)); });
  };
  for (int r = -1; r < reps; ++r) {  // r = -1 warms up
    run([&](ThreadsCommunicator& comm, RankModel m) {
      std::vector<io::SaveBlock> blocks;
      for (std::size_t t = 0; t < tensors; ++t)
        blocks.push_back({"w" + std::to_string(t), m.shapes[t], m.boxes[t], "Shard<1, tensor>", m.data[t]});
      std::vector<io::LoadBlock> lblocks;
      for (std::size_t t = 0; t < tensors; ++t)
        lblocks.push_back({"w" + std::to_string(t), m.shapes[t], m.boxes[t], "Shard<1, tensor>", m.data[t]});
      io::SaveOptions opts;
      opts.keep_last = 1;
      io::TrainingState st;
      st.step = std::uint64_t(r + 2);  // one checkpoint per repetition
      comm.barrier();
      const double ts0 = bench::time_once([&] {
        io::save_checkpoint(root, blocks, st, comm, opts);
        comm.barrier();
      });
      const fs::path f = raw / ("rank" + std::to_string(comm.rank()) + ".bin");
      comm.barrier();
      const double tb0 = bench::time_once([&] {
        const fs::path tmp = f.string() + ".tmp";
        const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
        for (const auto& d : m.data) write_all(fd, d.data(), d.size() * 4);
        ::fsync(fd);
        ::close(fd);
        fs::rename(tmp, f);
        comm.barrier();
      });
      comm.barrier();
      const double tl = bench::time_once([&] {
        io::load_checkpoint(root, lblocks, comm);
        comm.barrier();
      });
      comm.barrier();
      const double tlb = bench::time_once([&] {
        const int fd = ::open(f.c_str(), O_RDONLY);
        std::size_t off = 0;
        for (auto& d : m.data) {
          if (::pread(fd, d.data(), d.size() * 4, off_t(off)) != ssize_t(d.size() * 4))
            throw std::runtime_error("pread");
          off += d.size() * 4;
        }
        ::close(fd);
        comm.barrier();
      });
      if (comm.rank() == 0 && r >= 0) {
        save_ours.push_back(ts0);
        save_base.push_back(tb0);
        load_ours.push_back(tl);
        load_base.push_back(tlb);
      }
    });
  }
  fs::remove_all(dir);
  const double mib = bytes / double(1 << 20);
  const double so = mib / bench::median(save_ours), sb = mib / bench::median(save_base);
  const double lo = mib / bench::median(load_ours), lb = mib / bench::median(load_base);
  std::printf("model %.1f MiB in %zu tensors, tp = 2 thread ranks, %d repetitions (medians)\n", mib, tensors, reps);
  std::printf("save: mpar %.1f MiB/s, raw write+fsync+rename %.1f MiB/s\n", so, sb);
  std::printf("load: mpar %.1f MiB/s, raw pread %.1f MiB/s\n", lo, lb);
  char extra[256];
  std::snprintf(extra, sizeof extra,
                "\"load_ours\": %.6g, \"load_baseline\": %.6g, \"load_ratio\": %.4f, \"mib\": %.1f, "
                "\"baseline_name\": \"raw write+fsync+rename / pread\"",
                lo, lb, lo / lb, mib);
  bench::print_result_json("checkpoint_save", so, sb, "MiB/s", true, extra);
  return 0;
}
