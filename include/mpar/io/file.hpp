#pragma once
/**
 * @file POSIX file primitives for checkpoints: durable writes (write, fsync, rename, fsync of the
 * directory), positioned reads, and a hook that observes (and, in tests, interrupts) every
 * operation that changes the disk.
 */
#include <fcntl.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <functional>
#include <span>
#include <string>
#include <utility>

#include "mpar/io/io_error.hpp"

namespace mpar::io {

/** @brief One disk-changing operation, reported to an `IoHook` just before it happens. */
struct IoEvent {
  enum class Kind { create, write, fsync, rename, remove } kind = Kind::write;
  std::string path;        ///< the file written, synced or removed; for rename the source
  std::size_t offset = 0;  ///< write: position of the chunk in its file
  std::size_t bytes = 0;   ///< write: size of the chunk
};

/**
 * @brief Observes every disk-changing operation of a save. A hook that throws simulates a crash at
 * that point: the operation does not happen, and the exception propagates out of the save.
 */
using IoHook = std::function<void(const IoEvent&)>;

namespace detail {

[[nodiscard]] inline std::string errno_text() { return std::strerror(errno); }

inline void notify(const IoHook& hook, IoEvent::Kind kind, const std::filesystem::path& p, std::size_t offset = 0,
                   std::size_t bytes = 0) {
  if (hook) hook(IoEvent{kind, p.string(), offset, bytes});
}

/** Owns a file descriptor. */
class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) : fd_(fd) {}
  Fd(Fd&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
  Fd& operator=(Fd&& o) noexcept {
    if (this != &o) {
      reset();
      fd_ = std::exchange(o.fd_, -1);
    }
    return *this;
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd() { reset(); }
  void reset() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }
  [[nodiscard]] int get() const { return fd_; }

 private:
  int fd_ = -1;
};

inline void fsync_path(const std::filesystem::path& p, const IoHook& hook) {
  notify(hook, IoEvent::Kind::fsync, p);
  Fd fd(::open(p.c_str(), O_RDONLY | O_CLOEXEC));
  check(fd.get() >= 0, "cannot open ", p.string(), " to flush it: ", errno_text());
  // Directories on some file systems reject fsync with EINVAL; their entries are then durable anyway.
  check(::fsync(fd.get()) == 0 || errno == EINVAL, "fsync of ", p.string(), " failed: ", errno_text());
}

inline void rename_path(const std::filesystem::path& from, const std::filesystem::path& to, const IoHook& hook) {
  notify(hook, IoEvent::Kind::rename, from, 0, 0);
  check(::rename(from.c_str(), to.c_str()) == 0, "cannot rename ", from.string(), " to ", to.string(), ": ",
        errno_text());
}

inline void remove_all_path(const std::filesystem::path& p, const IoHook& hook) {
  std::error_code ec;
  if (!std::filesystem::exists(p, ec)) return;
  notify(hook, IoEvent::Kind::remove, p);
  std::filesystem::remove_all(p, ec);
  check(!ec, "cannot remove ", p.string(), ": ", ec.message());
}

}  // namespace detail

/**
 * @brief A file being written: appended in chunks of at most `chunk_bytes` (each reported to the
 * hook), then `commit()` flushes it and renames it from `<path>.tmp` to `<path>`.
 */
