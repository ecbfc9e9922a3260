#pragma once
/**
 * @file `StagedBlocks<B>`: checkpoint blocks that point into rank memory, moved through host memory by the
 * stream-ordered copies, so that `save_checkpoint` / `load_checkpoint` (which read and write `data` on the
 * host) never dereference rank memory.
 *
 * On a stream-ordered backend the host may read rank memory only after a wait, through the asynchronous
 * copies (`stream_ordered`, backend/stream_ordered.hpp); on a device the spans are device pointers. Saving:
 * every block's copy into one pinned buffer is issued on the rank's stream, after the work that produced the
 * values, then one event wait, and the blocks are pointed at their copies. Resuming: the blocks are pointed
 * at the pinned buffer for the reader to fill, then every block's upload is issued and one event wait lets
 * the buffer go. One host synchronisation per save and per resume, whatever the number of blocks.
 *
 * `GptTrainer::load_weights` stages the same way: its parameters are redirected, the weight source's tensors copied
 * into the staging on the host, and the parameters the source gave uploaded with one wait.
 *
 * Where `mpar::host_reads_rank_memory<B>` (HostBackend: rank memory is host memory and every operation has
 * finished when it returns) the blocks stay as they are: zero-copy, no synchronisation.
 */
#include <cstddef>
#include <optional>
#include <span>
#include <vector>

#include "mpar/backend/backend.hpp"
#include "mpar/backend/rank_transfer.hpp"
#include "mpar/io/checkpoint/block_view.hpp"

namespace mpar::io {

/**
 * @brief Host staging for the checkpoint blocks of one rank over backend `B` (see the file comment). Lives
 * on the rank's thread, after `B::init_rank()`, and must outlive the save or load that reads the blocks.
 */
template <backend B>
class StagedBlocks {
 public:
  /** Whether the blocks are staged at all (false where the host reads rank memory directly). */
  static constexpr bool staged = !mpar::host_reads_rank_memory<B>;

  /**
   * Saving: copies every block's rank memory to host staging on the rank's stream, waits once, and points
   * `blocks` at the copies.
   */
  void download(std::vector<SaveBlock>& blocks) {
    if constexpr (staged) {
      float* host = allocate(blocks);
      for (auto& b : blocks) {
        if (b.data.empty()) continue;
        B::template copy_to_host_async<float>(b.data.size(), b.data.data(), host);
        b.data = std::span<const float>(host, b.data.size());
        host += b.data.size();
      }
      mpar::wait_for_rank_stream<B>();
    }
  }

  /**
   * Loading: points `blocks` at host staging for the reader to fill; `upload()` then writes the staging into
   * the rank memory the blocks named here. Every block must be filled whole (`load_checkpoint` does), or left
   * out of the upload (`upload(filled)`).
   */
  void redirect(std::vector<LoadBlock>& blocks) {
    if constexpr (staged) {
      float* host = allocate(blocks);
      rank_.clear();
      for (std::size_t i = 0; i < blocks.size(); ++i) {
        auto& b = blocks[i];
        if (b.data.empty()) continue;
        rank_.push_back(Upload{b.data, host, i});
        b.data = std::span<float>(host, b.data.size());
        host += b.data.size();
      }
    }
  }
  /** Loading: the filled staging into rank memory, on the rank's stream; one wait, after which it may go. */
  void upload() {
    upload_where([](std::size_t) { return true; });
  }
  /**
   * Loading some blocks only (a weight source that has not every tensor): block `i` of `redirect`'s vector goes
   * to rank memory where `filled[i]`; the others keep their values. One wait, as `upload()`.
   */
  void upload(const std::vector<bool>& filled) {
    upload_where([&](std::size_t i) { return i < filled.size() && filled[i]; });
  }

 private:
  /** One pinned buffer for all of `blocks` (the copies are issued together and waited for once). */
  template <class T>
  float* allocate(const std::vector<BlockView<T>>& blocks) {
    std::size_t total = 0;
    for (const auto& b : blocks) total += b.data.size();
    buffer_.emplace(total);
    return buffer_->data();
  }
  template <class Filled>
  void upload_where(Filled filled) {
    if constexpr (staged) {
      for (const Upload& u : rank_)
        if (filled(u.block)) B::template copy_from_host_async<float>(u.rank.size(), u.host, u.rank.data());
      mpar::wait_for_rank_stream<B>();
      rank_.clear();
    }
  }
  struct Upload {
    std::span<float> rank;  ///< where the block lives on the rank
    const float* host;      ///< its staged values
    std::size_t block;      ///< its index in `redirect`'s vector
  };
  std::optional<typename B::template pinned_buffer<float>> buffer_;
  std::vector<Upload> rank_;
};

}  // namespace mpar::io
