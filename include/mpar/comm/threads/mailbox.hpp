#pragma once
/**
 * @file A rank's mailbox for point-to-point messages: posted receives and eagerly copied sends.
 */
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace mpar::detail {

/** A receive waiting for its message (posted by irecv/recv before the matching send arrived). */
struct PostedRecv {
  void* dst = nullptr;
  std::size_t count = 0;
  std::uint8_t dtype = 0;
  int src = 0, tag = 0;
  std::uint64_t seq = 0;
  bool done = false;  // guarded by the mailbox mutex
  std::string error{};
};

/** A message sent before its receive was posted: the eager copy that makes sends never block. */
struct Message {
  int src = 0, tag = 0;
  std::uint8_t dtype = 0;
  std::size_t count = 0;
  std::vector<std::byte> data;
};

struct Mailbox {
  std::mutex m;
  std::condition_variable cv;
  std::deque<Message> unexpected;
  std::list<std::shared_ptr<PostedRecv>> posted;
};

}  // namespace mpar::detail
