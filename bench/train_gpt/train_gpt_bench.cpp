// bench_train_gpt: training throughput of the GPT model for every (tp, pp, dp) layout of 1, 2 and 4
// thread ranks, against the single-rank run of the same model, batch and data.
//
// Layouts are measured in rounds (each round trains every layout for a few steps with a fresh
// trainer), so slow phases of a shared machine hit every layout alike; the first steps of every
// round warm caches and allocations up and are not counted. Reported per layout: the median step
// time over all counted steps, tokens/s from it, and the median bubble and communication shares
// that `GptTrainer::train_step` measures. Last line: ours = the best 2-rank layout's tokens/s,
// baseline = the single-rank tokens/s (ratio > 1: the 2-rank layout trains faster). `--precision bf16`
// trains with the GEMMs on bf16 operands (nn::Autocast), to compare with PyTorch's bf16 autocast;
// MPAR_HOST_BF16_GEMM=avx512_bf16 runs them on mpar's own kernel (included below, also in a oneDNN build).
#include <algorithm>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <iostream>
#include <mutex>
#include <sstream>
#include <string>
#include <vector>

#include <bench_util.hpp>
#include <mpar/backend/host/avx512_bf16_gemm.hpp>
#include <mpar/cli/parser.hpp>
#include <mpar/models/gpt_trainer.hpp>
#include <mpar/mpar.hpp>

using namespace mpar;

