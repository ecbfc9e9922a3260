// mpar-plan: picks parallel sizes, micro-batching, schedule and recomputation for a GPT-style model.
// Example (Megatron-LM's 145.6 B row on 1536 A100s), all on one line:
//   mpar-plan --layers 80 --hidden 12288 --heads 96 --seq 2048 --vocab 51200 --global-batch 2304
//             --gpus 1536 --gpus-per-node 8 --gpu-mem-gib 80 --peak-tflops 312
//             --intra-node-gbps 300 --inter-node-gbps 200
#include <iostream>
#include <string>
#include <vector>

#include "mpar/plan.hpp"

int main(int argc, char** argv) {
  const std::vector<std::string> args(argv + 1, argv + argc);
  return mpar::plan::run_cli(args, std::cout, std::cerr);
}
