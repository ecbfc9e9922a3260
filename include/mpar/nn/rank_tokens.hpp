#pragma once
/**
 * @file `nn::RankTokens`: token ids (or targets) that already lie in rank memory, for the layers that
 * otherwise take them as host values (the embedding's lookup, the loss's targets).
 *
 * Why: a step that is captured once and replayed (`graph_backend`) cannot take a micro-batch's ids as
 * host values — the upload through staging would be recorded with the capture's values and its staging
 * slot chosen by a host query. The trainer instead writes the whole step's ids and targets into fixed
 * rank buffers with one asynchronous copy, and hands the layers views of them. The layers do not check
 * such ids against the vocabulary (the host cannot read them): whoever wrote them checks them first.
 */
#include <cstddef>
#include <cstdint>

namespace mpar::nn {

/** @brief `size` ids at `data`, in rank memory, valid while the step that reads them may run (see the file comment). */
struct RankTokens {
  const std::int32_t* data = nullptr;
  std::size_t size = 0;
};

}  // namespace mpar::nn