class DurableFile {
 public:
  DurableFile(std::filesystem::path path, IoHook hook, std::size_t chunk_bytes = std::size_t(1) << 20)
      : path_(std::move(path)), tmp_(path_.string() + ".tmp"), hook_(std::move(hook)),
        chunk_(std::max<std::size_t>(chunk_bytes, 1)) {
    detail::notify(hook_, IoEvent::Kind::create, tmp_);
    fd_ = detail::Fd(::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
    detail::check(fd_.get() >= 0, "cannot create ", tmp_.string(), ": ", detail::errno_text());
  }

  void write(std::span<const std::byte> bytes) {
    while (!bytes.empty()) {
      const std::size_t n = std::min(chunk_, bytes.size());
      detail::notify(hook_, IoEvent::Kind::write, tmp_, size_, n);
      std::size_t done = 0;
      while (done < n) {
        const ssize_t w = ::write(fd_.get(), bytes.data() + done, n - done);
        if (w < 0 && errno == EINTR) continue;
        detail::check(w > 0, "write to ", tmp_.string(), " failed after ", size_ + done,
                      " bytes: ", detail::errno_text());
        done += std::size_t(w);
      }
      size_ += n;
      bytes = bytes.subspan(n);
    }
  }
  void write(std::string_view s) { write(std::as_bytes(std::span<const char>(s.data(), s.size()))); }

  /** Flushes the data to disk, closes the file and renames it into place. */
  void commit() {
    detail::notify(hook_, IoEvent::Kind::fsync, tmp_);
    detail::check(::fsync(fd_.get()) == 0, "fsync of ", tmp_.string(), " failed: ", detail::errno_text());
    fd_.reset();
    detail::rename_path(tmp_, path_, hook_);
  }

  [[nodiscard]] std::size_t size() const { return size_; }
  [[nodiscard]] const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_, tmp_;
  IoHook hook_;
  std::size_t chunk_;
  detail::Fd fd_;
  std::size_t size_ = 0;
};

/** @brief Writes `content` to `path` durably: temporary name, fsync, rename, fsync of the directory. */
inline void write_file_durably(const std::filesystem::path& path, std::string_view content, const IoHook& hook) {
  DurableFile f(path, hook);
  f.write(content);
  f.commit();
  detail::fsync_path(path.parent_path().empty() ? std::filesystem::path(".") : path.parent_path(), hook);
}

/** @brief A file opened for positioned reads; counts the bytes it reads. */
class ReadFile {
 public:
  explicit ReadFile(std::filesystem::path path) : path_(std::move(path)) {
    fd_ = detail::Fd(::open(path_.c_str(), O_RDONLY | O_CLOEXEC));
    detail::check(fd_.get() >= 0, "cannot open ", path_.string(), ": ", detail::errno_text());
    struct stat st {};
    detail::check(::fstat(fd_.get(), &st) == 0, "cannot stat ", path_.string(), ": ", detail::errno_text());
    size_ = std::size_t(st.st_size);
  }
  /** Reads exactly `out.size()` bytes at `offset`; a short file is reported as truncated. */
  void read_at(std::size_t offset, std::span<std::byte> out) {
    std::size_t done = 0;
    while (done < out.size()) {
      const ssize_t r = ::pread(fd_.get(), out.data() + done, out.size() - done, off_t(offset + done));
      if (r < 0 && errno == EINTR) continue;
      detail::check(r >= 0, "read of ", path_.string(), " failed: ", detail::errno_text());
      detail::check(r > 0, "file ", path_.string(), " is truncated: needed bytes up to ", offset + out.size(),
                    " but it ends at ", offset + done);
      done += std::size_t(r);
    }
    bytes_read_ += out.size();
    ++reads_;
  }
  [[nodiscard]] std::size_t size() const { return size_; }
  [[nodiscard]] std::size_t bytes_read() const { return bytes_read_; }
  [[nodiscard]] std::size_t reads() const { return reads_; }
  [[nodiscard]] const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
  detail::Fd fd_;
  std::size_t size_ = 0, bytes_read_ = 0, reads_ = 0;
};

/**
 * @brief Whether a directory can be created beside `path` (in its parent directory): creates one under a unique
 * name (`mkdtemp`) and removes it. The message says why not; empty when it can. A unique name keeps the probe
 * true when several processes (the ranks of one job) probe the same place at once.
 */
[[nodiscard]] inline std::string cannot_create_beside(const std::filesystem::path& path) {
  std::string pattern = path.string() + ".probe-XXXXXX";
  if (::mkdtemp(pattern.data()) == nullptr) return detail::errno_text();
  std::error_code ec;
  std::filesystem::remove(pattern, ec);
  return {};
}

/** @brief The whole content of a (small) file, e.g. a manifest; a missing file is an error naming it. */
[[nodiscard]] inline std::string read_small_file(const std::filesystem::path& path) {
  ReadFile f(path);
  std::string s(f.size(), '\0');
  f.read_at(0, std::as_writable_bytes(std::span<char>(s.data(), s.size())));
  return s;
}

}  // namespace mpar::io
