#pragma once
/**
 * @file DirectoryLock: one job at a time saves into a checkpoint directory.
 *
 * Two jobs publishing into one directory would interleave their staging, renames and `latest`, and
 * publish a checkpoint mixing both. A job therefore holds an advisory lock (`flock`) on `DIR/.lock`
 * while it may save there; the file names the holder (process id, host, start time), so a second
 * job is refused with who holds it. The kernel drops the lock when the process ends, however it
 * ends, so a crash leaves no stale lock behind. Taking the lock also proves, before any work, that
 * the directory can be created and written.
 *
 * `save_checkpoint` takes the lock for the duration of a save unless this process already holds it
 * (a training program holds it for its whole run: see examples/train_gpt).
 */
#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <map>
#include <mutex>
#include <string>
#include <system_error>

#include "mpar/io/io_error.hpp"

namespace mpar::io {

namespace detail {
/** The directories this process holds a DirectoryLock on (canonical path -> holders). */
struct HeldLocks {
  std::mutex m;
  std::map<std::string, int> held;
};
inline HeldLocks& held_locks() {
  static HeldLocks h;
  return h;
}
inline std::string lock_key(const std::filesystem::path& dir) {
  std::error_code ec;
  const auto c = std::filesystem::weakly_canonical(dir, ec);
  return (ec ? dir : c).lexically_normal().string();
}
}  // namespace detail

/**
 * @brief An exclusive lock on a checkpoint directory for as long as the object lives. Creates the
 * directory; throws checkpoint_error if it cannot be created or written, or if another process
 * holds the lock ("in use by job pid 1234 on host h since ...").
 */
class DirectoryLock {
 public:
  explicit DirectoryLock(const std::filesystem::path& dir) : dir_(dir) {
    std::error_code ec;
    const auto st = std::filesystem::status(dir, ec);
    detail::check(st.type() == std::filesystem::file_type::not_found || std::filesystem::is_directory(st),
                  "checkpoint directory ", dir.string(), " is not a directory");
    std::filesystem::create_directories(dir, ec);
    detail::check(!ec, "cannot create checkpoint directory ", dir.string(), ": ", ec.message());
    const auto file = dir / ".lock";
    fd_ = ::open(file.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    detail::check(fd_ >= 0, "cannot write checkpoint directory ", dir.string(), ": creating ", file.string(),
                  " failed: ", std::strerror(errno));
    if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
      const int err = errno;
      std::string holder(256, '\0');
      const ssize_t n = ::pread(fd_, holder.data(), holder.size(), 0);
      holder.resize(n > 0 ? std::size_t(n) : 0);
      while (!holder.empty() && (holder.back() == '\n' || holder.back() == '\0')) holder.pop_back();
      ::close(fd_);
      fd_ = -1;
      detail::check(err != EWOULDBLOCK, "checkpoint directory ", dir.string(), " is in use by job ",
                    holder.empty() ? std::string("(unknown)") : holder,
                    "; two jobs saving into one directory would corrupt its checkpoints: give this job another --save "
                    "directory, or wait for that job to end");
      detail::check(false, "cannot lock checkpoint directory ", dir.string(), ": ", std::strerror(err));
    }
    char host[256] = "?";
    (void)::gethostname(host, sizeof host - 1);
    const std::time_t now = std::time(nullptr);
    char when[64] = "";
    std::strftime(when, sizeof when, "%Y-%m-%d %H:%M:%S UTC", std::gmtime(&now));
    const std::string me = "pid " + std::to_string(::getpid()) + " on host " + host + " since " + when + "\n";
    const bool written = ::ftruncate(fd_, 0) == 0 && ::pwrite(fd_, me.data(), me.size(), 0) == ssize_t(me.size());
    if (!written) {
      const int err = errno;
      ::close(fd_);
      fd_ = -1;
      detail::check(false, "cannot write checkpoint directory ", dir.string(), ": ", std::strerror(err));
    }
    std::lock_guard l(detail::held_locks().m);
    ++detail::held_locks().held[detail::lock_key(dir_)];
  }
  DirectoryLock(const DirectoryLock&) = delete;
  DirectoryLock& operator=(const DirectoryLock&) = delete;
  ~DirectoryLock() {
    if (fd_ < 0) return;
    {
      std::lock_guard l(detail::held_locks().m);
      auto it = detail::held_locks().held.find(detail::lock_key(dir_));
      if (it != detail::held_locks().held.end() && --it->second == 0) detail::held_locks().held.erase(it);
    }
    (void)!::ftruncate(fd_, 0);  // a free directory names no holder
    ::close(fd_);                // releases the lock; the file stays (removing it would race with the next holder)
  }

  /** Whether this process holds a DirectoryLock on `dir`. */
  [[nodiscard]] static bool held_here(const std::filesystem::path& dir) {
    std::lock_guard l(detail::held_locks().m);
    return detail::held_locks().held.contains(detail::lock_key(dir));
  }

 private:
  std::filesystem::path dir_;
  int fd_ = -1;
};

}  // namespace mpar::io