namespace {

struct Layout {
  std::size_t tp, pp, dp;
  [[nodiscard]] std::size_t ranks() const { return tp * pp * dp; }
  [[nodiscard]] std::string name() const {
    return "tp=" + std::to_string(tp) + " pp=" + std::to_string(pp) + " dp=" + std::to_string(dp);
  }
};

struct Samples {
  std::vector<double> wall, bubble, comm;
  std::vector<double> cpu;  ///< CPU seconds of the whole process (all ranks) per counted step, one per round
  double last_loss = 0;
};

double process_cpu_seconds() {
  timespec t{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return double(t.tv_sec) + 1e-9 * double(t.tv_nsec);
}

/**
 * Micro-batches per data rank and step for `l`: `requested`, or with 0 (the default) one without a pipeline
 * and 2·pp with one. Without a pipeline, micro-batches are only gradient accumulation: the same products in
 * smaller GEMMs, so one pass over the rank's whole batch is the fastest (it is also what the PyTorch baseline
 * runs); a pipeline needs several to fill its stages (1F1B's bubble is (pp − 1) / (m + pp − 1)).
 */
int microbatches_for(const Layout& l, int requested) {
  return requested > 0 ? requested : l.pp == 1 ? 1 : int(2 * l.pp);
}

/** One round of `layout`: a fresh trainer, `warm + counted` steps; appends the counted steps' measurements to `out`. */
void run_round(const models::GptTrainConfig& base, int microbatches, const data::CharDataset& ds, const Layout& l,
               std::size_t warm, std::size_t counted, Samples& out) {
  models::GptTrainConfig cfg = base;
  cfg.microbatches = microbatches_for(l, microbatches);
  cfg.tp = l.tp;
  cfg.pp = l.pp;
  cfg.dp = l.dp;
  if (l.dp == 1) cfg.zero = parallel::ZeroStage::none;  // ZeRO shards over the data axis: nothing to shard without one
  if (l.tp == 1) cfg.model.sequence_parallel = false;   // the same run: nothing to split tokens over
  // The interleaved schedule splits a pipeline rank's layers into chunks; without a pipeline there is nothing to
  // interleave, and those layouts run their one stage as 1F1B does.
  if (l.pp == 1 && cfg.schedule == pipeline::ScheduleKind::interleaved) {
    cfg.schedule = pipeline::ScheduleKind::one_f_one_b;
    cfg.chunks = 1;
  }
  cfg.steps = warm + counted;
  cfg.warmup = 0;
  std::mutex mu;
  run_threads(int(l.ranks()), [&](ThreadsCommunicator& world) {
    models::GptTrainer<ThreadsCommunicator> tr(world, cfg, ds);
    double cpu0 = 0;
    for (std::size_t s = 0; s < cfg.steps; ++s) {
      if (s == warm && world.rank() == 0) cpu0 = process_cpu_seconds();
      const models::StepReport r = tr.train_step();  // the same numbers on every rank
      if (world.rank() != 0 || s < warm) continue;
      if (s + 1 == cfg.steps) out.cpu.push_back((process_cpu_seconds() - cpu0) / double(counted));
      const std::lock_guard lock(mu);
      out.wall.push_back(r.wall);
      out.bubble.push_back(r.bubble);
      out.comm.push_back(r.communication);
      out.last_loss = r.loss;
    }
  });
}

}  // namespace

int main(int argc, char** argv) {
  try {
    models::GptTrainConfig cfg;
    cfg.model.hidden = 256;
    cfg.model.layers = 4;
    cfg.model.heads = 4;
    cfg.model.seq = 64;
    cfg.global_batch = 16;
    int microbatches = 0;  // per layout: microbatches_for
    cfg.schedule = pipeline::ScheduleKind::one_f_one_b;
    std::size_t rounds = 3, warm = 1, counted = 3, max_ranks = 4;
    bool smoke = false;
    std::string data = data::default_text_path;
    cli::Parser p("bench_train_gpt", "GPT training tokens/s for every (tp, pp, dp) layout of 1, 2 and 4 thread ranks.");
    p.option("hidden", cfg.model.hidden, "model width").range(1, 1 << 20);
    p.option("layers", cfg.model.layers, "transformer blocks").range(1, 4096);
    p.option("heads", cfg.model.heads, "attention heads").range(1, 4096);
    p.option("seq", cfg.model.seq, "sequence length").range(2, 1 << 20);
    p.option("batch", cfg.global_batch, "sequences per step (global)").range(1, 1 << 24);
    p.option("microbatches", microbatches,
             "micro-batches per step and data-parallel rank (0: 1 without a pipeline, 2 x pp with one)")
        .range(0, 1 << 16);
    p.choice("schedule", cfg.schedule,
             {{"gpipe", pipeline::ScheduleKind::gpipe},
              {"1f1b", pipeline::ScheduleKind::one_f_one_b},
              {"interleaved_1f1b", pipeline::ScheduleKind::interleaved},
              {"zb_h1", pipeline::ScheduleKind::zb_h1}},
             "pipeline schedule");
    p.option("chunks", cfg.chunks, "model chunks per pipeline rank (interleaved_1f1b; 1 for the others)").range(1, 64);
    p.option("rounds", rounds, "rounds over all layouts").range(1, 1000);
    p.option("warm", warm, "uncounted steps at the start of every round").range(0, 1000);
    p.option("steps", counted, "counted steps per layout and round").range(1, 1000);
    p.option("max-ranks", max_ranks, "largest world measured (1, 2 or 4)").range(1, 4);
    int zero = 0;
    p.option("zero", zero, "ZeRO stage of the layouts with dp > 1 (0: none)").range(0, 3);
    p.flag("sequence-parallel", cfg.model.sequence_parallel, "sequence parallelism in the layouts with tp > 1");
    p.choice("precision", cfg.precision, {{"fp32", parallel::Precision::fp32}, {"bf16", parallel::Precision::bf16}},
             "compute precision (bf16: the GEMMs on bf16 operands with fp32 accumulation, fp32 masters)");
    p.option("data", data, "training text");
    p.flag("smoke", smoke, "a tiny model and one short round (for ctest)");
    if (!p.parse(argc, argv)) {
      std::cout << p.help();
      return 0;
    }
    cfg.zero = parallel::zero_stage_from_number(zero);
    if (smoke) {
      cfg.model.hidden = 32;
      cfg.model.layers = 2;
      cfg.model.seq = 16;
      cfg.global_batch = 8;
      microbatches = 2;
      rounds = 1;
      warm = 1;
      counted = 1;
    }
    data::CharDataset ds(data, cfg.model.seq);
    cfg.model.vocab = ds.vocab_size();

    // Every layout with each axis of size 1 or 2: the 2-rank ones fit the 2-core machine; the 4-rank
    // ones oversubscribe it and are measured for reference.
    std::vector<Layout> layouts;
    for (const Layout& l : {Layout{1, 1, 1}, Layout{2, 1, 1}, Layout{1, 2, 1}, Layout{1, 1, 2}, Layout{2, 2, 1},
                            Layout{2, 1, 2}, Layout{1, 2, 2}})
      if (l.ranks() <= max_ranks) layouts.push_back(l);

    std::printf(
        "bench_train_gpt: %zu parameters (hidden %zu, %zu layers, %zu heads, seq %zu, vocab %zu), global batch %zu, "
        "micro-batches per data rank %s, schedule %s (%d chunks per pipeline rank), AdamW, precision %s%s\n",
        cfg.model.parameter_count(), cfg.model.hidden, cfg.model.layers, cfg.model.heads, cfg.model.seq,
        cfg.model.vocab, cfg.global_batch,
        microbatches > 0 ? std::to_string(microbatches).c_str() : "1 without a pipeline, 2 x pp with one",
        std::string(pipeline::schedule_name(cfg.schedule)).c_str(), cfg.chunks,
        std::string(parallel::name_of(cfg.precision)).c_str(),
        cfg.model.sequence_parallel ? ", sequence parallelism where tp > 1" : "");
    std::printf("%zu rounds x (%zu warm-up + %zu counted steps) per layout; load average at start %s\n", rounds, warm,
                counted, mpar::bench::load_average().c_str());
    std::fflush(stdout);

    std::vector<Samples> samples(layouts.size());
    for (std::size_t round = 0; round < rounds; ++round)
      for (std::size_t i = 0; i < layouts.size(); ++i)
        run_round(cfg, microbatches, ds, layouts[i], warm, counted, samples[i]);

    const double tokens = double(cfg.global_batch * cfg.model.seq);
    double single = 0, best2 = 0;
    std::string best2_name;
    std::ostringstream table;
    // CPU seconds per step (all ranks together; waiting ranks spin briefly, so this is an upper bound
    // of the work): unlike wall time it does not depend on how much of the machine other jobs take.
    std::printf(
        "\n| tp | pp | dp | ranks | micro-batches | median step (ms) | tokens/s | bubble | communication | vs 1 rank | "
        "CPU s/step | loss |\n"
        "|---|---|---|---|---|---|---|---|---|---|---|---|\n");
    std::vector<double> tps(layouts.size());
    for (std::size_t i = 0; i < layouts.size(); ++i) {
      tps[i] = tokens / bench::median(samples[i].wall);
      if (layouts[i].ranks() == 1) single = tps[i];
      if (layouts[i].ranks() == 2 && tps[i] > best2) {
        best2 = tps[i];
        best2_name = layouts[i].name();
      }
    }
    for (std::size_t i = 0; i < layouts.size(); ++i) {
      const Layout& l = layouts[i];
      const double b = bench::median(samples[i].bubble), c = bench::median(samples[i].comm);
      const double cpu = bench::median(samples[i].cpu);
      std::printf("| %zu | %zu | %zu | %zu | %d | %.1f | %.0f | %.1f%% | %.1f%% | %.2fx | %.3f | %.4f |\n", l.tp, l.pp,
                  l.dp, l.ranks(), microbatches_for(l, microbatches), bench::median(samples[i].wall) * 1e3, tps[i],
                  b * 100, c * 100, tps[i] / single, cpu, samples[i].last_loss);
      table << (i ? ", " : "") << "{\"tp\": " << l.tp << ", \"pp\": " << l.pp << ", \"dp\": " << l.dp
            << ", \"microbatches\": " << microbatches_for(l, microbatches) << ", \"tokens_per_second\": " << tps[i]
            << ", \"bubble\": " << b << ", \"communication\": " << c << ", \"cpu_seconds_per_step\": " << cpu << "}";
    }
    std::printf(
        "\nbest 2-rank layout: %s, %.0f tokens/s = %.2fx the single rank (%.0f tokens/s); load average at end %s\n",
        best2_name.c_str(), best2, best2 / single, single, mpar::bench::load_average().c_str());
    if (best2 == 0) {  // --max-ranks 1: nothing parallel to compare
      best2 = single;
      best2_name = "tp=1 pp=1 dp=1";
    }
    bench::print_result_json(
        "train_gpt", best2, single, "tokens/s", true,
        "\"best\": \"" + best2_name + "\", \"precision\": \"" + std::string(parallel::name_of(cfg.precision)) +
            "\", \"sequence_parallel\": " + (cfg.model.sequence_parallel ? "true" : "false") +
            ", \"loadavg\": " + mpar::bench::load_average() + ", \"layouts\": [" + table.str() + "]");
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_train_gpt: %s\n", e.what());
    return 2;
  }
}
